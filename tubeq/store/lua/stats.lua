--[[ stats: the shared counts behind a stats reply: the namespace's jobs by state, its tubes,
the gauges of its live instances, and the shared counters.
KEYS[1]  namespace root
ARGV     (none)
Returns  {urgent, ready, reserved, delayed, buried, tubes, connections, producers, workers,
         waiting, field, value, field, value, ...} where the pairs are the global counters
Cost     O(live instances): the job counts are K_COUNTS (kept as jobs move, includes/jobs.lua)
         and ZCARDs, never a walk over the tubes
]]
--- @include "keys"
local rcall = redis.call
local c = rcall('HMGET', K_COUNTS, 'u', 'r', 'd', 'b')
local urgent = tonumber(c[1] or 0)
local out = {urgent, urgent + tonumber(c[2] or 0), rcall('ZCARD', K_RESERVED),
             tonumber(c[3] or 0), tonumber(c[4] or 0), rcall('ZCARD', K_TUBES), 0, 0, 0, 0}
for _, inst in ipairs(rcall('ZRANGE', K_INSTANCES, 0, -1)) do
  local g = rcall('HMGET', k_instance(inst), 'conns', 'producers', 'workers', 'waiting')
  for i = 1, 4 do out[6 + i] = out[6 + i] + tonumber(g[i] or 0) end
end
for _, v in ipairs(rcall('HGETALL', K_STATS)) do out[#out + 1] = v end
return out
