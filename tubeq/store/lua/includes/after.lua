-- Dependencies: a job put with `after=<id>,...` is held until every parent finished (protocol.md
-- "Dependencies"). Include after "policies".
-- A held job (JOB_STATE 'held') sits in its tube's k_held set; k_after(id) holds the parents
-- it still waits for. Each living parent knows its children (k_children) and is marked waited
-- for the result lifetime, so the script that ends it (includes/ends.lua end_job) leaves
-- '<child> <parent> <done>' in its shard's K_PARENT_ENDS. Every process drains that set
-- (tubeq.server.parents) into after_end.lua on the child's shard, which takes the parent out of
-- k_after(child) (an SREM: telling a child twice changes nothing) and moves the child once.

-- What a parent is, for a child about to be put after it: living (its end is still to come),
-- ended done (finished, or deleted by its holder: END_DONE), ended otherwise (buried now
-- counts: a buried job is an end for waits too), or unknown (never seen, or it ended without
-- a kept end: tubeq keeps nothing of a job nobody waited for).
local PARENT_UNKNOWN, PARENT_LIVING, PARENT_DONE, PARENT_FAILED = 0, 1, 2, 3
local function parent_state(p)
  local s = rcall('HGET', k_job(p), JOB_STATE)
  if s then return s == 'buried' and PARENT_FAILED or PARENT_LIVING end
  local e = rcall('HMGET', k_end(p), END_HOW, END_DONE)
  if not e[1] then return PARENT_UNKNOWN end
  return e[2] and PARENT_DONE or PARENT_FAILED
end

-- Living parent `p` gets child `child` (an id of any shard): its end goes to the child, and is
-- kept `keep` ms for the child to read (wait).
local function add_child(p, child, keep)
  local jk = k_job(p)
  rcall('SADD', k_children(p), child)
  local waited = rcall('HGET', jk, JOB_WAITED)
  if not waited or tonumber(waited) < tonumber(keep) then rcall('HSET', jk, JOB_WAITED, keep) end
end

-- How long an end that came before its child is kept for it (after_end.lua): a put of a split
-- namespace stalled that long between telling the parents and storing the child loses it.
local EARLY_END_KEEP_MS = 86400000

-- A put's parents (put-with options `opts`): 'after' (this shard's, to check here) and
-- 'after-far' (other shards' living parents, registered already by tubeq.store.shards), and
-- 'after-failed' ('1': one of those had ended otherwise). A far parent that has ended since
-- left its end here for the child (k_early_ends of its given 'id'). Returns the parents here
-- still living, the other shards' ones still to end, and whether one failed; or nil and the
-- first unknown parent.
local function check_parents(opts)
  local near, far, failed = {}, {}, opts['after-failed'] == '1'
  for p in string.gmatch(opts.after or '', '%d+') do
    local s = parent_state(p)
    if s == PARENT_UNKNOWN then return nil, p end
    if s == PARENT_LIVING then
      near[#near + 1] = p
    elseif s == PARENT_FAILED then
      failed = true
    end
  end
  local ended = {}
  if opts.id then
    local ek = k_early_ends(opts.id)
    for _, e in ipairs(rcall('SMEMBERS', ek)) do
      local p, done = string.match(e, '^(%d+) (%d)$')
      ended[p] = true
      if done ~= '1' then failed = true end
    end
    rcall('DEL', ek)
  end
  for p in string.gmatch(opts['after-far'] or '', '%d+') do
    if not ended[p] then far[#far + 1] = p end
  end
  return near, far, failed
end

-- A new job `id` (record written by store_job as ready) waits for `near` (parents here, told of
-- it now) and `far` (told already): held, with `delay_ms` to take when the last one finished.
local function hold_job(id, jk, t, near, far, delay_ms, keep)
  local ak = k_after(id)
  for _, p in ipairs(near) do
    add_child(p, id, keep)
    rcall('SADD', ak, p)
  end
  for _, p in ipairs(far) do rcall('SADD', ak, p) end
  rcall('HSET', jk, JOB_STATE, 'held')
  if delay_ms > 0 then
    rcall('HSET', jk, JOB_AFTER_DELAY, delay_ms, JOB_DELAY, math.floor(delay_ms / 1000))
  end
  if rcall('ZADD', k_held(t), id, member(id)) == 1 then
    count_in('h', 1)
    rcall('HINCRBY', k_tube(t), 'nheld', 1)  -- stats-tube's current-jobs-held
  end
end

-- Held job `id`'s last parent finished: ready, or delayed by its own delay from now. Event
-- 'promoted' with reason 'after'. Returns the due instant (ms) when delayed, else 0.
local function release_held(id, t, jk, now)
  unlink(id, t, 'held', now)
  local f = rcall('HMGET', jk, JOB_PRI, JOB_AFTER_DELAY)
  rcall('HDEL', jk, JOB_AFTER_DELAY)
  local delay_ms = tonumber(f[2] or 0)
  local due = 0
  if delay_ms > 0 then
    due = now + delay_ms
    rcall('HSET', jk, JOB_STATE, 'delayed', JOB_DUE, due)
    enqueue_delayed(id, t, due)
  else
    rcall('HSET', jk, JOB_STATE, 'ready', JOB_READY_SINCE, now)
    enqueue_ready(id, t, f[1], now)
    wake(t)
  end
  job_event('promoted', id, now, delay_ms, due, 'after')
  return due
end

-- Held (or new) job `id` has a parent that ended without finishing: buried with reason
-- 'parent-failed' (its own waiters and children hear it: bury_for ends it). `state`: 'held',
-- or nil for a job just stored as ready and never enqueued.
local function fail_held(id, t, jk, now, state)
  if state then unlink(id, t, state, now) end
  rcall('HDEL', jk, JOB_AFTER_DELAY)
  bury_for(id, t, jk, now, 'parent-failed', 'npf')
end
