--[[ promote: fire due tube timers: delayed jobs whose time has come become ready, pauses
that have ended resume, and tubes held by their rate limit come back when its window ends
(timer 'l:<tube>', see includes/limits.lua).
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then now (ms),
         limit (jobs and timers handled per call)
Also     the TTL sweep when the timer 'x:' is due (includes/policies.lua): jobs past their TTL
         are buried (reason 'expired') or deleted (event 'expired')
Returns  {next due (ms) or -1, {tube woken, ...}, {lateness (ms), ...}}; a next due <= now
         means call again. Lateness: now - due time, one per job made ready (tubeq.store.store feeds
         it to the delayed-lateness metric; it costs no read: 'u' is read for the event anyway)
Events   'promoted' per job (due_ms: the time it was due)
Wakes    reserves blocked on each tube that got ready jobs
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local now, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local result, woken, late = {-1}, {}, {}
for _, name in ipairs(rcall('ZRANGEBYSCORE', K_TIMERS, '-inf', now, 'LIMIT', 0, limit)) do
  local t = string.sub(name, 3)
  local kind = string.sub(name, 1, 1)
  if kind == 'x' then
    sweep_ttl(now, limit)  -- expired jobs never become ready: nothing to wake
  elseif kind == 'd' then
    local dk = k_delayed(t)
    for _, m in ipairs(rcall('ZRANGEBYSCORE', dk, '-inf', now, 'LIMIT', 0, limit)) do
      local id = id_of(m)
      local jk = k_job(id)
      local f = rcall('HMGET', jk, JOB_PRI, JOB_DUE)
      count_in('d', -rcall('ZREM', dk, m))
      rcall('HSET', jk, JOB_STATE, 'ready', JOB_READY_SINCE, now)
      rcall('HDEL', jk, JOB_DUE)
      enqueue_ready(id, t, tonumber(f[1]), now)
      job_event('promoted', id, now, 0, f[2], '')
      late[#late + 1] = now - tonumber(f[2])
    end
    arm_delay_timer(t)
  elseif string.sub(name, 1, 1) == 'l' then  -- a rate window ended (the tube's or a group's)
    rcall('ZREM', K_TIMERS, name)
    local meta = tube_meta(t)
    if meta[4] and meta[3] then regroup(t, now, true) end
    index_tube(t, now, nil, nil, meta)
  else
    rcall('HDEL', k_tube(t), 'pause', 'pause_until')
    rcall('ZREM', K_TIMERS, name)
    index_tube(t, now)
  end
  if kind ~= 'x' then
    wake(t)
    woken[#woken + 1] = t
  end
end
local head = rcall('ZRANGE', K_TIMERS, 0, 0, 'WITHSCORES')
if head[1] then result[1] = tonumber(head[2]) end
result[2], result[3] = woken, late
return result
