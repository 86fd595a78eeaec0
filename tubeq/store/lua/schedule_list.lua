--[[ schedule_list: a tube's schedules, by name, read in one consistent step.
KEYS[1]  namespace root
ARGV     tube
Returns  {name, kind, spec, pri, ttr (s), delay (ms), body size, next due (ms), ticks done,
         last tick's due (ms, 0 if none), last job id (0 if none), ...} sorted by name
]]
--- @include "keys"
local t = ARGV[1]
local names = redis.call('SMEMBERS', k_schedule_names(t))
table.sort(names)
local out = {}
for _, name in ipairs(names) do
  local sk = k_schedule(t, name)
  local f = redis.call('HMGET', sk, 'k', 'x', 'p', 'r', 'dm', 'u', 'n', 'lt', 'lj')
  out[#out + 1] = name
  out[#out + 1] = f[1]
  out[#out + 1] = f[2]
  for i = 3, 5 do out[#out + 1] = tonumber(f[i]) end
  out[#out + 1] = redis.call('HSTRLEN', sk, 'b')
  for i = 6, 9 do out[#out + 1] = tonumber(f[i] or 0) end
end
return out
