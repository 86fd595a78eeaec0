--[[ schedule_add: create a tube's recurring schedule, or replace the one of that name.
KEYS[1]  namespace root
ARGV     tube, name, kind ('cron' | 'every-ms'), spec (the cron expression | the interval, ms),
         pri, ttr (s), delay (ms), body, first due (ms, computed by the caller: Lua cannot run a
         cron library), now (ms)
Returns  {first due (ms), 1 created | 0 replaced}
Tells    every process's scheduler of the due time (K_DUE_CHANNEL)
A schedule is a hash (k_schedule): 'k' kind, 'x' spec, 'p' pri, 'r' ttr, 'dm' delay (ms),
'b' body, 'u' its next due (ms), 'g' generation (bumped by every add, so a tick computed for
the definition it replaced is refused), 'n' ticks done, 'lt' the last tick's due time, 'lj' the
last job it put, 'c' created (ms). Its next due is also its score in K_SCHEDULES. Schedules do
not make their tube exist (the first tick does) and outlive it, as its settings do.
]]
--- @include "keys"
local rcall = redis.call
local t, name, due, now = ARGV[1], ARGV[2], ARGV[9], ARGV[10]
local sk = k_schedule(t, name)
local created = rcall('EXISTS', sk) == 0
if created then
  rcall('HSET', sk, 'c', now, 'n', 0)
  rcall('SADD', k_schedule_names(t), name)
end
rcall('HDEL', sk, 'x')
rcall('HSET', sk, 'k', ARGV[3], 'x', ARGV[4], 'p', ARGV[5], 'r', ARGV[6], 'dm', ARGV[7],
  'b', ARGV[8], 'u', due)
rcall('HINCRBY', sk, 'g', 1)
rcall('ZADD', K_SCHEDULES, due, t .. ':' .. name)
rcall('PUBLISH', K_DUE_CHANNEL, due)
return {tonumber(due), created and 1 or 0}
