--[[ add_child: a job about to be put on another shard with after= names parents of this
shard (tubeq.store.shards): each living one learns of the child, so its end reaches it
(includes/after.lua); or, with `undo`, forgets it again (the put was refused).
KEYS[1]  namespace root (the parents' shard)
ARGV     child id, keep (ms: how long the parents' ends are kept), undo ('1' | '0'), then the
         parents' ids
Returns  per parent what it is (includes/after.lua): 0 unknown, 1 living (told), 2 ended
         finished, 3 ended otherwise; with undo, nothing
]]
--- @include "keys"
--- @include "ends"
--- @include "jobs"
--- @include "after"
local child, keep, undo = ARGV[1], ARGV[2], ARGV[3] == '1'
local out = {}
for i = 4, #ARGV do
  local p = ARGV[i]
  if undo then
    rcall('SREM', k_children(p), child)
  else
    local s = parent_state(p)
    if s == PARENT_LIVING then add_child(p, child, keep) end
    out[#out + 1] = s
  end
end
return out
