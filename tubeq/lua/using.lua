--[[ using: how many of one process's connections use each tube (the `use` command), sent in
batches; creates tubes on their first reference and removes those left unreferenced.
KEYS[1]  namespace root
ARGV     instance id, now (ms), then pairs (tube, count of the instance's connections using it)
Returns  1
]]
--- @include "keys"
--- @include "jobs"
--- @include "refs"
local inst, now = ARGV[1], tonumber(ARGV[2])
local ik = k_instance(inst)
local dropped = {}
for i = 3, #ARGV, 2 do
  local t = ARGV[i]
  if set_using(t, tonumber(ARGV[i + 1]), ik, now) then dropped[#dropped + 1] = t end
end
for _, t in ipairs(dropped) do gc_tube(t) end
return 1
