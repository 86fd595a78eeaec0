--[[ connect: a new client connection: it watches 'default' (its use of 'default' is counted by
its process, see using.lua).
KEYS[1]  namespace root
ARGV     instance id, token, now (ms)
Returns  1
]]
--- @include "keys"
--- @include "jobs"
--- @include "refs"
local inst, token, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local ik = k_instance(inst)
rcall('SADD', k_instance_conns(inst), token)
bump(ik, 'conns', 1)
rcall('HINCRBY', K_STATS, 'total-connections', 1)
apply_watch('+w', 'default', token, ik, now)
return 1
