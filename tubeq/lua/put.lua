--[[ put: store a new job in a tube, ready or delayed.
KEYS[1]  namespace root
ARGV     tube, pri, delay (s), ttr (s), body, now (ms)
Returns  the new job id (the server's total-jobs is counted by the process: tubeq/stats.py)
Events   wakes reserves blocked on the tube when the job is ready
]]
--- @include "keys"
--- @include "jobs"
local t, pri, delay, ttr, body, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
ensure_tube(t, now)
local id = rcall('INCR', K_JOB_IDS)
local jk = k_job(id)
if tonumber(delay) > 0 then
  local due = now + tonumber(delay) * 1000
  rcall('HSET', jk, 't', t, 's', 'delayed', 'p', pri, 'd', delay, 'r', ttr, 'c', now, 'u', due, 'b', body)
  enqueue_delayed(id, t, due)
else
  -- no 'd' field: a delay of 0 is the default every reader assumes (a field less per job)
  rcall('HSET', jk, 't', t, 's', 'ready', 'p', pri, 'r', ttr, 'c', now, 'b', body)
  enqueue_ready(id, t, tonumber(pri), now)
  wake(t)
end
rcall('HINCRBY', k_tube(t), 'total', 1)
return id
