--[[ stats_tube: the counts behind a stats-tube reply, read in one consistent step.
KEYS[1]  namespace root
ARGV     tube
Returns  {} when the tube does not exist, else {urgent, ready, reserved, delayed, buried,
         total-jobs, using, watching, waiting, cmd-delete, cmd-pause-tube, pause (s),
         pause end (ms, 0 if none)}
]]
--- @include "keys"
--- @include "jobs"
--- @include "waiter_counts"
local t = ARGV[1]
local tk = k_tube(t)
if rcall('EXISTS', tk) == 0 then return {} end
local m = rcall('HMGET', tk, 'nres', 'total', 'del', 'npause', 'pause', 'pause_until')
local r = rcall('HMGET', K_REFS, 'u:' .. t, 'w:' .. t)
local function n(v) return tonumber(v or 0) end
return {
  rcall('ZCOUNT', k_ready(t), '-inf', '(1024'), rcall('ZCARD', k_ready(t)), n(m[1]),
  rcall('ZCARD', k_delayed(t)), rcall('ZCARD', k_buried(t)), n(m[2]),
  n(r[1]), n(r[2]), waiting_on(t), n(m[3]), n(m[4]), n(m[5]), n(m[6]),
}
