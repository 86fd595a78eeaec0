--[[ tubes: change a connection's watch list (watch, ignore), creating tubes on first reference
and removing those left unreferenced. A connection counted as waiting (a push consumer with
credits and no job) is counted out of its old tubes and in on its new ones.
KEYS[1]  namespace root
ARGV     instance id, token, now (ms), then pairs (op, tube); op is '+w' | '-w'
Returns  1
]]
--- @include "keys"
--- @include "jobs"
--- @include "refs"
--- @include "waiter_counts"
local inst, token, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local ik = k_instance(inst)
local waiting = count_waiting(inst, token, -1)
local dropped = {}
for i = 4, #ARGV, 2 do
  if apply_watch(ARGV[i], ARGV[i + 1], token, ik, now) then dropped[#dropped + 1] = ARGV[i + 1] end
end
if waiting then count_waiting(inst, token, 1, waiting) end
for _, t in ipairs(dropped) do gc_tube(t) end
return 1
