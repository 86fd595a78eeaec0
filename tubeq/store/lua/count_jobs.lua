--[[ count_jobs: every job of the namespace, in every state (the --max-jobs check).
KEYS[1]  namespace root
ARGV     none
Returns  the count: the ready, delayed and buried jobs of every tube, and the reserved ones
Cost     three ZCARDs per tube; the server runs it once a second, only with --max-jobs
]]
--- @include "keys"
local n = redis.call('ZCARD', K_RESERVED)
for _, t in ipairs(redis.call('ZRANGE', K_TUBES, 0, -1)) do
  n = n + redis.call('ZCARD', k_ready(t)) + redis.call('ZCARD', k_delayed(t))
    + redis.call('ZCARD', k_buried(t))
end
return n
