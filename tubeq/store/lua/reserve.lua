--[[ reserve: take the ready job with the smallest (pri, id) across the connection's watched,
non-paused tubes; with a count, up to that many jobs in that order (the push extension).
Jobs a put already handed to this connection while it waited (put.lua) come first.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token (the
         connection), now (ms), count, waiter instance ('' unless the connection is counted as
         waiting: then a grant also counts it out, in the same step; '+' and the instance:
         the push extension's take, which also counts the connection in as waiting when it
         finds nothing, in the same step, in mode 'p': see includes/waiter_counts.lua; '='
         and the instance: a blocked reserve's try, which does the same in mode '1'),
         optionally the
         reserve's number on its connection (its first try: one that finds nothing records
         it, see blocked_ahead in includes/jobs.lua) and then 'each': the call is the first
         try of `count` pipelined reserves of one job each, the given number the last one's,
         recorded when fewer than `count` jobs were granted
Returns  reservations one after another: {id, ttr, body, waited (ms ready), tube, id, ...}
         (see grant in includes/jobs.lua) | {} when nothing is reservable
Events   'reserved' per job taken here (a job a put handed over had its event then)
Cost     see includes/picking.lua
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "waiter_counts"
--- @include "picking"
local token, now, count, waiter = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local granted = claim_handed(token, count)
while #granted < 5 * count do
  local entry, watched = best_entry(token)
  if not entry then break end
  local left = count - #granted / 5
  local taken = (watched == 1 and left > 1) and take_run(entry, token, now, left)
    or take_entry(entry, token, now)
  for _, v in ipairs(taken) do granted[#granted + 1] = v end
end
local staying = string.sub(waiter, 1, 1)
if staying == '+' or staying == '=' then  -- a staying take: counted in iff it got nothing
  count_waiting(string.sub(waiter, 2), token, #granted == 0 and 1 or -1,
    staying == '+' and 'p' or '1')
elseif #granted > 0 and waiter ~= '' then
  count_waiting(waiter, token, -1)
end
if ARGV[7] and (#granted == 0 or (ARGV[8] and #granted < 5 * count)) then
  rcall('SET', k_blocked(token), ARGV[7], 'PX', BLOCKED_TTL_MS)
end
return granted
