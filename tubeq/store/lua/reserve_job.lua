--[[ reserve_job: reserve one job by id, from ready, delayed or buried, in any tube.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, id,
         now (ms)
Returns  {id, ttr, body, waited, tube} (see grant; waited -1 unless the job was ready) | {}
         when the job is missing, already reserved or held (its parents come first)
Events   'reserved'
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
local token, id, now = ARGV[3], ARGV[4], tonumber(ARGV[5])
local f = rcall('HMGET', k_job(id), JOB_STATE, JOB_TUBE)
local state, t = f[1], f[2]
if not state or state == 'reserved' or state == 'held' then return {} end
if state == 'ready' then  -- grant counts it out of ready
  local m = member(id)
  rcall('ZREM', k_ready(t), m)
  local meta = tube_meta(t)
  if meta[4] then group_remove(t, group_of(id), m, now, meta[3]) end  -- its group keeps its turn
  index_tube(t, now, nil, nil, meta)
else
  unlink(id, t, state, now)
end
return grant(id, t, token, now, state == 'ready')
