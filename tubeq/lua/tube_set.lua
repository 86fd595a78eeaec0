--[[ tube_set: change a tube's settings (tubeq.options.TUBE_SETTINGS), all or none.
KEYS[1]  namespace root
ARGV     tube, then (name, value) pairs; a value equal to the setting's default ('0', or
         'bury' for on-expire) removes the setting
Returns  1
Settings live in their own hash (k_settings), not in the tube's: a tube vanishes when nothing
references it (gc_tube), its settings stay and apply again when it reappears.
The scripts that enforce a setting read it from k_settings when they run, so a change applies
at once to the jobs already in the tube, on every process.
]]
--- @include "keys"
local t = ARGV[1]
local sk = k_settings(t)
for i = 2, #ARGV, 2 do
  local name, value = ARGV[i], ARGV[i + 1]
  if value == '0' or (name == 'on-expire' and value == 'bury') then
    redis.call('HDEL', sk, name)
  else
    redis.call('HSET', sk, name, value)
  end
end
return 1
