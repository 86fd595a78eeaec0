--[[ schedule_remove: remove a tube's schedule (the jobs it already put stay).
KEYS[1]  namespace root
ARGV     tube, name
Returns  1 removed | 0 no such schedule
]]
--- @include "keys"
local t, name = ARGV[1], ARGV[2]
if redis.call('DEL', k_schedule(t, name)) == 0 then return 0 end
redis.call('SREM', k_schedule_names(t), name)
redis.call('ZREM', K_SCHEDULES, t .. ':' .. name)
return 1
