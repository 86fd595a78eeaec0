--[[ schedule_due: the schedules whose tick is due, for the caller to compute each one's next
due time (a cron library in Python) and run schedule_tick.
KEYS[1]  namespace root
ARGV     now (ms), limit (schedules per call)
Returns  {the earliest due time after now (ms) or -1, then per due schedule: tube, name,
         generation, due (ms), kind, spec, delay of its jobs (ms)}
]]
--- @include "keys"
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local rcall = redis.call
local later = rcall('ZRANGEBYSCORE', K_SCHEDULES, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local out = {later[2] and tonumber(later[2]) or -1}
for _, member in ipairs(rcall('ZRANGEBYSCORE', K_SCHEDULES, '-inf', now, 'LIMIT', 0, limit)) do
  local t, name = string.match(member, '^([^:]*):(.*)$')
  local f = rcall('HMGET', k_schedule(t, name), 'g', 'u', 'k', 'x', 'dm')
  if f[1] then
    out[#out + 1] = t
    out[#out + 1] = name
    for i = 1, 5 do out[#out + 1] = f[i] end
  else  -- a schedule removed under a crash's feet: nothing to tick
    rcall('ZREM', K_SCHEDULES, member)
  end
end
return out
