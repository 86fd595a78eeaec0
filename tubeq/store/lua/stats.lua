--[[ stats: the shared counts behind a stats reply, summed over tubes and live instances.
KEYS[1]  namespace root
ARGV     (none)
Returns  {urgent, ready, reserved, delayed, buried, tubes, connections, producers, workers,
         waiting, field, value, field, value, ...} where the pairs are the global counters
]]
--- @include "keys"
--- @include "jobs"
local out = {0, 0, 0, 0, 0, rcall('ZCARD', K_TUBES), 0, 0, 0, 0}
for _, t in ipairs(rcall('ZRANGE', K_TUBES, 0, -1)) do
  out[1] = out[1] + rcall('ZCOUNT', k_ready(t), '-inf', '(1024')
  out[2] = out[2] + rcall('ZCARD', k_ready(t))
  out[3] = out[3] + tonumber(rcall('HGET', k_tube(t), 'nres') or 0)
  out[4] = out[4] + rcall('ZCARD', k_delayed(t))
  out[5] = out[5] + rcall('ZCARD', k_buried(t))
end
for _, inst in ipairs(rcall('ZRANGE', K_INSTANCES, 0, -1)) do
  local g = rcall('HMGET', k_instance(inst), 'conns', 'producers', 'workers', 'waiting')
  for i = 1, 4 do out[6 + i] = out[6 + i] + tonumber(g[i] or 0) end
end
for _, v in ipairs(rcall('HGETALL', K_STATS)) do out[#out + 1] = v end
return out
