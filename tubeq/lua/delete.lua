--[[ delete: remove a job in any state; a reserved job only by the connection holding it.
KEYS[1]  namespace root
ARGV     token, id, now (ms)
Returns  1 deleted | 0 not found (or reserved by another connection)
]]
--- @include "keys"
--- @include "jobs"
local token, id, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local jk = k_job(id)
local f = rcall('HMGET', jk, 's', 't', 'o')
local state, t = f[1], f[2]
if not state or (state == 'reserved' and f[3] ~= token) then return 0 end
unlink(id, t, state, now)
rcall('DEL', jk)
rcall('HINCRBY', k_tube(t), 'del', 1)
gc_tube(t)
return 1
