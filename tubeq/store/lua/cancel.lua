--[[ cancel: job `id` is not to run (again). Ready, delayed or buried, it is deleted at once,
as delete.lua deletes a job (drop_cancelled: event 'deleted' with reason 'cancelled', its end
'cancelled' for waiters). Reserved, it is marked: its holder hears CANCELLED at its next touch,
finish or fail, which deletes it; a release, bury, TTR timeout or disconnect deletes it too.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then id, now (ms)
Returns  1 deleted | 2 marked (reserved) | 0 not found
Tells    a marked job's holder's process, on k_cancels(instance): '<token> <id>'
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local id, now = ARGV[3], tonumber(ARGV[4])
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_OWNER)
if not f[1] then return 0 end
if f[1] == 'reserved' then
  rcall('HSET', jk, JOB_CANCELLED, 1)
  -- its holder's process: a push connection that asked is told at once (a token is
  -- '<instance>:<number>')
  local instance = string.match(f[3] or '', '^(.*):[^:]*$')
  if instance then rcall('PUBLISH', k_cancels(instance), f[3] .. ' ' .. text(id)) end
  return 2
end
drop_cancelled(id, f[2], jk, f[1], now)
return 1
