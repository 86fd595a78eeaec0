--[[ delete_many: delete several jobs, each as delete.lua would, in the order given (an id given
twice is deleted once, then not found).
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, now
         (ms), the number of the first reserve it was pipelined behind ('0': none), then the ids
Returns  {1|0, ...}: per id, 1 deleted | 0 not found (or reserved by another connection) | -1
         deferred, nothing deleted (see blocked_ahead in includes/jobs.lua)
Events   'deleted' per job deleted
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local token, now = ARGV[3], tonumber(ARGV[4])
if blocked_ahead(token, ARGV[5]) then return DEFERRED end

local function delete_one(id)
  local jk = k_job(id)
  local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_OWNER, JOB_PRI, JOB_TTR, JOB_RESERVES)
  local state, t = f[1], f[2]
  if not state or (state == 'reserved' and f[3] ~= token) then return 0 end
  unlink(id, t, state, now)
  forget_job(id, jk)  -- its dedupe key is free, its TTL entry goes (as delete.lua)
  rcall('DEL', jk)
  rcall('HINCRBY', k_tube(t), 'del', 1)
  add_event('deleted', id, t, f[4], 0, f[5], 0, f[6], now, '')
  gc_tube(t)
  return 1
end

local out = {}
for i = 6, #ARGV do
  out[#out + 1] = delete_one(ARGV[i])
end
return out
