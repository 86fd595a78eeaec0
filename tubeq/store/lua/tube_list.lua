--[[ tube_list: a page of the tubes in creation order, each with when it was created by Redis's
clock (a split namespace's list-tubes merges its shards' lists by it: tubeq.store.shards).
KEYS[1]  namespace root
ARGV     start (rank in creation order), count (tubes in this page)
Returns  {tube, created (us), tube, created, ...}; created 0 for a tube older than this field;
         fewer than `count` tubes: the last page
Cost     O(count): the caller pages through a namespace of many tubes
]]
--- @include "keys"
--- @include "jobs"
local start = tonumber(ARGV[1])
local out = {}
for _, t in ipairs(rcall('ZRANGE', K_TUBES, start, start + tonumber(ARGV[2]) - 1)) do
  out[#out + 1] = t
  out[#out + 1] = tonumber(rcall('HGET', k_tube(t), 'cu') or 0)
end
return out
