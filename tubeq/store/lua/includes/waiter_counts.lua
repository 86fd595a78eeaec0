-- Waiting connections: a reserve blocked in some process. Each is counted for its process
-- `inst` and in total (`q:<tube>` of refs: put/release/kick/promote PUBLISH a wake-up only for
-- tubes with waiters, and stats-tube's current-waiting reads the counts), and listed per tube in
-- the order it started waiting (put.lua hands a new job to the first of them).

-- The process instance a connection token belongs to (tokens are "<instance>:<n>").
local function instance_of(token)
  return string.match(token, '^(.*):[^:]*$')
end

-- Count a connection in (delta 1) or out of (delta -1) the waiters of every tube it watches.
-- Idempotent: counting in a connection already in, or out one already out (a put handed it a
-- job meanwhile), does nothing. Returns false when it changed nothing, else the mode it was
-- counted in with: '1' (the default: puts hand it a job), or for a connection whose tubes span
-- several shards of a namespace (tubeq.store.shards) 'h' or 'o': never handed a job, so no two
-- shards hand one wait a job each ('h' in one shard, whose process gauge 'waiting' counts it,
-- 'o' in the others). Such a connection still takes its turn in each tube's queue of waiters:
-- a put whose first waiter it is hands the job to nobody and PUBLISHes the wake-up that makes
-- it reserve, so it is served before the connections that started waiting after it. And 'p',
-- a push loop (reserve.lua's take that found nothing): handed jobs as '1', and a put by its own
-- process whose new job it takes at once hands it over in the put's reply and leaves it
-- counted in (put.lua, direct_taker in includes/handing.lua): the loop counts itself out when
-- its credit is used up.
local function count_waiting(inst, token, delta, mode)
  if delta > 0 then
    mode = mode or '1'
    if rcall('HSETNX', K_WAITING, token, mode) == 0 then return false end
  else
    mode = rcall('HGET', K_WAITING, token)
    if not mode then return false end
    rcall('HDEL', K_WAITING, token)
  end
  local ik = k_instance(inst)
  local seq = delta > 0 and rcall('HINCRBY', K_SEQS, 'wait', 1)
  for _, t in ipairs(rcall('SMEMBERS', k_watch(token))) do
    bump(K_REFS, 'q:' .. t, delta)
    bump(ik, 'q:' .. t, delta)
    if seq then
      rcall('ZADD', k_waiters(t), seq, token)
    else
      rcall('ZREM', k_waiters(t), token)
    end
  end
  if mode ~= 'o' then bump(ik, 'waiting', delta) end
  return mode
end

-- Take back the jobs put.lua handed to `token` that its process has not claimed yet: those
-- still reserved by it, as reservations (see grant) one after another, at most `limit` (nil:
-- all).
local function claim_handed(token, limit)
  local out = {}
  local hk = k_handed(token)
  while limit == nil or #out < 5 * limit do
    local id = rcall('LPOP', hk)
    if not id then break end
    local f = rcall('HMGET', k_job(id), JOB_STATE, JOB_OWNER, JOB_TTR, JOB_BODY, JOB_RESERVED_AT,
      JOB_READY_SINCE, JOB_CREATED, JOB_TUBE)
    if f[1] == 'reserved' and f[2] == token then
      out[#out + 1] = tonumber(id)
      out[#out + 1] = tonumber(f[3])
      out[#out + 1] = f[4]
      -- no 'ra': handed over by a tubeq older than these metrics (a rolling upgrade)
      out[#out + 1] = f[5] and waited_ms(tonumber(f[5]), f[6], f[7]) or -1
      out[#out + 1] = f[8]
    end
  end
  return out
end
