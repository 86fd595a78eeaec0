--[[ reserve: take the ready job with the smallest (pri, id) across the connection's watched,
non-paused tubes; with a count, up to that many jobs in that order (the push extension).
Jobs a put already handed to this connection while it waited (put.lua) come first.
KEYS[1]  namespace root
ARGV     token (the connection), now (ms), count, waiter instance ('' unless the connection is
         counted as waiting: then a grant also counts it out, in the same step)
Returns  {id, ttr, body, id, ttr, body, ...} | {} when nothing is reservable
Cost     see includes/picking.lua
]]
--- @include "keys"
--- @include "jobs"
--- @include "waiting"
--- @include "picking"
local token, now, count, waiter = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local granted = claim_handed(token, count)
while #granted < 3 * count do
  local entry = best_entry(token)
  if not entry then break end
  local job = take_entry(entry, token, now)
  granted[#granted + 1] = job[1]
  granted[#granted + 1] = job[2]
  granted[#granted + 1] = job[3]
end
if #granted > 0 and waiter ~= '' then count_waiting(waiter, token, -1) end
return granted
