--[[ put_many: store several new jobs in one tube, in order, each as put.lua would (ready or
delayed; a ready job goes straight to the first connection waiting on the tube). One call per
put-many batch; the entries the parser refused never reach it.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then tube, now
         (ms), then per job: pri, delay (s), ttr (s), body; or 'g' and then per job: pri,
         delay (s), ttr (s), group ('' for none: includes/groups.lua), body; or 't' and then
         per job: pri, delay (s), ttr (s), group, traceparent ('' for none), body; or 'w'
         (calls: a connection's put-with notify-ms, tubeq.server.runs), the ms their ends are
         kept, n, n pairs (token, jobs it may be given) and then per job: pri, delay (s), ttr
         (s), body
Returns  {id, id, ...}: the new job ids, in the order given (counted in total-jobs, as for
         put); 0 for a job refused because the tube is full (tube-set max-jobs). The tube's
         ttl-ms applies to each job, as for put. 'w': each job is waited for by this process
         from its birth (put.lua's put-with wait-ms or notify-ms), and a ready one goes to a
         push loop of this process as put.lua hands it over directly (direct_taker), {id,
         token} in its place, while that token's jobs given stay under the number paired
         with it (the free credits its process promised the call); past it, to anyone else
         as a put hands it over, but never to that loop: while it is first in line the job
         stays ready and the tube's waiters are woken, so its process, which knows its
         credits, takes it or counts the loop out.
Events   'put' per job (with the field 'traceparent' for a job that has one, as put.lua's);
         per hand-over also 'reserved' (tries 1) for the waiting connection.
Wakes    a hand-over is recorded for the waiting connection (c:<token>:g) and its process is
         told on grant:<instance>; if a ready job of the batch is left while connections
         still wait on the tube, reserves blocked on it are woken once
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "waiter_counts"
--- @include "picking"
--- @include "handing"
--- @include "policies"
local t, now = ARGV[3], tonumber(ARGV[4])

local meta = ensure_tube(t, now)
local first, step = 5, 4
if ARGV[5] == 'g' then first, step = 6, 5 end  -- each job with its group
if ARGV[5] == 't' then first, step = 6, 6 end  -- each job with its group and traceparent
-- 'w': calls, waited for by this process for `waited` ms; `budget`: token -> jobs it may
-- still be given directly; `direct`: whether a direct hand-over may still be made (none once
-- a job of the batch went into ready: the tube then has a ready job, see direct_taker)
local waited, budget, direct = nil, nil, false
local run  -- the batch's direct hand-overs (direct_run in includes/handing.lua), once begun
if ARGV[5] == 'w' then
  waited, budget, direct = ARGV[6], {}, true
  local n = tonumber(ARGV[7])
  for i = 8, 7 + 2 * n, 2 do budget[ARGV[i]] = tonumber(ARGV[i + 1]) end
  first, step = 8 + 2 * n, 4
end
-- In group mode (includes/groups.lua) unless it holds no job and the batch has no groups.
local grouped = meta and meta[4] and true or false
if grouped and step == 4 and leave_group_mode(t) then grouped = false end
local limits = tube_limits(t)
local ids = {}
local stored = 0
local left_ready = false  -- a ready job of the batch nobody could take at once
-- Whether connections wait on the tube: read again after each hand-over, which counts one out;
-- none at the start stays none (only another script counts a connection in).
local waiters = has_waiters(t)
-- The lowest priority a ready job of the batch went in with, or nil. The tube's head sorts at
-- or before it, and a new job has the largest id yet (ids only grow), so a later job of the
-- batch whose priority is not lower cannot be the new head: its ZRANK is skipped. A
-- hand-over may take the head away: then it is not known.
local head_at_most
-- One job of the batch, as put.lua stores it (`group`, `tp`: '' for none); returns its id.
local function put_one(pri, delay, ttr, body, group, tp)
  if group ~= '' and not grouped then
    enter_group_mode(t, now, rcall('HEXISTS', k_tube(t), 'lim') == 1)
    grouped = true
  end
  local id, jk = new_job()
  delay = delay + 0
  if delay > 0 then
    local due = now + delay * 1000
    if waited then
      store_job(jk, t, pri, ttr, body, now, delay, due, JOB_WAITED, waited, JOB_WAITED_BY,
        EVENTS_BY)
    elseif tp ~= '' and group == '' then
      store_job(jk, t, pri, ttr, body, now, delay, due, JOB_TRACEPARENT, tp)
    elseif tp ~= '' then
      store_job(jk, t, pri, ttr, body, now, delay, due, JOB_GROUP, group, JOB_TRACEPARENT, tp)
    elseif group == '' then
      store_job(jk, t, pri, ttr, body, now, delay, due)
    else
      store_job(jk, t, pri, ttr, body, now, delay, due, JOB_GROUP, group)
    end
    start_policies(id, jk, t, false, now, limits[2])
    enqueue_delayed(id, t, due)
    add_event('put', id, t, pri, delay * 1000, ttr, due, 0, now, '', nil, nil, nil,
      tp ~= '' and tp or nil)
  else
    if direct then
      -- The batch's run while it lasts; once it stopped (another line may come first), each
      -- job looks at the waiters itself, as put.lua's direct_taker does.
      if run == nil then run = direct_run(t, meta) or false end
      local taker
      if run and not run.done then
        taker = direct_next(run, budget)
        if not taker or run.done then direct_flush(run) end
      end
      if not taker and not (run and not run.done) then
        local line, head, others = first_line(t)
        taker = direct_taker(t, meta, line, head, others, budget)
      end
      if taker then
        -- stored reserved by it, as put.lua's direct hand-over; its process sends it on
        budget[taker] = budget[taker] - 1
        store_handed_over(id, jk, t, pri, ttr, body, now, taker, false, limits[2], nil,
          JOB_WAITED, waited, JOB_WAITED_BY, EVENTS_BY)
        return {id, taker}
      end
    end
    if waited then
      store_job(jk, t, pri, ttr, body, now, nil, nil, JOB_WAITED, waited, JOB_WAITED_BY,
        EVENTS_BY)
    elseif tp ~= '' and group == '' then
      store_job(jk, t, pri, ttr, body, now, nil, nil, JOB_TRACEPARENT, tp)
    elseif tp ~= '' then
      store_job(jk, t, pri, ttr, body, now, nil, nil, JOB_GROUP, group, JOB_TRACEPARENT, tp)
    elseif group == '' then
      store_job(jk, t, pri, ttr, body, now)
    else
      store_job(jk, t, pri, ttr, body, now, nil, nil, JOB_GROUP, group)
    end
    start_policies(id, jk, t, false, now, limits[2])
    local p = pri + 0
    enqueue_ready(id, t, pri, now, nil, head_at_most ~= nil and p >= head_at_most, grouped,
      group)
    if head_at_most == nil or p < head_at_most then head_at_most = p end
    add_event('put', id, t, pri, 0, ttr, 0, 0, now, '', nil, nil, nil, tp ~= '' and tp or nil)
    if waiters then
      head_at_most = nil
      local line, head = first_line(t)
      if budget and head and budget[head[1]] == 0 then
        left_ready = true  -- a loop given its credits' worth: its process takes it, or not
      elseif hand_over_in(t, now, line) ~= id then
        left_ready = true
      elseif direct then
        meta = tube_meta(t)  -- handed over: the tube may have no ready job again
      end
      waiters = has_waiters(t)
    end
    if left_ready then direct = false end
  end
  return id
end

for i = first, #ARGV, step do
  if tube_full(t, limits[1]) then
    ids[#ids + 1] = 0
  else
    if step == 4 then
      ids[#ids + 1] = put_one(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], '', '')
    elseif step == 5 then
      ids[#ids + 1] = put_one(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 4], ARGV[i + 3], '')
    else
      ids[#ids + 1] = put_one(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 5], ARGV[i + 3],
        ARGV[i + 4])
    end
    stored = stored + 1
  end
end
if run and not run.done then direct_flush(run) end  -- (the batch ended with the run)
if stored > 0 then count_stored(t, stored) end
if left_ready and waiters then wake(t) end  -- with how many are ready (jobs.lua)
return ids
