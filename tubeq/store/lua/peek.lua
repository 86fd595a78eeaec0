--[[ peek: the next job of a tube in one state, without changing anything.
KEYS[1]  namespace root
ARGV     which ('ready' | 'delayed' | 'buried'), tube
Returns  {id, body} | {} (ready: smallest (pri, id), in a tube in group mode the job a
         reserve would take; delayed: soonest due, then id; buried: first buried)
]]
--- @include "keys"
--- @include "jobs"
local key_of = {ready = k_ready, delayed = k_delayed, buried = k_buried}
local m
-- A tube in group mode: the job a reserve would take (includes/groups.lua), else its best.
if ARGV[1] == 'ready' and rcall('HEXISTS', k_tube(ARGV[2]), 'grp') == 1 then
  m = group_head(ARGV[2])[1]
end
m = m or rcall('ZRANGE', key_of[ARGV[1]](ARGV[2]), 0, 0)[1]
if not m then return {} end
local id = id_of(m)
return {tonumber(id), rcall('HGET', k_job(id), JOB_BODY)}
