--[[ heartbeat: a tubeq process says it is alive (and, the first time, that it exists).
KEYS[1]  namespace root
ARGV     instance id, now (ms), holds default ('0': a shard of a split namespace that does
         not hold tube 'default', tubeq.store.shards)
Returns  1 when the process was not registered (its first beat, or it was reaped meanwhile, or
         Redis lost it: the process then restores its registrations, restore.lua), else 0
]]
--- @include "keys"
--- @include "jobs"
local inst, now = ARGV[1], tonumber(ARGV[2])
local added = rcall('ZADD', K_INSTANCES, now, inst)
if ARGV[3] ~= '0' then ensure_tube('default', now) end
return added
