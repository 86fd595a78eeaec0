--[[ touch: give a reserved job a full TTR from now.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, id,
         now (ms), optionally the number of the first reserve it was pipelined behind
Returns  the new deadline (ms) | 0 not reserved by this connection | -1 deferred (see
         blocked_ahead in includes/jobs.lua) | -2 cancelled (cancel.lua): the job is gone
Events   'touched' (a cancelled job: drop_cancelled's)
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local token, id, now = ARGV[3], ARGV[4], tonumber(ARGV[5])
if blocked_ahead(token, ARGV[6]) then return DEFERRED end
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_OWNER, JOB_TTR, JOB_CANCELLED, JOB_TUBE)
if f[1] ~= 'reserved' or f[2] ~= token then return 0 end
local due = renew_hold(id, f[5], jk, f[3], f[4], now)
if due ~= CANCELLED then job_event('touched', id, now, 0, 0, '') end
return due
