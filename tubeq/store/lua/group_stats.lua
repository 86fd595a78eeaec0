--[[ group_stats: a tube's groups (put-with group=, includes/groups.lua) as stats-tube, the HTTP
API and the dashboard show them: how many have ready jobs, and the busiest by ready jobs.
KEYS[1]  namespace root
ARGV     tube, most (how many of the busiest to name), budget (the most groups looked at)
Returns  {groups with ready jobs, group, ready, reserved, group, ready, reserved, ...}: the
         busiest first (most ready jobs, then by key), at most `most` of them; reserved is
         counted only while the tube has group limits (else 0). {0} for a tube not in group
         mode or not there.
Cost     one ZCARD per group looked at: every group up to `budget`, past that the first
         `budget` of one HSCAN page (then the busiest are those of that sample).
]]
--- @include "keys"
--- @include "jobs"
local t, most, budget = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local places = k_group_places(t)
local n = rcall('HLEN', places)
if n == 0 then return {0} end
local names = {}
if n <= budget then
  names = rcall('HKEYS', places)
else
  local page = rcall('HSCAN', places, 0, 'COUNT', budget)[2]
  for i = 1, #page, 2 do names[#names + 1] = page[i] end
end
local loads = {}
for _, g in ipairs(names) do
  loads[#loads + 1] = {g, rcall('ZCARD', k_group_ready(t, g))}
end
table.sort(loads, function(a, b) return a[2] > b[2] or (a[2] == b[2] and a[1] < b[1]) end)
local out = {n}
local reserved = k_group_reserved(t)
for i = 1, math.min(most, #loads) do
  local g = loads[i][1]
  out[#out + 1] = g
  out[#out + 1] = loads[i][2]
  out[#out + 1] = tonumber(rcall('HGET', reserved, g) or 0)
end
return out
