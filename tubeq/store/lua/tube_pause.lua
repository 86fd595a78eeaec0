--[[ tube_pause: pause a tube with no end (tube-pause), or end its pause, timed or not
(tube-resume).
KEYS[1]  namespace root
ARGV     tube, mode ('pause' | 'resume'), now (ms)
Returns  1 | 0 when the tube does not exist
Wakes    resume wakes reserves blocked on the tube
A pause with no end is stored as pause_until = PAUSE_FOREVER (never reached, so index_tube
keeps the tube out of ready_tubes) and pause = 4294967295 s, the longest pause-tube can ask;
no timer is armed. gc_tube keeps such a tube while it is paused, even with no job and no user
(beanstalkd would destroy it and its pause): resume lets it go again if nothing else holds it.
pause-tube replaces either kind of pause, as a later pause-tube replaces an earlier one.
Neither mode counts in cmd-pause-tube (they are not pause-tube commands).
]]
--- @include "keys"
--- @include "jobs"
local t, mode, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local tk = k_tube(t)
if rcall('EXISTS', tk) == 0 then return 0 end
rcall('ZREM', K_TIMERS, 'p:' .. t)
if mode == 'pause' then
  rcall('HSET', tk, 'pause', 4294967295, 'pause_until', string.format('%.0f', PAUSE_FOREVER))
  index_tube(t, now)
  return 1
end
rcall('HDEL', tk, 'pause', 'pause_until')
index_tube(t, now)
wake(t)
gc_tube(t)
return 1
