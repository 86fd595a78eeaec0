--[[ release: give a reserved job back, ready or delayed, with a new priority.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, id,
         pri, delay (s), now (ms)
Returns  1 released (or taken by a policy: see below) | 0 not reserved by this connection
Events   'released' (delay_ms and due_ms set when delayed); when the release ends the job's
         max-tries-th try or comes after its TTL, 'buried' (reason 'max-tries' | 'expired')
         or 'expired' instead (includes/policies.lua), and the reply is still RELEASED
Wakes    reserves blocked on the tube when the job is ready
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local token, id, pri, delay, now = ARGV[3], ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_OWNER)
if f[1] ~= 'reserved' or f[3] ~= token then return 0 end
local t = f[2]
rcall('HINCRBY', jk, JOB_RELEASES, 1)
rcall('HSET', jk, JOB_PRI, pri)
if end_try(id, t, jk, now, 'release') then return 1 end  -- dead-lettered or expired
unlink(id, t, 'reserved', now)
rcall('HDEL', jk, JOB_OWNER)
if tonumber(delay) > 0 then
  local due = now + tonumber(delay) * 1000
  rcall('HSET', jk, JOB_STATE, 'delayed', JOB_PRI, pri, JOB_DELAY, delay, JOB_DUE, due)
  enqueue_delayed(id, t, due)
  job_event('released', id, now, tonumber(delay) * 1000, due, '')
else
  rcall('HSET', jk, JOB_STATE, 'ready', JOB_PRI, pri, JOB_READY_SINCE, now)
  rcall('HDEL', jk, JOB_DUE, JOB_DELAY)  -- delay 0: the default
  enqueue_ready(id, t, tonumber(pri), now)
  job_event('released', id, now, 0, 0, '')
  wake(t)
end
return 1
