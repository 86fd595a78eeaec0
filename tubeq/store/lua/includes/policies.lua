--- @include "ends"

-- Job policies (max-tries, retry backoff, TTL) and deduplicated put: the Lua side of
-- protocol.md "put-with". Include after "keys", "events" and "jobs".
-- A job's own policy (put-with) wins over its tube's setting (tube-set, k_settings). max-tries,
-- backoff-ms, backoff-max-ms and on-expire are read from the tube when the check runs (a
-- tube-set applies at once to the jobs already in the tube); ttl-ms is read at put time (the
-- expiry instant is fixed then: it is what the TTL sweep is scheduled by).
-- The job's own policies and its policy state are fields of the job record (the put-with group
-- of includes/job_record.lua: JOB_MAX_TRIES ... JOB_BURIED_FOR).
-- Tube hash counters (they go with the tube, as beanstalkd's do): 'nexp' expired, 'ndl'
-- dead-lettered (max-tries), 'ndd' duplicate puts refused; and, by finish.lua and fail.lua,
-- 'nfin' finished, 'nfail' failures reported.

-- The longest delay (tubeq.model.options.MAX_MS): the cap of a backoff without backoff-max-ms.
local MAX_DELAY_MS = 4294967295000

-- put-with's option names -> the job hash fields that keep them.
local JOB_POLICY_FIELDS = {['max-tries'] = JOB_MAX_TRIES, ['backoff-ms'] = JOB_BACKOFF,
  ['backoff-max-ms'] = JOB_BACKOFF_MAX, ['on-expire'] = JOB_ON_EXPIRE, key = JOB_DEDUPE_KEY,
  ['result-ttl-ms'] = JOB_RESULT_TTL, traceparent = JOB_TRACEPARENT}

-- A deterministic fraction in [0, 1) from a job id and a try number: the backoff's jitter.
-- tubeq.model.policies.jitter computes the same, so a test knows the schedule. (Redis gives a script
-- no randomness worth having; the id spreads jobs that time out together.) Every product stays
-- below 2^53, so the arithmetic is exact in a double.
local JITTER_P = 2147483647
local function jitter(id, tries)
  local h = ((tonumber(id) % JITTER_P) * 48271 + tries * 69621 + 12345) % JITTER_P
  h = (h * 48271) % JITTER_P
  h = (h * 48271) % JITTER_P
  return h / JITTER_P
end

-- The retry delay after the `tries`-th try: backoff-ms * 2^(tries-1), capped at backoff-max-ms
-- (if set), less a jitter of up to half of it.
local function backoff_delay(id, tries, backoff, backoff_max)
  local cap = backoff_max > 0 and backoff_max or MAX_DELAY_MS
  local base = backoff * 2 ^ math.min(tries - 1, 52)
  if base > cap then base = cap end
  return base - math.floor(base * jitter(id, tries) / 2)
end

-- The options of a put-with: ARGV pairs from `from` on, by name.
local function put_options(from)
  local opts = {}
  for i = from, #ARGV, 2 do opts[ARGV[i]] = ARGV[i + 1] end
  return opts
end

-- The job's expiry (0: none) and its policies: its own, else its tube's, else `worker`'s (a
-- fail's options: {['max-tries'] = ..., ...}, or nil), else the defaults.
local function policies_of(jk, t, worker)
  local f = rcall('HMGET', jk, JOB_EXPIRES_AT, JOB_MAX_TRIES, JOB_BACKOFF, JOB_BACKOFF_MAX,
    JOB_ON_EXPIRE)
  if not (f[2] and f[3] and f[4] and f[5]) then
    local s = rcall('HMGET', k_settings(t), 'max-tries', 'backoff-ms', 'backoff-max-ms', 'on-expire')
    for i = 2, 5 do f[i] = f[i] or s[i - 1] end
  end
  if worker then
    f[2] = f[2] or worker['max-tries']
    f[3] = f[3] or worker['backoff-ms']
    f[4] = f[4] or worker['backoff-max-ms']
  end
  return tonumber(f[1] or 0), tonumber(f[2] or 0), tonumber(f[3] or 0), tonumber(f[4] or 0),
    f[5] or 'bury'
end

-- timers holds 'x:' scored by the earliest expiry of any job.
local function arm_ttl_timer()
  local head = rcall('ZRANGE', K_TTL, 0, 0, 'WITHSCORES')
  if head[1] then
    rcall('ZADD', K_TIMERS, head[2], 'x:')
  else
    rcall('ZREM', K_TIMERS, 'x:')
  end
end

-- A new job's own policies (put-with `opts`, or false for a put) and its expiry: its own
-- ttl-ms, else its tube's (`tube_ttl`, as the caller read it with tube_limits).
local function start_policies(id, jk, t, opts, now, tube_ttl)
  local ttl
  if opts then
    for name, field in pairs(JOB_POLICY_FIELDS) do
      if opts[name] then rcall('HSET', jk, field, opts[name]) end
    end
    if opts.key then rcall('HSET', K_DEDUPE, opts.key, id) end
    -- put-with wait-ms: waited for from its birth (ms to keep its end; includes/ends.lua)
    if opts.waited then rcall('HSET', jk, JOB_WAITED, opts.waited) end
    ttl = opts['ttl-ms']
  end
  ttl = tonumber(ttl or tube_ttl or 0)
  if ttl > 0 then
    local x = now + ttl
    rcall('HSET', jk, JOB_EXPIRES_AT, x)
    rcall('ZADD', K_TTL, x, member(id))
    rcall('ZADD', K_TIMERS, 'LT', x, 'x:')
  end
end

-- A new job handed straight to push loop `taker` of this process in its put's own script
-- (put.lua, and put_many.lua's calls: direct_taker in includes/handing.lua): stored reserved
-- by it, as a hand-over leaves a job, without the trip through the ready set, with its policies
-- (`opts`, `tube_ttl`: as start_policies) and its 'put' (with `traced`) and 'reserved' events;
-- `...`: more fields of the record's one write. Its process sends it on.
local function store_handed_over(id, jk, t, pri, ttr, body, now, taker, opts, tube_ttl, traced,
                                 ...)
  local due = text(now + ttr * 1000)
  rcall('HSET', jk, JOB_TUBE, t, JOB_STATE, 'reserved', JOB_PRI, text(pri), JOB_TTR,
    text(ttr), JOB_CREATED, text(now), JOB_BODY, body, JOB_OWNER, taker, JOB_DUE, due,
    JOB_RESERVED_AT, text(now), JOB_RESERVES, text(1), ...)
  start_policies(id, jk, t, opts, now, tube_ttl)
  rcall('ZADD', K_RESERVED, due, member(id))
  rcall('HINCRBY', k_tube(t), 'nres', '1')  -- (at once: a batch's tube_full counts it)
  add_event('put', id, t, pri, 0, ttr, 0, 0, now, '', nil, nil, nil, traced)
  add_event('reserved', id, t, pri, 0, ttr, 0, 1, now, '')
end

-- What a put into tube t reads of its settings, in one call: {max-jobs, ttl-ms} (nil: unset).
local function tube_limits(t)
  return rcall('HMGET', k_settings(t), 'max-jobs', 'ttl-ms')
end

-- tube-set max-jobs: whether tube t holds `cap` jobs or more, in every state (nil: no cap).
local function tube_full(t, cap)
  cap = tonumber(cap or 0)
  if cap <= 0 then return false end
  local held = rcall('ZCARD', k_ready(t)) + rcall('ZCARD', k_delayed(t))
    + rcall('ZCARD', k_buried(t)) + rcall('ZCARD', k_held(t))
    + tonumber(rcall('HGET', k_tube(t), 'nres') or 0)
  return held >= cap
end

-- The living job put with dedupe `key`, or false. A duplicate is counted on that job's tube
-- and writes 'deduplicated' (with the existing job's id and tube).
local function duplicate_of(key, now)
  local id = rcall('HGET', K_DEDUPE, key)
  if not id then return false end
  local t = rcall('HGET', k_job(id), JOB_TUBE)
  if not t then  -- not reachable (a key goes with its job); never let a stale key refuse puts
    rcall('HDEL', K_DEDUPE, key)
    return false
  end
  rcall('HINCRBY', k_tube(t), 'ndd', 1)
  job_event('deduplicated', id, now, 0, 0, '')
  return tonumber(id)
end

-- A job is going away for good: its dedupe key is free again and its TTL entry goes. `known`:
-- its fields {'k', 'x'} when the caller has read them.
local function forget_job(id, jk, known)
  local f = known or rcall('HMGET', jk, JOB_DEDUPE_KEY, JOB_EXPIRES_AT)
  if f[1] and rcall('HGET', K_DEDUPE, f[1]) == tostring(id) then
    rcall('HDEL', K_DEDUPE, f[1])
  end
  if f[2] then rcall('ZREM', K_TTL, member(id)) end
end

-- Bury a job (already unlinked) because of a policy: `reason` 'max-tries' or 'expired', counted
-- in the tube's `counter`. Writes 'buried' with the reason.
local function bury_for(id, t, jk, now, reason, counter)
  local w = rcall('HMGET', jk, JOB_WAITED, JOB_ERROR)
  if w[1] then end_job(id, t, 'buried', buried_data(reason, w[2]), now, nil, w[1]) end
  count_in('b', rcall('ZADD', k_buried(t), rcall('HINCRBY', K_SEQS, 'bury', 1), member(id)))
  rcall('HSET', jk, JOB_STATE, 'buried', JOB_BURIED_FOR, reason)
  rcall('HDEL', jk, JOB_OWNER, JOB_DUE)
  rcall('HINCRBY', jk, JOB_BURIES, 1)
  rcall('HINCRBY', k_tube(t), counter, 1)
  job_event('buried', id, now, 0, 0, reason)
end

-- A job in `state` is past its TTL: buried with reason 'expired' or deleted (event 'expired'),
-- as `on_expire` says. A buried job stays buried unless it is to be deleted.
local function expire_job(id, t, jk, state, now, on_expire)
  rcall('ZREM', K_TTL, member(id))
  if state == 'buried' and on_expire ~= 'delete' then
    rcall('HDEL', jk, JOB_EXPIRES_AT)
    return
  end
  unlink(id, t, state, now)
  if on_expire == 'delete' then
    local waited = rcall('HGET', jk, JOB_WAITED)
    if waited then end_job(id, t, 'expired', '', now, nil, waited) end
    job_event('expired', id, now, 0, 0, '')
    forget_job(id, jk)
    rcall('DEL', jk)
    rcall('HINCRBY', k_tube(t), 'nexp', 1)
    gc_tube(t)
  else
    rcall('HDEL', jk, JOB_EXPIRES_AT)
    bury_for(id, t, jk, now, 'expired', 'nexp')
  end
end

-- A cancelled job goes (cancel.lua; or, reserved when cancelled, at its holder's next touch,
-- finish, fail, release or bury, or its TTR): deleted as delete.lua deletes a job (event
-- 'deleted' with reason 'cancelled'), its end 'cancelled' kept and published when a wait
-- marked it. It never runs again.
local function drop_cancelled(id, t, jk, state, now)
  local f = rcall('HMGET', jk, JOB_WAITED, JOB_PRI, JOB_TTR, JOB_RESERVES)
  end_job(id, t, 'cancelled', '', now, nil, f[1])
  unlink(id, t, state, now)
  forget_job(id, jk)
  rcall('DEL', jk)
  rcall('HINCRBY', k_tube(t), 'del', '1')
  add_event('deleted', id, t, f[2], 0, f[3], 0, f[4], now, 'cancelled')
  gc_tube(t)
end

-- A job a put handed to a connection that never claimed it (disconnect.lua, reap.lua) goes
-- back to ready (requeue, event 'timed-out' with `reason`), unless it was cancelled meanwhile:
-- then it goes (drop_cancelled). Whether it went back to ready.
local function give_back_handed(id, t, now, reason)
  local jk = k_job(id)
  if rcall('HEXISTS', jk, JOB_CANCELLED) == 1 then
    drop_cancelled(id, t, jk, 'reserved', now)
    return false
  end
  requeue(id, t, now, reason)
  return true
end

-- A holder's sign of life (touch.lua, progress.lua) for reserved job `id` (tube t, TTR `ttr` s,
-- `cancelled` its JOB_CANCELLED): a full TTR from now, its new deadline returned; or, if it was
-- cancelled while held, it goes (drop_cancelled) and CANCELLED is returned.
local function renew_hold(id, t, jk, ttr, cancelled, now)
  if cancelled then
    drop_cancelled(id, t, jk, 'reserved', now)
    return CANCELLED
  end
  local due = now + tonumber(ttr) * 1000
  rcall('HSET', jk, JOB_DUE, due)
  rcall('ZADD', K_RESERVED, due, member(id))
  return due
end

-- A reservation of job `id` (tube t) ended: `how` is 'timeout' (TTR or disconnect: a backoff
-- applies) or 'release' (the client chose the delay). A job cancelled meanwhile goes
-- (drop_cancelled). Else counts the try, then the policies: past
-- its TTL the job expires, at max-tries it is buried with reason 'max-tries'. Returns true when
-- a policy took the job (its events written, it is no longer reserved), else false and the
-- backoff delay (ms, 0 for none): the caller puts the job back as usual.
local function end_try(id, t, jk, now, how, worker)
  if rcall('HEXISTS', jk, JOB_CANCELLED) == 1 then  -- cancelled while reserved: gone
    drop_cancelled(id, t, jk, 'reserved', now)
    return true
  end
  local tries = rcall('HINCRBY', jk, JOB_TRIES, 1)
  local x, max_tries, backoff, backoff_max, on_expire = policies_of(jk, t, worker)
  if x > 0 and x <= now then
    expire_job(id, t, jk, 'reserved', now, on_expire)
    return true
  end
  if max_tries > 0 and tries >= max_tries then
    unlink(id, t, 'reserved', now)
    bury_for(id, t, jk, now, 'max-tries', 'ndl')
    return true
  end
  if how == 'timeout' and backoff > 0 then
    return false, backoff_delay(id, tries, backoff, backoff_max)
  end
  return false, 0
end

-- A reservation of job `id` (tube t) that ends without a try (hand_back.lua; disconnect.lua
-- when the job's process closed the connection as it stopped): past its TTL the job expires
-- (expire_job, its events written) and true is returned; else false, and the caller requeues.
local function expire_if_past_ttl(id, t, jk, now)
  local x, _, _, _, on_expire = policies_of(jk, t)
  if x > 0 and x <= now then
    expire_job(id, t, jk, 'reserved', now, on_expire)
    return true
  end
  return false
end

-- A reservation ended by TTR (reason '') or by its connection going away ('disconnect'): the
-- policies, then back to ready, or delayed by the backoff (event 'timed-out' with delay_ms and
-- due_ms). Returns 'ready', the due instant (ms) when delayed, or false when a policy took it.
local function retry(id, t, now, reason)
  local jk = k_job(id)
  local taken, delay_ms = end_try(id, t, jk, now, 'timeout')
  if taken then return false end
  if delay_ms == 0 then
    requeue(id, t, now, reason)
    return 'ready'
  end
  unlink(id, t, 'reserved', now)
  local due = now + delay_ms
  rcall('HSET', jk, JOB_STATE, 'delayed', JOB_DUE, due)
  rcall('HDEL', jk, JOB_OWNER)
  enqueue_delayed(id, t, due)
  local f = rcall('HMGET', jk, JOB_PRI, JOB_TTR, JOB_RESERVES)
  add_event('timed-out', id, t, f[1], delay_ms, f[2], due, f[3], now, reason)
  return due
end

-- The TTL sweep (promote.lua runs it when the timers entry 'x:' is due): jobs past their TTL
-- expire, at most `limit` per call; a reserved one expires when its reservation ends (end_try).
-- An expired job never becomes ready: nobody is woken.
local function sweep_ttl(now, limit)
  for _, m in ipairs(rcall('ZRANGEBYSCORE', K_TTL, '-inf', now, 'LIMIT', 0, limit)) do
    local id = id_of(m)
    local jk = k_job(id)
    local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE)
    if f[1] == 'reserved' or not f[1] then
      rcall('ZREM', K_TTL, m)
    else
      local _, _, _, _, on_expire = policies_of(jk, f[2])
      expire_job(id, f[2], jk, f[1], now, on_expire)
    end
  end
  arm_ttl_timer()
end
