-- Handing a new ready job straight to a waiting connection, as beanstalkd hands it over before it
-- answers the put (put.lua, put_many.lua).

-- A process that has not heart-beaten for this long may have died: its waiters are skipped (the
-- job stays ready for the others, and reap.lua cleans up after it). Two heartbeats.
local HAND_OVER_ALIVE_WITHIN_MS = 2000

-- The first connection waiting on tube t, in a live process, gets the job it would reserve now
-- (normally the new one; the best of its watched tubes if another became ready meanwhile).
-- Returns the id handed over, or false when nobody can take a job. The first waiter is the
-- first of the first line of t (first_line in includes/waiter_counts.lua; `line`: what the
-- caller's first_line found, nothing having changed the waiters since); a dead process's
-- waiters at the head of that line are passed over (at most 16 of them).
local function hand_over_in(t, now, line)
  line = line or first_line(t)
  if not line then return false end
  local token
  for _, candidate in ipairs(rcall('ZRANGE', k_line(line), '0', '15')) do
    local beat = rcall('ZSCORE', K_INSTANCES, instance_of(candidate))
    if beat and now - tonumber(beat) <= HAND_OVER_ALIVE_WITHIN_MS then
      token = candidate
      break
    end
  end
  if not token then return false end
  -- It waits over several shards (tubeq.store.shards): it reserves the job itself once woken.
  -- ('p', a push loop: as '1' here; see direct_taker.)
  local mode = waiting_mode(token)
  if mode ~= '1' and mode ~= 'p' then return false end
  local entry = best_entry(token)
  if not entry then return false end  -- e.g. the tube is paused
  local job = take_entry(entry, token, now)
  local inst = instance_of(token)
  count_waiting(inst, token, -1)
  rcall('RPUSH', k_handed(token), job[1])
  rcall('PUBLISH', k_grant(inst), token)
  return job[1]
end

-- The push loop of the calling process (EVENTS_BY, includes/events.lua) that takes a new ready
-- job of tube t at once, in the put's own reply (put.lua's direct hand-over), or false. Only
-- when that changes nothing of what the classic hand-over above would do: its connection is
-- the first waiting on t, counted in by its push loop (mode 'p', includes/waiter_counts.lua),
-- watches t alone (its line is t's own, line_name), and t has no ready job (`meta`,
-- ensure_tube's fields: no ready_tubes entry, no pause that may still hold jobs back, no
-- reserve limits), so the new job is the one it would reserve. `line`, `first`, `others`:
-- what first_line(t) returned; `budget` (put_many.lua's calls): token -> jobs it may still be
-- given this way (nil: no bound, one job per put). It stays counted in (its process counts it
-- out once its credit is used), and goes to the back of t's line when others wait there too,
-- as a grant and its next count-in would put it (its line is t's alone, so t's score of it is
-- set to the line's new first seq at once: the next put's first_line finds it exact, with no
-- raise to make).
local function direct_taker(t, meta, line, first, others, budget)
  if not meta or meta[1] or meta[2] or meta[3] or not line then return false end
  local token = first[1]
  if instance_of(token) ~= EVENTS_BY or line ~= line_name({t}) then return false end
  if budget and not ((budget[token] or 0) > 0) then return false end
  if waiting_mode(token) ~= 'p' then return false end
  if first[3] or others then
    local seq = rcall('HINCRBY', K_SEQS, 'wait', 1)
    rcall('ZADD', k_line(line), seq, token)
    rcall('ZADD', k_waiters(t), first[4] or seq, line)
  end
  return token
end

-- A run of direct hand-overs (put_many.lua's calls, one batch): t's first line read once, its
-- waiters turned in memory as each takes a job (the taker to the back, as direct_taker moves
-- it), and written back once (direct_flush), where direct_taker would read and write the
-- line for each job. nil when direct_taker would hand nothing (see there), or when the line
-- is longer than one read takes (then each job goes its own way). Its queue is the line's
-- waiters in order ({token, seq}, from `head` on); `other`: the score of the next line
-- waiting on t, a lower bound of its first waiter's seq, or nil.
local DIRECT_RUN_MAX = 64
local function direct_run(t, meta)
  if not meta or meta[1] or meta[2] or meta[3] then return nil end
  local line = first_line(t)
  if not line or line ~= line_name({t}) then return nil end
  local lk = k_line(line)
  local read = rcall('ZRANGE', lk, '0', tostring(DIRECT_RUN_MAX), 'WITHSCORES')
  if #read > 2 * DIRECT_RUN_MAX then return nil end
  local queue = {}
  for i = 1, #read, 2 do queue[#queue + 1] = {read[i], read[i + 1]} end
  local next_line = rcall('ZRANGE', k_waiters(t), '1', '1', 'WITHSCORES')
  return {t = t, line = line, lk = lk, queue = queue, head = 1, modes = {}, moved = {}, moves = 0,
    seq = tonumber(rcall('HGET', K_SEQS, 'wait') or 0), other = tonumber(next_line[2])}
end

-- The token of `run`'s line that takes the next job directly, within `budget` (token -> jobs
-- it may still be given), or false: as direct_taker would answer, the line turned as it would
-- be. After a turn that lets another line's waiter come first, run.done is set: the run is
-- to be flushed before anything else looks at t's waiters.
local function direct_next(run, budget)
  local token = run.queue[run.head][1]
  if instance_of(token) ~= EVENTS_BY or not ((budget[token] or 0) > 0) then return false end
  local mode = run.modes[token]
  if mode == nil then
    mode = waiting_mode(token) or ''
    run.modes[token] = mode
  end
  if mode ~= 'p' then return false end
  if run.head < #run.queue or run.other then
    run.seq, run.moves = run.seq + 1, run.moves + 1
    run.queue[#run.queue + 1] = {token, run.seq}
    run.head = run.head + 1
    run.moved[token] = run.seq
    if run.other and tonumber(run.queue[run.head][2]) > run.other then run.done = true end
  end
  return token
end

-- Write `run`'s turns back: the seqs used, the moved waiters' places in the line, the line's
-- score on t (its new first seq), as direct_taker's writes would have left them.
local function direct_flush(run)
  run.done = true
  if run.moves == 0 then return end
  rcall('HINCRBY', K_SEQS, 'wait', run.moves)
  local pairs_ = {}
  for token, seq in pairs(run.moved) do
    pairs_[#pairs_ + 1] = seq
    pairs_[#pairs_ + 1] = token
  end
  rcall('ZADD', run.lk, unpack(pairs_))
  rcall('ZADD', k_waiters(run.t), run.queue[run.head][2], run.line)
  run.moves = 0
end
