--[[ progress: the connection holding a reserved job reports its progress: the job keeps the
latest (and counts them), gets a full TTR from now as touch gives it, and a wait that marked it
is told (its id on the ended channel: the waits read, and those that asked for progress answer).
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, id,
         now (ms), the progress data, optionally the number of the first reserve it was
         pipelined behind
Returns  the new deadline (ms) | 0 not reserved by this connection | -1 deferred | -2 cancelled
         (cancel.lua): the job is gone
Events   'touched' with reason 'progress'
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local token, id, now, data = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
if blocked_ahead(token, ARGV[7]) then return DEFERRED end
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_OWNER, JOB_TTR, JOB_CANCELLED, JOB_TUBE, JOB_WAITED)
if f[1] ~= 'reserved' or f[2] ~= token then return 0 end
local due = renew_hold(id, f[5], jk, f[3], f[4], now)
if due == CANCELLED then return due end
rcall('HSET', jk, JOB_PROGRESS, data)
rcall('HINCRBY', jk, JOB_PROGRESS_SEQ, 1)
job_event('touched', id, now, 0, 0, 'progress')
if f[6] then rcall('PUBLISH', K_ENDED, text(id)) end
return due
