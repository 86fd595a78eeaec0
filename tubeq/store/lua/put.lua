--[[ put: store a new job in a tube, ready or delayed; a ready job goes straight to the first
connection waiting on the tube, as beanstalkd hands it over before it answers the put.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then tube, pri,
         delay (s), ttr (s), body, now (ms); put-with: then (option name, value) pairs
         (tubeq.model.options.PUT_OPTIONS; delay-ms replaces the delay; group puts the tube in
         group mode, includes/groups.lua)
         (put-with after= adds internal ones: 'after' this shard's parents, 'after-far' the
         other shards' living parents, 'after-failed', 'after-keep' ms, 'id' the job's id)
Returns  the new job id (counted in total-jobs, the server's and the tube's); {id, token}
         when it was handed straight to that connection, a push loop of the calling process
         (direct_taker in includes/handing.lua: the caller sends it on); put-with key=...: -id
         of the living job with that key (nothing stored: a duplicate); 0 when the tube is
         full (tube-set max-jobs: nothing stored, no id used); {'unknown', id} when a parent
         is unknown (nothing stored, no id used)
Events   'put' (reason 'after' for a job held or buried by after=; put-with traceparent= adds
         the field 'traceparent' to it, includes/events.lua add_event); on a hand-over also
         'reserved' (tries 1) for the waiting connection; 'deduplicated' (the existing job)
         instead for a duplicate.
Wakes    a hand-over to another process's connection, or to one not taking it at once, is
         recorded for the waiting connection (c:<token>:g) and its process is told on
         grant:<instance>; without one, reserves blocked on the tube are woken
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "waiter_counts"
--- @include "picking"
--- @include "handing"
--- @include "policies"
--- @include "after"
local t, pri, delay, ttr, body, now = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8])

-- put-with: its options (job policies, delay-ms, dedupe key; includes/policies.lua).
local delay_ms = tonumber(delay) * 1000
local opts = #ARGV > 8 and put_options(9)
-- put-with traceparent=: its 'put' event carries it (includes/events.lua add_event)
local traced = opts and opts.traceparent
if opts then
  if opts.key then
    local existing = duplicate_of(opts.key, now)
    if existing then return -existing end
  end
  delay_ms = tonumber(opts['delay-ms'] or delay_ms)
end

-- put-with after=: every parent checked before anything is stored (includes/after.lua).
local near, far, failed
if opts and (opts.after or opts['after-far'] or opts['after-failed']) then
  near, far, failed = check_parents(opts)
  if not near then return {'unknown', far} end
end

local limits = tube_limits(t)
if tube_full(t, limits[1]) then return 0 end
local meta = ensure_tube(t, now)
-- put-with group=: the tube serves its groups in turns from now on (includes/groups.lua); a
-- put without one into a tube in group mode that holds no job ends that mode. The group is a
-- field of the record's one write (group_field).
local group_field = {}
if opts and opts.group then
  group_field = {JOB_GROUP, opts.group}
  if not (meta and meta[4]) then
    enter_group_mode(t, now, meta and meta[3])
    meta = nil  -- read again where needed
  end
elseif meta and meta[4] and leave_group_mode(t) then
  meta = nil
end
local id, jk = new_job(opts and tonumber(opts.id))
count_stored(t, 1)
if near and (failed or near[1] or far[1]) then  -- held, or buried at once
  store_job(jk, t, pri, ttr, body, now, nil, nil, unpack(group_field))
  start_policies(id, jk, t, opts, now, limits[2])
  add_event('put', id, t, pri, delay_ms, ttr, 0, 0, now, 'after', nil, nil, nil, traced)
  if failed then
    fail_held(id, t, jk, now)
  else
    hold_job(id, jk, t, near, far, delay_ms, opts['after-keep'])
  end
  return id
end
if delay_ms > 0 then
  local due = now + delay_ms
  store_job(jk, t, pri, ttr, body, now, math.floor(delay_ms / 1000), due, unpack(group_field))
  start_policies(id, jk, t, opts, now, limits[2])
  enqueue_delayed(id, t, due)
  add_event('put', id, t, pri, delay_ms, ttr, due, 0, now, '', nil, nil, nil, traced)
else
  local line, first, others = first_line(t)  -- (nil: nobody waits on t)
  local taker = direct_taker(t, meta, line, first, others)
  -- put-with wait-ms (a request/reply): waited for from its birth, by this process, and
  -- traceparent: fields of the job's own HSET beside its group (start_policies would write
  -- each with one more)
  local extra = group_field
  if opts and opts.waited then
    extra, opts.waited = {JOB_WAITED, opts.waited, JOB_WAITED_BY, EVENTS_BY,
      unpack(group_field)}, nil
  end
  if opts and opts.traceparent then
    if extra == group_field then extra = {unpack(group_field)} end
    extra[#extra + 1], extra[#extra + 2] = JOB_TRACEPARENT, opts.traceparent
    opts.traceparent = nil
  end
  if taker then
    -- Handed straight to a push loop of this process: stored reserved, as the hand-over
    -- below leaves it, without the trip through the ready set; its process sends it on.
    store_handed_over(id, jk, t, pri, ttr, body, now, taker, opts, limits[2], traced,
      unpack(extra))
    return {id, taker}
  end
  store_job(jk, t, pri, ttr, body, now, nil, nil, unpack(extra))
  start_policies(id, jk, t, opts, now, limits[2])
  enqueue_ready(id, t, pri, now, meta, nil, nil, opts and opts.group or '')
  add_event('put', id, t, pri, 0, ttr, 0, 0, now, '', nil, nil, nil, traced)
  -- This job still ready (nobody could take a job, or the first waiter got a better one from
  -- another tube): the other waiters get a wake-up.
  if line and hand_over_in(t, now, line) ~= id then
    rcall('PUBLISH', k_wake(t), '')
  end
end
return id
