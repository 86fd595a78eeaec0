--[[ heartbeat: a tubeq process says it is alive (and, the first time, that it exists).
KEYS[1]  namespace root
ARGV     instance id, now (ms)
Returns  1
]]
--- @include "keys"
--- @include "jobs"
local inst, now = ARGV[1], tonumber(ARGV[2])
rcall('ZADD', K_INSTANCES, now, inst)
ensure_tube('default', now)
return 1
