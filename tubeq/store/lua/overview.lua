--[[ overview: the first tubes' job counts in one consistent read, and the rest summed from the
namespace's counts, for /metrics, the HTTP API and the dashboard; changes nothing.
KEYS[1]  namespace root
ARGV     limit: the first `limit` tubes in creation order get a row of their own; the others
         are summed into one last row named '' (present only when there are others)
Returns  {tube count, then rows of 12: name, urgent, ready, reserved, delayed, buried,
         total-jobs, cmd-delete, pause end (ms, 0 if none), waiting, watching, using}.
         The summed row's job counts are the namespace's (K_COUNTS, ZCARD of K_RESERVED, the
         total-jobs counter) less the rows above it, so its total-jobs also counts jobs put to
         tubes that no longer exist; its cmd-delete, pause, waiting, watching and using are 0
         (not summed: that would read every tube)
Cost     O(limit), and per listed tube O(its lines of waiters: includes/waiter_counts.lua)
]]
--- @include "keys"
--- @include "jobs"
--- @include "waiter_counts"
local limit = tonumber(ARGV[1])
local count = rcall('ZCARD', K_TUBES)
local out = {count}
local listed = {0, 0, 0, 0, 0, 0}  -- urgent, ready, reserved, delayed, buried, total
for _, t in ipairs(rcall('ZRANGE', K_TUBES, 0, limit - 1)) do
  local m = rcall('HMGET', k_tube(t), 'nres', 'total', 'del', 'pause_until')
  local q = rcall('HMGET', K_REFS, 'w:' .. t, 'u:' .. t)
  local row = {
    rcall('ZCOUNT', k_ready(t), '-inf', '(' .. URGENT_BELOW), rcall('ZCARD', k_ready(t)),
    tonumber(m[1] or 0), rcall('ZCARD', k_delayed(t)), rcall('ZCARD', k_buried(t)),
    tonumber(m[2] or 0), tonumber(m[3] or 0), tonumber(m[4] or 0),
    waiting_on(t), tonumber(q[1] or 0), tonumber(q[2] or 0),
  }
  out[#out + 1] = t
  for i, v in ipairs(row) do
    out[#out + 1] = v
    if i <= 6 then listed[i] = listed[i] + v end
  end
end
if count > limit then
  local c = rcall('HMGET', K_COUNTS, 'u', 'r', 'd', 'b')
  local urgent = tonumber(c[1] or 0)
  local whole = {urgent, urgent + tonumber(c[2] or 0), rcall('ZCARD', K_RESERVED),
                 tonumber(c[3] or 0), tonumber(c[4] or 0),
                 tonumber(rcall('HGET', K_STATS, 'total-jobs') or 0)}
  out[#out + 1] = ''
  for i = 1, 6 do out[#out + 1] = whole[i] - listed[i] end
  for _ = 7, 11 do out[#out + 1] = 0 end
end
return out
