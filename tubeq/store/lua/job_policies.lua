--[[ job_policies: the policy keys stats-job shows to a tubeq client, read in one step.
KEYS[1]  namespace root
ARGV     job id
Returns  {} when the job does not exist, else {reason ('' | 'max-tries' | 'expired'), tries,
         max tries (its own, else its tube's now; 0: none), expires at (ms; 0: none pending),
         dedupe key ('' if none), failures (fail.lua), the last error ('' if none), progress
         reports (progress.lua), the latest one ('' if none), parents still to finish (a held
         job: includes/after.lua), its traceparent (put-with; '' if none)}
]]
--- @include "keys"
local f = redis.call('HMGET', k_job(ARGV[1]), JOB_TUBE, JOB_BURIED_FOR, JOB_TRIES, JOB_MAX_TRIES,
  JOB_EXPIRES_AT, JOB_DEDUPE_KEY, JOB_FAILURES, JOB_ERROR, JOB_PROGRESS_SEQ, JOB_PROGRESS,
  JOB_TRACEPARENT)
if not f[1] then return {} end
local max_tries = f[4] or redis.call('HGET', k_settings(f[1]), 'max-tries') or 0
return {f[2] or '', tonumber(f[3] or 0), tonumber(max_tries), tonumber(f[5] or 0), f[6] or '',
  tonumber(f[7] or 0), f[8] or '', tonumber(f[9] or 0), f[10] or '',
  redis.call('SCARD', k_after(ARGV[1])), f[11] or ''}
