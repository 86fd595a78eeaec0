-- Handing a new ready job straight to a waiting connection, as beanstalkd hands it over before it
-- answers the put (put.lua, put_many.lua).

-- A process that has not heart-beaten for this long may have died: its waiters are skipped (the
-- job stays ready for the others, and reap.lua cleans up after it). Two heartbeats.
local HAND_OVER_ALIVE_WITHIN_MS = 2000

-- The first connection waiting on tube t, in a live process, gets the job it would reserve now
-- (normally the new one; the best of its watched tubes if another became ready meanwhile).
-- Returns the id handed over, or false when nobody can take a job.
local function hand_over_in(t, now)
  local token
  for _, candidate in ipairs(rcall('ZRANGE', k_waiters(t), '0', '15')) do
    local beat = rcall('ZSCORE', K_INSTANCES, instance_of(candidate))
    if beat and now - tonumber(beat) <= HAND_OVER_ALIVE_WITHIN_MS then
      token = candidate
      break
    end
  end
  if not token then return false end
  -- It waits over several shards (tubeq.store.shards): it reserves the job itself once woken.
  if rcall('HGET', K_WAITING, token) ~= '1' then return false end
  local entry = best_entry(token)
  if not entry then return false end  -- e.g. the tube is paused
  local job = take_entry(entry, token, now)
  local inst = instance_of(token)
  count_waiting(inst, token, -1)
  rcall('RPUSH', k_handed(token), job[1])
  rcall('PUBLISH', k_grant(inst), token)
  return job[1]
end
