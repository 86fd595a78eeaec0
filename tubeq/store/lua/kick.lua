--[[ kick: move up to `bound` jobs of a tube to ready: buried ones in bury order if the tube has
any, otherwise delayed ones by due time; never both in one call.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then tube, bound,
         now (ms)
Returns  the number of jobs kicked
Events   'kicked' per job
Wakes    reserves blocked on the tube
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
local t, bound, now = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if bound <= 0 then return 0 end
local from, from_delayed = k_buried(t), false
if rcall('EXISTS', from) == 0 then
  from, from_delayed = k_delayed(t), true
end
local members = rcall('ZRANGE', from, 0, bound - 1)
for _, m in ipairs(members) do
  local id = id_of(m)
  local jk = k_job(id)
  rcall('ZREM', from, m)
  rcall('HSET', jk, JOB_STATE, 'ready', JOB_READY_SINCE, now)
  rcall('HDEL', jk, JOB_DUE)
  rcall('HINCRBY', jk, JOB_KICKS, 1)
  enqueue_ready(id, t, tonumber(rcall('HGET', jk, JOB_PRI)), now)
  job_event('kicked', id, now, 0, 0, '')
end
if #members > 0 then
  if from_delayed then arm_delay_timer(t) end
  wake(t)
end
return #members
