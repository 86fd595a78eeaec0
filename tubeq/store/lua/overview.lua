--[[ overview: every tube's job counts in one consistent read, for /metrics, the HTTP API and the
dashboard; changes nothing.
KEYS[1]  namespace root
ARGV     limit: the first `limit` tubes in creation order get a row of their own; the others
         are summed into one last row named '' (present only when there are others)
Returns  {tube count, then rows of 12: name, urgent, ready, reserved, delayed, buried,
         total-jobs, cmd-delete, pause end (ms, 0 if none; 0 in the summed row), waiting,
         watching, using}
Cost     O(tubes): called by a scrape or a page refresh, never on a command's path
]]
--- @include "keys"
local rcall = redis.call
local limit = tonumber(ARGV[1])
local tubes = rcall('ZRANGE', K_TUBES, 0, -1)
local out = {#tubes}
local rest = false
for i, t in ipairs(tubes) do
  local m = rcall('HMGET', k_tube(t), 'nres', 'total', 'del', 'pause_until')
  local r = rcall('HMGET', K_REFS, 'q:' .. t, 'w:' .. t, 'u:' .. t)
  local row = {
    rcall('ZCOUNT', k_ready(t), '-inf', '(1024'), rcall('ZCARD', k_ready(t)),
    tonumber(m[1] or 0), rcall('ZCARD', k_delayed(t)), rcall('ZCARD', k_buried(t)),
    tonumber(m[2] or 0), tonumber(m[3] or 0), tonumber(m[4] or 0),
    tonumber(r[1] or 0), tonumber(r[2] or 0), tonumber(r[3] or 0),
  }
  if i <= limit then
    out[#out + 1] = t
    for _, v in ipairs(row) do out[#out + 1] = v end
  else
    if not rest then rest = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} end
    for j, v in ipairs(row) do
      if j ~= 8 then rest[j] = rest[j] + v end
    end
  end
end
if rest then
  out[#out + 1] = ''
  for _, v in ipairs(rest) do out[#out + 1] = v end
end
return out
