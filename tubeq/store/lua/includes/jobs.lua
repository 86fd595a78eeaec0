--- @include "limits"
--- @include "groups"

-- Shared pieces of every transition: job members, tube bookkeeping, the ready-tube index,
-- timers and wake-ups. A state change, its index update and its wake-up happen in one script.
local rcall = redis.call

-- Sorted-set member of a job id: its digit count as one letter, then the digits. Members of
-- equal score then sort by numeric id ('A7' < 'B12' < 'B13'), which gives beanstalkd's
-- (pri, id) order with score = pri, exact in a double.
local function member(id)
  local s = text(id)
  return string.char(64 + #s) .. s
end

local function id_of(m)
  return string.sub(m, 2)
end

-- Add delta to a counter field of a hash, removing the field when it reaches zero.
local function bump(hash, field, delta)
  if rcall('HINCRBY', hash, field, text(delta)) == 0 then
    rcall('HDEL', hash, field)
  end
end

-- The namespace's jobs by state, K_COUNTS: 'u' ready jobs of urgent priority (below 1024, as
-- beanstalkd's current-jobs-urgent), 'r' the other ready jobs, 'd' delayed, 'b' buried
-- (reserved jobs are K_RESERVED's ZCARD), 'h' held (put-with after=, includes/after.lua).
-- Every script that adds a job to, or takes one out of, a tube's ready, delayed, buried or
-- held set counts it here in the same call, by what the
-- ZADD or ZREM did, so stats, --max-jobs and the scrapes read the namespace in O(1) instead
-- of every tube (a stats over 20,000 tubes held Redis for 300 ms). 'v' marks counts that are
-- whole: recount.lua sets them from the sets where it is missing.
local URGENT_BELOW = 1024
local function count_ready(pri, delta)
  rcall('HINCRBY', K_COUNTS, tonumber(pri) < URGENT_BELOW and 'u' or 'r', delta)
end
local function count_in(field, delta)
  if delta ~= 0 then rcall('HINCRBY', K_COUNTS, field, delta) end
end

-- Whether a command `token` pipelined behind its own unanswered reserves (the first of them
-- numbered `lo` by the connection; nil: behind none) must wait for them: one of them found
-- nothing on its first try (reserve.lua records the last such reserve's number), so it waits
-- for a job, and beanstalkd runs what follows it only once it is answered. The command then
-- changes nothing and returns DEFERRED; the connection sends it again after that reserve.
-- The record only has to outlive the round trip of the reserve's try: a command is sent past a
-- reserve only until that try's reply is back, so a minute is ample, and the key of a
-- connection that vanished goes by itself.
local DEFERRED = -1
-- What touch, finish and fail answer for a job cancelled while its holder held it.
local CANCELLED = -2
local BLOCKED_TTL_MS = 60000
local function blocked_ahead(token, lo)
  if not lo or lo == '0' then return false end
  local b = rcall('GET', k_blocked(token))
  return b ~= false and tonumber(b) >= tonumber(lo)
end

-- A tube's meta fields that index_tube and the moves into and out of ready read: {ix,
-- pause_until, lim, grp} ('grp': the tube is in group mode, includes/groups.lua).
local function tube_meta(t)
  return rcall('HMGET', k_tube(t), 'ix', 'pause_until', 'lim', 'grp')
end

-- A tube exists from its first reference (use, watch, put) until gc_tube removes it. Returns
-- its meta fields (tube_meta's, then 'c') when the tube existed (a put passes them on: one read
-- for both), nil when it was created here.
local function ensure_tube(t, now)
  local tk = k_tube(t)
  local meta = rcall('HMGET', tk, 'ix', 'pause_until', 'lim', 'grp', 'c')
  -- Every tube has 'c' from its creation; a hash without it is looked at the long way.
  if meta[5] or rcall('EXISTS', tk) == 1 then return meta end
  -- 'cu': Redis's own clock (us), which orders the tubes of a split namespace's shards as
  -- they were created (tubeq.store.shards, list-tubes); the shards' K_TUBES orders do not compare.
  local clock = rcall('TIME')
  rcall('HSET', tk, 'c', now, 'cu', clock[1] * 1000000 + clock[2])
  rcall('ZADD', K_TUBES, rcall('HINCRBY', K_SEQS, 'tube', 1), t)
  sync_limit_flag(t)  -- reserve limits: its settings outlived it
end

-- total-jobs, the server's and the tube's: counted by the script that stored the `n` new jobs,
-- in the same call, so a put Redis refused or never ran counts nowhere and every process reads
-- the count as soon as the put is answered.
local function count_stored(t, n)
  rcall('HINCRBY', K_STATS, 'total-jobs', text(n))
  rcall('HINCRBY', k_tube(t), 'total', text(n))
end

-- ready_tubes holds one entry per non-paused tube that has ready jobs: score = the priority of
-- its best job, member = that job's member, ':', the tube. Equal scores sort by member, that is
-- by job id, so the index is in beanstalkd's (pri, id) order across tubes and the first entry a
-- connection watches is the job it reserves. The tube's current entry is kept in its meta
-- field 'ix', to be replaced when the head changes. (Job members never contain ':'.)
-- A caller that knows the new head (member, pri) passes it and saves the lookup; one that has
-- just read the tube's meta fields (tube_meta, ensure_tube) passes them too. A tube in group
-- mode's head is the best job of the group whose turn it is (includes/groups.lua).
-- Returns whether the tube has reserve limits (includes/limits.lua), read on the way.
local function index_tube(t, now, head_member, head_pri, meta)
  local tk = k_tube(t)
  meta = meta or tube_meta(t)
  local old = meta[1]
  local entry = false
  local head
  if head_member then
    head = {head_member, head_pri}
  elseif meta[4] then
    head = group_head(t)
  else
    head = rcall('ZRANGE', k_ready(t), '0', '0', 'WITHSCORES')
  end
  if head[1] and not (meta[2] and tonumber(meta[2]) > now)
      and not (meta[3] and limit_reached(t, now)) then
    entry = head[1] .. ':' .. t
  end
  local limited = meta[3] ~= false
  if old == entry then return limited end
  if old then rcall('ZREM', K_READY_TUBES, old) end
  if entry then
    rcall('ZADD', K_READY_TUBES, text(head[2]), entry)
    rcall('HSET', tk, 'ix', entry)
  else
    rcall('HDEL', tk, 'ix')
  end
  return limited
end

-- The tube and the job member of a ready_tubes entry.
local function split_entry(entry)
  return string.match(entry, '^([^:]*):(.*)$')
end

-- timers holds 'd:<tube>' scored by the tube's earliest delayed due time.
local function arm_delay_timer(t)
  local head = rcall('ZRANGE', k_delayed(t), '0', '0', 'WITHSCORES')
  if head[1] then
    rcall('ZADD', K_TIMERS, head[2], 'd:' .. t)
  else
    rcall('ZREM', K_TIMERS, 'd:' .. t)
  end
end

-- Wake-up hint for processes with reserves blocked on this tube; no PUBLISH when nobody waits.
-- (A tube has waiters while a line is entered in k_waiters: includes/waiter_counts.lua.) It
-- says how many jobs the tube has ready, so a process wakes that many of its waiters at most
-- (a kick, a pause's end, a sweep may make several ready at once; one wake-up served one).
-- A paused tube serves none: one. A tube with reserve limits serves what they let go at most
-- (limited_room: no herd for one freed slot, and no reserve left asleep when several may go).
local function wake(t)
  if rcall('EXISTS', k_waiters(t)) == 1 then
    local n = rcall('ZCARD', k_ready(t))
    if n > 1 then
      local meta = tube_meta(t)
      if meta[2] then
        n = 1
      elseif meta[3] then
        n = limited_room(t, n, meta[4])
      end
    end
    rcall('PUBLISH', k_wake(t), text(n))
  end
end

-- Put a job (whose hash the caller has updated) into its tube's ready set. The caller wakes.
-- `meta`: the tube's meta fields as ensure_tube returned them, if nothing changed them since.
-- `behind`: the caller knows the job is not the tube's new head (put_many.lua), and the
-- ZRANK that would tell is skipped. `grouped`: whether the tube is in group mode, when the
-- caller knows it and passes no meta (nil: read). `put_group`: a put's (put.lua, put_many.lua)
-- job's group ('' for none); a put's job is the newest of the tube, so in a group whose place
-- did not change it is not the new head and the head is not looked up (nil: any other move,
-- the group read from the job if the tube is in group mode).
local function enqueue_ready(id, t, pri, now, meta, behind, grouped, put_group)
  local m = member(id)
  if grouped == nil then
    if not meta then meta = tube_meta(t) end
    grouped = meta[4] ~= false
  end
  if rcall('ZADD', k_ready(t), text(pri), m) == 1 then count_ready(pri, 1) end
  if grouped then
    meta = meta or tube_meta(t)
    local moved = group_add(t, put_group or group_of(id), m, text(pri), now, meta[3])
    if moved or not put_group then index_tube(t, now, nil, nil, meta) end
    return
  end
  if not behind and rcall('ZRANK', k_ready(t), m) == 0 then  -- the entry names the head only
    index_tube(t, now, m, pri, meta)
  end
end

local function enqueue_delayed(id, t, due)
  due = text(due)
  count_in('d', rcall('ZADD', k_delayed(t), due, member(id)))
  rcall('ZADD', K_TIMERS, 'LT', due, 'd:' .. t)
end

-- Take the reserved jobs of `members` (member(id) each) out of K_RESERVED: one ZREM per
-- thousand (unpack has a limit of a few thousand values). delete_many.lua and finish.lua
-- gather a call's reserved jobs for it; their counts move per tube.
local function unreserve_all(members)
  for i = 1, #members, 1000 do
    rcall('ZREM', K_RESERVED, unpack(members, i, math.min(i + 999, #members)))
  end
end

-- Take a job out of the structure that holds it in its current state (and out of K_COUNTS).
local function unlink(id, t, state, now)
  local m = member(id)
  if state == 'ready' then
    local rk = k_ready(t)
    local pri = rcall('ZSCORE', rk, m)
    if pri then
      rcall('ZREM', rk, m)
      count_ready(pri, -1)
    end
    local meta = tube_meta(t)
    if meta[4] and pri then group_remove(t, group_of(id), m, now, meta[3]) end
    index_tube(t, now, nil, nil, meta)
  elseif state == 'delayed' then
    count_in('d', -rcall('ZREM', k_delayed(t), m))
    arm_delay_timer(t)
  elseif state == 'buried' then
    count_in('b', -rcall('ZREM', k_buried(t), m))
  elseif state == 'held' then  -- waiting for its parents (includes/after.lua)
    local n = rcall('ZREM', k_held(t), m)
    count_in('h', -n)
    if n == 1 then rcall('HINCRBY', k_tube(t), 'nheld', -1) end
    rcall('DEL', k_after(id))
  elseif state == 'reserved' then
    rcall('ZREM', K_RESERVED, m)
    -- A 0 stays (no HDEL): a busy tube's count goes 0 -> 1 -> 0 with every job.
    rcall('HINCRBY', k_tube(t), 'nres', '-1')
    local limited = rcall('HMGET', k_tube(t), 'lim', 'grp')
    if limited[1] then  -- reserve limits: maybe below its cap now
      uncount_group_reserve(t, k_job(id), now)
      index_tube(t, now)
      wake(t)
    elseif limited[2] then  -- counted while the tube had limits, since removed: count it out
      uncount_group_reserve(t, k_job(id), now)
    end
  end
end

-- How long (ms) a job that is being reserved at `reserved_at` had been ready: since 'a' (set by
-- every move into ready but a put's), else since its creation 'c' (a put without delay).
local function waited_ms(reserved_at, ready_since, created)
  return reserved_at - (ready_since or created)
end

-- Reserve a job (already unlinked; from ready: taken out of the tube's ready set, but still counted
-- there, as grant counts it out with the priority it reads) for the connection `token`. Returns the
-- five-element reservation {id, ttr, body, waited (ms, see waited_ms; -1 when the job was not taken
-- from ready: reserve-job of a delayed or buried job), tube}: tubeq.store.store reads waited and
-- tube for the ready->reserved metrics, no extra round trip. Stores 'ra' (reserved at) for delete's
-- held time. Writes the 'reserved' event. `limited`: whether the tube has reserve limits, when the
-- caller knows it (index_tube's answer); nil looks it up. `run`: a table a caller granting several
-- jobs of one tube at once passes (take_run): the job's (deadline, member) pair is added to it
-- instead of to K_RESERVED, its ready count to run.u or run.r (urgent or not) instead of
-- K_COUNTS, and the tube's 'nres' is left to the caller, who writes them all once for the run.
local function grant(id, t, token, now, from_ready, limited, run)
  local jk = k_job(id)
  local f = rcall('HMGET', jk, JOB_TTR, JOB_BODY, JOB_PRI, JOB_READY_SINCE, JOB_CREATED,
    JOB_RESERVES, JOB_GROUP)
  local ttr = f[1] + 0  -- (the digits read once: tonumber() reads them twice)
  if from_ready then
    if run then
      local field = tonumber(f[3]) < URGENT_BELOW and 'u' or 'r'
      run[field] = run[field] + 1
    else
      count_ready(f[3], -1)
    end
  end
  local due = text(now + ttr * 1000)
  local tries = text((f[6] or 0) + 1)
  rcall('HSET', jk, JOB_STATE, 'reserved', JOB_OWNER, token, JOB_DUE, due, JOB_RESERVED_AT,
    text(now), JOB_RESERVES, tries)
  if run then
    run[#run + 1] = due
    run[#run + 1] = member(id)
  else
    rcall('ZADD', K_RESERVED, due, member(id))
    rcall('HINCRBY', k_tube(t), 'nres', '1')
  end
  if limited == nil then limited = rcall('HEXISTS', k_tube(t), 'lim') == 1 end
  if limited then  -- reserve limits: count it, maybe hold
    count_limited_reserve(t, now)
    if rcall('HEXISTS', k_tube(t), 'grp') == 1 then count_group_reserve(t, f[7] or '', jk, now) end
    index_tube(t, now)
  end
  add_event('reserved', id, t, f[3], 0, f[1], 0, tries, now, '')
  local waited = from_ready and waited_ms(now, f[4], f[5]) or -1
  return {id + 0, ttr, f[2], waited, t}
end

-- Back to ready without touching its counters (TTR expiry and disconnect differ only there).
-- Writes the 'timed-out' event with `reason`: '' (TTR ran out), 'disconnect' or 'reaped'.
local function requeue(id, t, now, reason)
  local jk = k_job(id)
  unlink(id, t, 'reserved', now)
  rcall('HSET', jk, JOB_STATE, 'ready', JOB_READY_SINCE, now)
  rcall('HDEL', jk, JOB_OWNER, JOB_DUE)
  local f = rcall('HMGET', jk, JOB_PRI, JOB_TTR, JOB_RESERVES)
  enqueue_ready(id, t, tonumber(f[1]), now)
  add_event('timed-out', id, t, f[1], 0, f[2], 0, f[3], now, reason)
end

-- pause_until of a tube paused with no end (tube-pause): a time never reached (year 33658), so
-- index_tube keeps the tube out of ready_tubes (admin verbs: tube_pause.lua).
local PAUSE_FOREVER = 1e15

-- A tube disappears once nothing references it: no job in any state, nobody using or
-- watching it (across all processes). 'default' never disappears. Its counters and pause go
-- with it, as in beanstalkd; a tube paused with no end stays (tube_pause.lua).
local function gc_tube(t)
  if t == 'default' then return end
  local refs = rcall('HMGET', K_REFS, 'u:' .. t, 'w:' .. t)
  if tonumber(refs[1] or 0) > 0 or tonumber(refs[2] or 0) > 0 then return end
  if rcall('EXISTS', k_ready(t), k_delayed(t), k_buried(t), k_held(t)) > 0 then return end
  local meta = rcall('HMGET', k_tube(t), 'nres', 'ix', 'pause_until', 'grp')
  if tonumber(meta[1] or 0) > 0 then return end
  -- A tube paused with no end stays until tube-resume (admin verbs, protocol.md).
  if tonumber(meta[3] or 0) >= PAUSE_FOREVER then return end
  if meta[2] then rcall('ZREM', K_READY_TUBES, meta[2]) end
  rcall('DEL', k_tube(t), k_waiters(t))
  if meta[4] then leave_group_mode(t) end
  rcall('ZREM', K_TUBES, t)
  rcall('ZREM', K_TIMERS, 'd:' .. t, 'p:' .. t)
  rcall('HDEL', K_REFS, 'u:' .. t, 'w:' .. t, 'q:' .. t)
end
