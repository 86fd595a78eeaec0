--[[ counters: add one process's counts of a loop tick to the shared counters.
KEYS[1]  namespace root
ARGV     n, then n pairs (stats field, delta): cmd-* and total-jobs of the server stats hash,
         then pairs (tube, delta): jobs put to that tube (its total-jobs)
Returns  1
A tube that no longer exists gets nothing: its counters went with it, as in beanstalkd.
]]
--- @include "keys"
local rcall = redis.call
local n = tonumber(ARGV[1])
for i = 2, 2 * n, 2 do
  rcall('HINCRBY', K_STATS, ARGV[i], ARGV[i + 1])
end
for i = 2 * n + 2, #ARGV, 2 do
  local tk = k_tube(ARGV[i])
  if rcall('EXISTS', tk) == 1 then
    rcall('HINCRBY', tk, 'total', ARGV[i + 1])
  end
end
return 1
