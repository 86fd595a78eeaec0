--[[ count_jobs: every job of the namespace, in every state (the --max-jobs check).
KEYS[1]  namespace root
ARGV     none
Returns  the count: the ready, delayed, buried and held jobs (K_COUNTS, kept as jobs move,
         includes/jobs.lua) and the reserved ones
Cost     O(1)
]]
--- @include "keys"
local c = redis.call('HMGET', K_COUNTS, 'u', 'r', 'd', 'b', 'h')
local n = redis.call('ZCARD', K_RESERVED)
for i = 1, 5 do n = n + tonumber(c[i] or 0) end
return n
