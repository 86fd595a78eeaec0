--[[ recount: set the namespace's jobs by state (K_COUNTS, includes/jobs.lua) from the tubes'
sets, where they are not known to be whole: a namespace written by a build before layout 3,
which kept no such counts, or any namespace when `force` is given (a layout upgrade).
KEYS[1]  namespace root (each shard root of a split namespace)
ARGV     force ('1': recount even when K_COUNTS says it is whole)
Returns  -1 when nothing was done, else the number of tubes visited
Cost     O(tubes) when it counts: run once per namespace at start by the process that finds the
         counts missing (tubeq.store.layout), never on a command's path
]]
--- @include "keys"
--- @include "jobs"
if ARGV[1] ~= '1' and rcall('HEXISTS', K_COUNTS, 'v') == 1 then return -1 end
local u, r, d, b, h = 0, 0, 0, 0, 0
local tubes = rcall('ZRANGE', K_TUBES, 0, -1)
for _, t in ipairs(tubes) do
  local rk = k_ready(t)
  local urgent = rcall('ZCOUNT', rk, '-inf', '(' .. URGENT_BELOW)
  u = u + urgent
  r = r + rcall('ZCARD', rk) - urgent
  d = d + rcall('ZCARD', k_delayed(t))
  b = b + rcall('ZCARD', k_buried(t))
  h = h + rcall('ZCARD', k_held(t))
end
rcall('HSET', K_COUNTS, 'u', u, 'r', r, 'd', d, 'b', b, 'h', h, 'v', 1)
return #tubes
