--[[ tube_list: the tubes in creation order, each with when it was created by Redis's clock (a
split namespace's list-tubes merges its shards' lists by it: tubeq.store.shards).
KEYS[1]  namespace root
ARGV     (none)
Returns  {tube, created (us), tube, created, ...}; created 0 for a tube older than this field
]]
--- @include "keys"
--- @include "jobs"
local out = {}
for _, t in ipairs(rcall('ZRANGE', K_TUBES, 0, -1)) do
  out[#out + 1] = t
  out[#out + 1] = tonumber(rcall('HGET', k_tube(t), 'cu') or 0)
end
return out
