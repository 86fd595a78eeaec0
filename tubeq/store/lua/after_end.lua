--[[ after_end: tell held children of this shard that a parent ended (includes/after.lua): the
ends tubeq.server.parents drained from the parents' shards' K_PARENT_ENDS.
KEYS[1]  namespace root (the children's shard)
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then now (ms),
         then (child, parent, done '1' | '0') triples
Returns  per triple 1 (told, or nothing left to tell: the child is no longer held, or already
         knew) or 0 (no such child: it may not be stored yet, see tubeq.server.parents), then
         the earliest due instant (ms) of a child released into delayed, 0 for none
Events   for a child whose last parent finished, 'promoted' with reason 'after' (ready, or
         delayed by its own delay); for a child whose parent ended otherwise, 'buried' with
         reason 'parent-failed', its own end told to its waiters and children
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
--- @include "after"
local now = tonumber(ARGV[3])
local out, earliest = {}, 0
for i = 4, #ARGV - 2, 3 do
  local child, parent, done = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local jk = k_job(child)
  local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE)
  if not f[1] then
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
    if f[1] == 'held' and rcall('SREM', k_after(child), parent) == 1 then
      if done ~= '1' then
        fail_held(child, f[2], jk, now, 'held')
      elseif rcall('EXISTS', k_after(child)) == 0 then
        local due = release_held(child, f[2], jk, now)
        if due > 0 and (earliest == 0 or due < earliest) then earliest = due end
      end
    end
  end
end
out[#out + 1] = earliest
return out
