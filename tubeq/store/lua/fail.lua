--[[ fail: the connection holding a reserved job says it failed, with an error text: the job
keeps the error (the last one) and counts the failure, then follows its policies as a TTR
timeout does: buried with reason 'max-tries' when its tries run out, expired past its TTL,
else back to ready, or delayed by its backoff (put-with backoff-ms, or its tube's). The fail's
own options (max-tries, backoff-ms, backoff-max-ms: the worker's defaults) apply where neither
the job nor its tube sets one.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, id,
         now (ms), the error, the number of the first reserve it was pipelined behind (0:
         none), then (option name, value) pairs (tubeq.model.options.FAIL_OPTIONS)
Returns  {'ready', 0} | {'delayed', due (ms)} | {'taken', 0} (buried or expired by a policy; its
         end kept for waiters) | {'cancelled', 0} (cancel.lua: the job is gone) | 0 not
         reserved by this connection | -1 deferred
Events   'failed' (the failure itself: error, its head as includes/events.lua's error_excerpt
         keeps it; size, the whole error's bytes; failures, the job's count with this one;
         tries), then the job's move: 'released' with reason 'failed' (delay_ms and due_ms set
         when delayed), or the policy's 'buried' / 'expired'
Wakes    reserves blocked on the tube when the job is ready
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local token, id, now, err = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local worker = #ARGV > 7 and put_options(8)
if blocked_ahead(token, ARGV[7]) then return DEFERRED end
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_OWNER, JOB_CANCELLED, JOB_PRI, JOB_TTR,
  JOB_RESERVES)
if f[1] ~= 'reserved' or f[3] ~= token then return 0 end
local t = f[2]
if f[4] then
  drop_cancelled(id, t, jk, 'reserved', now)
  return {'cancelled', 0}
end
rcall('HSET', jk, JOB_ERROR, err)
local failures = rcall('HINCRBY', jk, JOB_FAILURES, 1)
rcall('HINCRBY', k_tube(t), 'nfail', 1)
if EVENTS_MAXLEN ~= 0 then
  add_event('failed', id, t, f[5], 0, f[6], 0, f[7], now, '', #err, error_excerpt(err), failures)
end
local taken, delay_ms = end_try(id, t, jk, now, 'timeout', worker)
if taken then return {'taken', 0} end
unlink(id, t, 'reserved', now)
rcall('HDEL', jk, JOB_OWNER)
if delay_ms > 0 then
  local due = now + delay_ms
  rcall('HSET', jk, JOB_STATE, 'delayed', JOB_DUE, due)
  enqueue_delayed(id, t, due)
  job_event('released', id, now, delay_ms, due, 'failed')
  return {'delayed', due}
end
rcall('HSET', jk, JOB_STATE, 'ready', JOB_READY_SINCE, now)
rcall('HDEL', jk, JOB_DUE)
enqueue_ready(id, t, tonumber(rcall('HGET', jk, JOB_PRI)), now)
job_event('released', id, now, 0, 0, 'failed')
wake(t)
return {'ready', 0}
