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
