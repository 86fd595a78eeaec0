--[[ wait: count a connection in (delta 1) or out of (delta -1) the waiters of every tube it
watches (see includes/waiting.lua).
KEYS[1]  namespace root
ARGV     instance id, token, delta
Returns  1
]]
--- @include "keys"
--- @include "jobs"
--- @include "waiting"
count_waiting(ARGV[1], ARGV[2], tonumber(ARGV[3]))
return 1
