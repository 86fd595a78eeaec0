--[[ pause: stop reserves from taking jobs of an existing tube for `delay` seconds (0 resumes).
KEYS[1]  namespace root
ARGV     tube, delay (s), now (ms)
Returns  the pause end (ms), or -1 when delay is 0 | 0 when the tube does not exist
Wakes    delay 0 wakes reserves blocked on the tube
]]
--- @include "keys"
--- @include "jobs"
local t, delay, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local tk = k_tube(t)
if rcall('EXISTS', tk) == 0 then return 0 end
rcall('HINCRBY', tk, 'npause', 1)
if delay == 0 then
  rcall('HDEL', tk, 'pause', 'pause_until')
  rcall('ZREM', K_TIMERS, 'p:' .. t)
  index_tube(t, now)
  wake(t)
  -- A tube kept only by a pause with no end (tube_pause.lua) goes now, as with tube-resume.
  gc_tube(t)
  return -1
end
local until_ms = now + delay * 1000
rcall('HSET', tk, 'pause', ARGV[2], 'pause_until', until_ms)
rcall('ZADD', K_TIMERS, until_ms, 'p:' .. t)
index_tube(t, now)
return until_ms
