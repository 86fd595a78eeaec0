--[[ promote: fire due tube timers: delayed jobs whose time has come become ready, pauses
that have ended resume, and tubes held by their rate limit come back when its window ends
(timer 'l:<tube>', see includes/limits.lua).
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then now (ms),
         limit (jobs and timers handled per call)
Returns  {next due (ms) or -1, tube woken, ...}; a next due <= now means call again
Events   'promoted' per job (due_ms: the time it was due)
Wakes    reserves blocked on each tube that got ready jobs
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
local now, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local result = {-1}
for _, name in ipairs(rcall('ZRANGEBYSCORE', K_TIMERS, '-inf', now, 'LIMIT', 0, limit)) do
  local t = string.sub(name, 3)
  if string.sub(name, 1, 1) == 'd' then
    local dk = k_delayed(t)
    for _, m in ipairs(rcall('ZRANGEBYSCORE', dk, '-inf', now, 'LIMIT', 0, limit)) do
      local id = id_of(m)
      local jk = k_job(id)
      local f = rcall('HMGET', jk, 'p', 'u')
      rcall('ZREM', dk, m)
      rcall('HSET', jk, 's', 'ready')
      rcall('HDEL', jk, 'u')
      enqueue_ready(id, t, tonumber(f[1]), now)
      job_event('promoted', id, now, 0, f[2], '')
    end
    arm_delay_timer(t)
  elseif string.sub(name, 1, 1) == 'l' then  -- a rate window ended
    rcall('ZREM', K_TIMERS, name)
    index_tube(t, now)
  else
    rcall('HDEL', k_tube(t), 'pause', 'pause_until')
    rcall('ZREM', K_TIMERS, name)
    index_tube(t, now)
  end
  wake(t)
  result[#result + 1] = t
end
local head = rcall('ZRANGE', K_TIMERS, 0, 0, 'WITHSCORES')
if head[1] then result[1] = tonumber(head[2]) end
return result
