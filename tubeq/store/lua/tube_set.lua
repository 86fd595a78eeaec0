--[[ tube_set: change a tube's settings (tubeq.model.options.TUBE_SETTINGS), all or none.
KEYS[1]  namespace root
ARGV     tube, now (ms), then (name, value) pairs; a value equal to the setting's default
         ('0', or 'bury' for on-expire) removes the setting
Returns  1
Wakes    reserves blocked on the tube when its reserve limits (rate, concurrency,
         group-concurrency, group-rate) changed
Settings live in their own hash (k_settings), not in the tube's: a tube vanishes when nothing
references it (gc_tube), its settings stay and apply again when it reappears.
The scripts that enforce a setting read it from k_settings when they run, so a change applies
at once to the jobs already in the tube, on every process.
]]
--- @include "keys"
--- @include "jobs"
local t, now = ARGV[1], tonumber(ARGV[2])
local sk = k_settings(t)
local limits_changed = false
for i = 3, #ARGV, 2 do
  local name, value = ARGV[i], ARGV[i + 1]
  if value == '0' or (name == 'on-expire' and value == 'bury') then
    redis.call('HDEL', sk, name)
  else
    redis.call('HSET', sk, name, value)
  end
  if name == 'rate' or name == 'concurrency' or name == 'group-concurrency'
      or name == 'group-rate' then
    limits_changed = true
  end
end
-- Reserve limits apply at once: the tube is re-indexed (held or released) and its waiters woken;
-- in group mode every group is placed again (includes/groups.lua).
if limits_changed and redis.call('EXISTS', k_tube(t)) == 1 then
  sync_limit_flag(t)
  local meta = tube_meta(t)
  if meta[4] then regroup(t, now, meta[3]) end
  index_tube(t, now, nil, nil, meta)
  wake(t)
end
return 1
