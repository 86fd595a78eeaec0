--[[ counters: add one process's command counts to the shared counters.
KEYS[1]  namespace root
ARGV     pairs (stats field, delta): the cmd-* fields of the server stats hash
Returns  1
(total-jobs is not among them: the scripts that store jobs count it, includes/jobs.lua.)
]]
--- @include "keys"
local rcall = redis.call
for i = 1, #ARGV, 2 do
  rcall('HINCRBY', K_STATS, ARGV[i], ARGV[i + 1])
end
return 1
