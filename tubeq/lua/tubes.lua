--[[ tubes: change a connection's watch list (watch, ignore), creating tubes on first reference
and removing those left unreferenced.
KEYS[1]  namespace root
ARGV     instance id, token, now (ms), then pairs (op, tube); op is '+w' | '-w'
Returns  1
]]
--- @include "keys"
--- @include "jobs"
--- @include "refs"
local inst, token, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local ik = k_instance(inst)
local dropped = {}
for i = 4, #ARGV, 2 do
  if apply_watch(ARGV[i], ARGV[i + 1], token, ik, now) then dropped[#dropped + 1] = ARGV[i + 1] end
end
for _, t in ipairs(dropped) do gc_tube(t) end
return 1
