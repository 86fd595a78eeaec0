--[[ clear_tube: delete a tube's jobs in the given states (clear-tube), one batch per call.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then tube,
         states (letters: r ready, d delayed, b buried, h held, in the order to clear them),
         limit (jobs deleted per call at most), now (ms)
Returns  {deleted by this call, 1 when those states are now empty else 0}, or {-1, 1} when the
         tube does not exist
Events   'deleted' per job, reason 'cleared'
Reserved jobs are never cleared: a worker holds them, and its delete/release/bury would then
answer NOT_FOUND for a job it was given. The caller repeats the call until the second value is
1, so one call never holds Redis for more than `limit` jobs (like promote and expire).
Wakes    nobody: clearing makes no job ready.
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local t, states, limit, now = ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
if rcall('EXISTS', k_tube(t)) == 0 then return {-1, 1} end
local sets = {r = k_ready, d = k_delayed, b = k_buried, h = k_held}
local deleted, left = 0, 0
for i = 1, #states do
  local letter = string.sub(states, i, i)
  local key = sets[letter](t)
  if deleted < limit then
    local members = rcall('ZRANGE', key, 0, limit - deleted - 1)
    if #members > 0 then  -- K_COUNTS: the first members of a ready set are its most urgent
      if letter == 'r' then
        local urgent = math.min(#members, rcall('ZCOUNT', key, '-inf', '(' .. URGENT_BELOW))
        count_in('u', -urgent)
        count_in('r', urgent - #members)
      else
        count_in(letter, -#members)
      end
    end
    local grouped = letter == 'r' and rcall('HEXISTS', k_tube(t), 'grp') == 1
    local groups = {}  -- group -> its members cleared here (includes/groups.lua)
    for _, m in ipairs(members) do
      local id = id_of(m)
      local f = rcall('HMGET', k_job(id), JOB_WAITED, JOB_GROUP)
      local waited = f[1]
      if grouped then
        local g = f[2] or ''
        groups[g] = groups[g] or {}
        table.insert(groups[g], m)
      end
      if waited then end_job(id, t, 'deleted', '', now, nil, waited) end
      job_event('deleted', id, now, 0, 0, 'cleared')
      forget_job(id, k_job(id))  -- its dedupe key is free, its TTL entry goes (as delete.lua)
      if letter == 'h' then
        rcall('DEL', k_after(id))
        rcall('HINCRBY', k_tube(t), 'nheld', -1)
      end
      rcall('DEL', k_job(id))
    end
    if #members > 0 then
      rcall('ZREM', key, unpack(members))
      deleted = deleted + #members
      if letter == 'r' then
        local limited = grouped and rcall('HEXISTS', k_tube(t), 'lim') == 1
        for g, gm in pairs(groups) do
          rcall('ZREM', k_group_ready(t, g), unpack(gm))
          group_place(t, g, now, limited)
        end
        index_tube(t, now)
      elseif letter == 'd' then
        arm_delay_timer(t)
      end
    end
  end
  left = left + rcall('ZCARD', key)
end
if left == 0 then gc_tube(t) end
return {deleted, left == 0 and 1 or 0}
