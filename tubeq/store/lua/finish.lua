--[[ finish: the connection holding a reserved job says it is done, with a result: the job is
deleted as delete.lua deletes it, and its end is kept with the result for `keep` ms.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, id,
         now (ms), keep (ms: the process's --result-ttl; the job's own put-with result-ttl-ms
         wins), the result, optionally the number of the first reserve it was pipelined behind
Returns  {held, tube} finished (held as delete.lua's), {held, tube, 1} finished and its end not
         published: only this process waits for it (JOB_WAITED_BY), and hears it here | 0 not
         reserved by this connection | -1
         deferred (see blocked_ahead in includes/jobs.lua) | -2 cancelled (the job is gone,
         its result dropped)
Events   'deleted' with reason 'finished' and size (the result's bytes), as delete.lua's but
         for those two; its end published when a wait marked it
]]
--- @include "keys"
--- @include "ends"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local token, id, now, keep, result = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7]
if blocked_ahead(token, ARGV[8]) then return DEFERRED end
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_OWNER, JOB_PRI, JOB_TTR, JOB_RESERVES,
  JOB_RESERVED_AT, JOB_DEDUPE_KEY, JOB_EXPIRES_AT, JOB_WAITED, JOB_CANCELLED, JOB_RESULT_TTL,
  JOB_WAITED_BY)
local t = f[2]
if f[1] ~= 'reserved' or f[3] ~= token then return 0 end
if f[11] then
  drop_cancelled(id, t, jk, 'reserved', now)
  return CANCELLED
end
local told = f[13] == EVENTS_BY
end_job(id, t, 'finished', result, now, f[12] or keep, f[10], nil, told)
unlink(id, t, 'reserved', now)
forget_job(id, jk, {f[8], f[9]})
rcall('DEL', jk)
rcall('HINCRBY', k_tube(t), 'del', '1')
rcall('HINCRBY', k_tube(t), 'nfin', '1')
add_event('deleted', id, t, f[4], 0, f[5], 0, f[6], now, 'finished', #result)
gc_tube(t)
local held = f[7] and now - f[7] or -1
if told then return {held, t, 1} end
return {held, t}
