--[[ after_end: tell held children of this shard that a parent ended (includes/after.lua): the
ends tubeq.server.parents drained from the parents' shards' K_PARENT_ENDS.
KEYS[1]  namespace root (the children's shard)
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then now (ms),
         early ('1': the parents are another shard's, so a child not found may not be stored
         yet: its end is kept for its put, k_early_ends; '0': a child not found is gone), then
         (child, parent, done '1' | '0') triples
Returns  the earliest due instant (ms) of a child released into delayed, 0 for none
Events   for a child whose last parent finished, 'promoted' with reason 'after' (ready, or
         delayed by its own delay); for a child whose parent ended otherwise, 'buried' with
         reason 'parent-failed', its own end told to its waiters and children
]]
--- @include "keys"
--- @include "ends"
--- @include "events"
--- @include "jobs"
--- @include "policies"
--- @include "after"
local now, early = tonumber(ARGV[3]), ARGV[4] == '1'
local earliest = 0
for i = 5, #ARGV - 2, 3 do
  local child, parent, done = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local jk = k_job(child)
  local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE)
  if not f[1] then
    if early then  -- its put, on this shard, reads it (includes/after.lua check_parents)
      local ek = k_early_ends(child)
      rcall('SADD', ek, parent .. ' ' .. done)
      rcall('PEXPIRE', ek, EARLY_END_KEEP_MS)
    end
  elseif f[1] == 'held' and rcall('SREM', k_after(child), parent) == 1 then
    if done ~= '1' then
      fail_held(child, f[2], jk, now, 'held')
    elseif rcall('EXISTS', k_after(child)) == 0 then
      local due = release_held(child, f[2], jk, now)
      if due > 0 and (earliest == 0 or due < earliest) then earliest = due end
    end
  end
end
return earliest
