--[[ kick: move up to `bound` jobs of a tube to ready: buried ones in bury order if the tube has
any, otherwise delayed ones by due time; never both in one call.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then tube, bound,
         now (ms), and optionally the set to kick from ('b' buried, 'd' delayed): a kick of
         more jobs than one call moves (tubeq.store.store.KICK_CHUNK) goes on from the set its
         first call chose, as beanstalkd's one kick does
Returns  {the number of jobs kicked, the set they came from ('b' | 'd')}
Events   'kicked' per job
Wakes    reserves blocked on the tube
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
local t, bound, now, chosen = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
if not chosen or chosen == '' then
  chosen = rcall('EXISTS', k_buried(t)) == 1 and 'b' or 'd'
end
if bound <= 0 then return {0, chosen} end
local from_delayed = chosen == 'd'
local from = from_delayed and k_delayed(t) or k_buried(t)
local members = rcall('ZRANGE', from, 0, bound - 1)
for _, m in ipairs(members) do
  local id = id_of(m)
  local jk = k_job(id)
  count_in(chosen, -rcall('ZREM', from, m))
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
return {#members, chosen}
