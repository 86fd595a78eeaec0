--[[ kick_job: move one buried or delayed job, in any tube, to ready.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then id, now (ms)
Returns  1 kicked | 0 not found or not buried/delayed
Events   'kicked'
Wakes    reserves blocked on the tube
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
local id, now = ARGV[3], tonumber(ARGV[4])
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_PRI)
local state, t = f[1], f[2]
if state ~= 'buried' and state ~= 'delayed' then return 0 end
unlink(id, t, state, now)
rcall('HSET', jk, JOB_STATE, 'ready', JOB_READY_SINCE, now)
rcall('HDEL', jk, JOB_DUE)
rcall('HINCRBY', jk, JOB_KICKS, 1)
enqueue_ready(id, t, tonumber(f[3]), now)
job_event('kicked', id, now, 0, 0, '')
wake(t)
return 1
