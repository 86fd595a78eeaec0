--[[ expire: reservations past their TTR go back to ready (timeouts + 1), whoever held them,
even when the holding connection is idle.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then now (ms),
         limit (jobs per call)
Returns  {next deadline (ms) or -1, tube woken, ...}; a next deadline <= now means call again
         (the next deadline is also the earliest retry a backoff delayed here)
Events   'timed-out' per job (reason ''; with delay_ms and due_ms when a backoff delays it);
         'buried' (reason 'max-tries' | 'expired') or 'expired' instead when a policy takes
         the job (includes/policies.lua)
Wakes    reserves blocked on each tube
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local now, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local result = {-1}
local woken = {}
local retry_due = false  -- the earliest retry a backoff delayed
for _, m in ipairs(rcall('ZRANGEBYSCORE', K_RESERVED, '-inf', now, 'LIMIT', 0, limit)) do
  local id = id_of(m)
  local jk = k_job(id)
  local t = rcall('HGET', jk, JOB_TUBE)
  rcall('HINCRBY', jk, JOB_TIMEOUTS, 1)
  rcall('HINCRBY', K_STATS, 'job-timeouts', 1)
  local fate = retry(id, t, now, '')  -- policies first (includes/policies.lua)
  if fate ~= 'ready' then
    if fate and (not retry_due or fate < retry_due) then retry_due = fate end
  elseif not woken[t] then
    woken[t] = true
    result[#result + 1] = t
  end
end
for i = 2, #result do wake(result[i]) end
local head = rcall('ZRANGE', K_RESERVED, 0, 0, 'WITHSCORES')
if head[1] then result[1] = tonumber(head[2]) end
if retry_due and (result[1] < 0 or retry_due < result[1]) then result[1] = retry_due end
return result
