--[[ wait: count a connection in (delta 1) or out of (delta -1) the waiters of every tube it
watches. put/release/kick/promote PUBLISH a wake-up only for tubes with waiters.
KEYS[1]  namespace root
ARGV     instance id, token, delta
Returns  1
]]
--- @include "keys"
--- @include "jobs"
local inst, token, delta = ARGV[1], ARGV[2], tonumber(ARGV[3])
local ik = k_instance(inst)
for _, t in ipairs(rcall('SMEMBERS', k_watch(token))) do
  bump(K_REFS, 'q:' .. t, delta)
  bump(ik, 'q:' .. t, delta)
end
bump(ik, 'waiting', delta)
return 1
