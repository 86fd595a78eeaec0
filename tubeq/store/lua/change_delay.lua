--[[ change_delay: a delayed job becomes due `delay_ms` from now (change-delay).
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then id,
         delay_ms, now (ms)
Returns  the new due time (ms) | 0 no such job, or not delayed | -1 it became ready at once
         (delay_ms 0)
Events   'rescheduled' (delay_ms, due_ms: the new ones); with delay_ms 0 also 'promoted'
Wakes    with delay_ms 0, reserves blocked on the tube
The tube's delay timer (timers 'd:<tube>') is re-armed to its earliest due job, earlier or
later (arm_delay_timer), so promote fires for the new due time; the caller nudges its process's
scheduler with the returned due time. stats-job's `delay` becomes the new delay in whole
seconds (truncated).
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
local id, delay_ms, now = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_PRI)
local state, t = f[1], f[2]
if state ~= 'delayed' then return 0 end
local due = now + delay_ms
local delay_s = math.floor(delay_ms / 1000)
if delay_s > 0 then rcall('HSET', jk, JOB_DELAY, delay_s) else rcall('HDEL', jk, JOB_DELAY) end
job_event('rescheduled', id, now, delay_ms, due, '')
if delay_ms == 0 then
  count_in('d', -rcall('ZREM', k_delayed(t), member(id)))
  arm_delay_timer(t)
  rcall('HSET', jk, JOB_STATE, 'ready')
  rcall('HDEL', jk, JOB_DUE)
  enqueue_ready(id, t, tonumber(f[3]), now)
  job_event('promoted', id, now, 0, due, '')
  wake(t)
  return -1
end
rcall('HSET', jk, JOB_DUE, due)
rcall('ZADD', k_delayed(t), due, member(id))
arm_delay_timer(t)
return due
