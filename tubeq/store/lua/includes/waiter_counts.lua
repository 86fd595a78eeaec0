-- Waiting connections: a reserve blocked in some process. Each is recorded in K_WAITING (token
-- -> its mode, one character, then its line), counted for its process (the gauge 'waiting'),
-- and queued in the line of its watch set in the order it started waiting (a seq).
--
-- Lines: connections that watch the same set of tubes share one line (k_line, a ZSET of
-- token -> seq), named by a digest of the set (line_of). A line with waiters is entered in each
-- of its tubes' k_waiters ZSET, scored by the seq of its first waiter as it was then; a line is
-- entered when its first waiter comes and leaves its tubes when its last one goes. So a count in
-- or out costs O(1) whatever the connection watches and however many connections wait with it,
-- and O(watched tubes) only when its line starts or stops having waiters: 100 consumers that all
-- watch the same 100 tubes pay for the 100 tubes once, not at every wait (issue 33 item 7:
-- that walk was 75 HINCRBY, 40 ZADD/ZREM and ~1 ms of Redis per job with 256 such consumers).
--
-- A line's first waiter only ever gets a later seq (waiters join at the back; a grant or a
-- count out removes one), so a tube's score of a line is at most the seq of its first waiter
-- now: the first waiter on a tube is found by taking the line of the lowest score and, when its
-- score is behind, raising the score and looking again (first_line). put.lua hands a new job to
-- it; anything else that makes a job ready PUBLISHes a wake-up, only for tubes with a line
-- (has_waiters).

-- The process instance a connection token belongs to (tokens are "<instance>:<n>").
local function instance_of(token)
  return string.match(token, '^(.*):[^:]*$')
end

-- The tokens of process `inst` recorded as waiting (reap.lua: those in no connection set, an
-- HTTP long poll's). An HSCAN of K_WAITING for the instance's prefix: O(waiting tokens of the
-- namespace), for the reap of a process only.
local function waiting_tokens_of(inst)
  local pattern = string.gsub(inst, '[%*%?%[%]\\]', '\\%0') .. ':*'
  local found, cursor = {}, '0'
  repeat
    local page = rcall('HSCAN', K_WAITING, cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = page[1]
    for i = 1, #page[2], 2 do
      local token = page[2][i]
      if instance_of(token) == inst then found[#found + 1] = token end
    end
  until cursor == '0'
  return found
end

-- The line of a watch set: a digest of its tubes, sorted (20 hex digits). A connection counted
-- in waits in the line of its watch set as it is (tubes.lua counts it out and in again around a
-- change), so its line names exactly what it watches: line_name({t}) is the line of those that
-- watch t alone.
local function line_name(sorted_tubes)
  return string.sub(redis.sha1hex(table.concat(sorted_tubes, '\n')), 1, 20)
end

-- The line of `token`'s watch set: a digest of its tubes, sorted, kept in K_LINE_OF until the
-- set changes (apply_watch in includes/refs.lua, restore.lua and reap.lua drop it). nil for an
-- empty set: a token reaped with its process (reap.lua) until restore.lua brings its watches
-- back, which waits on no tube.
local function line_of(token)
  local line = rcall('HGET', K_LINE_OF, token)
  if line then return line end
  local tubes = rcall('SMEMBERS', k_watch(token))
  if #tubes == 0 then return nil end
  table.sort(tubes)
  line = line_name(tubes)
  rcall('HSET', K_LINE_OF, token, line)
  return line
end

-- A connection's mode (K_WAITING's value without its line), or nil when it is not waiting.
local function waiting_mode(token)
  local v = rcall('HGET', K_WAITING, token)
  return v and string.sub(v, 1, 1)
end

-- Count a connection in (delta 1) or out of (delta -1) the waiters of every tube it watches.
-- Idempotent: counting in a connection already in, or out one already out (a put handed it a
-- job meanwhile), does nothing; so does counting in one that watches no tube. Returns false
-- when it changed nothing, else the mode it was
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
  local line
  if delta > 0 then
    mode = mode or '1'
    line = line_of(token)
    -- No tube to wait on (its watches were reaped): nothing recorded, so the count in its
    -- process sends once restore.lua brought them back is the one that counts.
    if not line then return false end
    if rcall('HSETNX', K_WAITING, token, mode .. line) == 0 then return false end
    local seq = rcall('HINCRBY', K_SEQS, 'wait', 1)
    local lk = k_line(line)
    rcall('ZADD', lk, seq, token)
    if rcall('ZCARD', lk) == 1 then  -- the line's first waiter: the line enters its tubes
      local tubes = rcall('SMEMBERS', k_watch(token))
      for _, t in ipairs(tubes) do rcall('ZADD', k_waiters(t), seq, line) end
      if #tubes > 0 then rcall('SADD', k_line_tubes(line), unpack(tubes)) end
    end
  else
    local v = rcall('HGET', K_WAITING, token)
    if not v then return false end
    rcall('HDEL', K_WAITING, token)
    mode, line = string.sub(v, 1, 1), string.sub(v, 2)
    local lk = k_line(line)
    rcall('ZREM', lk, token)
    if rcall('EXISTS', lk) == 0 then  -- its last waiter: the line leaves its tubes
      local tk = k_line_tubes(line)
      for _, t in ipairs(rcall('SMEMBERS', tk)) do rcall('ZREM', k_waiters(t), line) end
      rcall('DEL', tk)
    end
  end
  if mode ~= 'o' then bump(k_instance(inst), 'waiting', delta) end
  return mode
end

-- The line whose first waiter started waiting on tube t before any other's, or nil when nobody
-- waits on t. A score behind its line's first waiter is raised to that waiter's seq and the
-- lowest looked at again; a line left empty (written by an older layout) is dropped. No cap:
-- each raise or drop is permanent (no later call makes it again) and was paid for by the count
-- out that made the score stale, so the loop is amortized O(1) per count out; and a cap would
-- settle for a line whose first waiter came after another line's (first come, first served
-- across lines, protocol.md) or for nobody while lines remain (a missed hand-over). It ends: a
-- raise sets a score to its line's first seq, which no step of this call changes.
-- Also returns what the reads found, for a put's hand-over (includes/handing.lua): the line's
-- first two waiters with their seqs ({token, seq, token, seq}), and whether other lines wait
-- on t.
local function first_line(t)
  local wk = k_waiters(t)
  while true do
    local head = rcall('ZRANGE', wk, '0', '1', 'WITHSCORES')
    local line = head[1]
    if not line then return nil end
    local first = rcall('ZRANGE', k_line(line), '0', '1', 'WITHSCORES')
    if not first[1] then
      rcall('ZREM', wk, line)  -- a line with nobody left (written by an older layout)
    elseif first[2] == head[2] then
      return line, first, head[3] ~= nil
    else
      rcall('ZADD', wk, first[2], line)
    end
  end
end

-- Whether any connection waits on tube t (a line with waiters is entered in its tubes); a put
-- reads first_line instead, which says the same with what its hand-over needs.
local function has_waiters(t)
  return rcall('EXISTS', k_waiters(t)) == 1
end

-- How many connections wait on tube t (stats-tube's current-waiting): O(lines of t).
local function waiting_on(t)
  local n = 0
  for _, line in ipairs(rcall('ZRANGE', k_waiters(t), '0', '-1')) do
    n = n + rcall('ZCARD', k_line(line))
  end
  return n
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
