--[[ change_pri: give a job a new priority (change-pri), in any state.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then id, pri,
         now (ms)
Returns  1 changed | 0 no such job
Events   'reprioritized' (pri: the new priority)
Wakes    reserves blocked on the tube when the job is ready and was or is now its best job
         (the best job changed, or got a new priority)
A ready job moves in its tube's ready set and the ready_tubes index follows (index_tube), so
the next reserve takes it in its new (pri, id) place. A delayed or buried job keeps its place
(due time, bury order) and takes the priority with it when it becomes ready. A reserved job's
priority is the one it goes back with after a TTR timeout or a disconnect (release and bury
name their own).
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
local id, pri, now = ARGV[3], ARGV[4], tonumber(ARGV[5])
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_PRI)
local state, t = f[1], f[2]
if not state then return 0 end
rcall('HSET', jk, JOB_PRI, pri)
if state == 'ready' then
  local m, rk = member(id), k_ready(t)
  local was_best = rcall('ZRANK', rk, m) == 0
  rcall('ZADD', rk, pri, m)
  count_ready(f[3], -1)  -- urgent or not by its new priority
  count_ready(pri, 1)
  local meta = tube_meta(t)
  if meta[4] then  -- in its group too; the group keeps its turn (includes/groups.lua)
    local g = group_of(id)
    rcall('ZADD', k_group_ready(t, g), pri, m)
    group_place(t, g, now, meta[3])
  end
  index_tube(t, now, nil, nil, meta)
  if was_best or meta[4] or rcall('ZRANK', rk, m) == 0 then wake(t) end
end
job_event('reprioritized', id, now, 0, 0, '')
return 1
