--[[ delete: remove a job in any state; a reserved job only by the connection holding it.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, id,
         now (ms), optionally the number of the first reserve it was pipelined behind
Returns  {held, tube} deleted, where held is how long (ms) the caller had held the job since it
         reserved it ('ra'; -1 when the job was not reserved): tubeq.store.store reads it for the
         reserved->deleted metric | 0 not found (or reserved by another connection) | -1
         deferred (see blocked_ahead in includes/jobs.lua)
Events   'deleted'; its end kept and published when a wait marked it (includes/ends.lua)
]]
--- @include "keys"
--- @include "ends"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local token, id, now = ARGV[3], ARGV[4], tonumber(ARGV[5])
if blocked_ahead(token, ARGV[6]) then return DEFERRED end
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_OWNER, JOB_PRI, JOB_TTR, JOB_RESERVES,
  JOB_RESERVED_AT, JOB_DEDUPE_KEY, JOB_EXPIRES_AT, JOB_WAITED, JOB_CANCELLED)
local state, t = f[1], f[2]
if not state or (state == 'reserved' and f[3] ~= token) then return 0 end
-- its holder's delete is beanstalkd's "done": a child put after it runs (includes/after.lua),
-- unless it was cancelled meanwhile
if f[10] then end_job(id, t, 'deleted', '', now, nil, f[10], state == 'reserved' and not f[11]) end
unlink(id, t, state, now)
forget_job(id, jk, {f[8], f[9]})  -- its dedupe key is free, its TTL entry goes (policies)
rcall('DEL', jk)
rcall('HINCRBY', k_tube(t), 'del', '1')
add_event('deleted', id, t, f[4], 0, f[5], 0, f[6], now, '')
gc_tube(t)
if state == 'reserved' and f[7] then return {now - f[7], t} end
return {-1, t}
