--[[ using: how many of one process's connections use each tube (the `use` command), sent in
batches; creates tubes on their first reference and removes those left unreferenced.
KEYS[1]  namespace root
ARGV     instance id, now (ms), then pairs (tube, count of the instance's connections using it),
         applied in order: a tube may come twice, (t, 0) then (t, n), when its last user left
         and a new one came before the batch was sent (it is removed in between if nothing else
         references it, as beanstalkd would have, and created anew)
Returns  1
]]
--- @include "keys"
--- @include "jobs"
--- @include "refs"
local inst, now = ARGV[1], tonumber(ARGV[2])
local ik = k_instance(inst)
for i = 3, #ARGV, 2 do
  local t = ARGV[i]
  if set_using(t, tonumber(ARGV[i + 1]), ik, now) then gc_tube(t) end
end
return 1
