--[[ hand_back: the holder gives a reserved job back because it is shutting down (a consumer
stopping, a deploy): ready at once at its own priority, and its try is not counted (no
'tries' for max-tries, no backoff, no 'releases'); past its TTL it expires as after any try.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, id,
         now (ms)
Returns  1 handed back | 3 expired instead (past its TTL) | 0 not reserved by this connection |
         CANCELLED (it was cancelled while held: gone now, as at any end of its reservation)
Events   'released' with reason 'hand-back' (or the TTL's 'expired' / 'buried')
Wakes    reserves blocked on the tube
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local token, id, now = ARGV[3], ARGV[4], tonumber(ARGV[5])
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_OWNER, JOB_PRI, JOB_CANCELLED)
if f[1] ~= 'reserved' or f[3] ~= token then return 0 end
local t = f[2]
if f[5] then
  drop_cancelled(id, t, jk, 'reserved', now)
  return CANCELLED
end
if expire_if_past_ttl(id, t, jk, now) then return 3 end
unlink(id, t, 'reserved', now)
rcall('HSET', jk, JOB_STATE, 'ready', JOB_READY_SINCE, now)
rcall('HDEL', jk, JOB_OWNER, JOB_DUE)
enqueue_ready(id, t, tonumber(f[4]), now)
job_event('released', id, now, 0, 0, 'hand-back')
wake(t)
return 1
