--[[ reserve: take the ready job with the smallest (pri, id) across the connection's watched,
non-paused tubes; with a count, up to that many jobs in that order (the push extension).
KEYS[1]  namespace root
ARGV     token (the connection), now (ms), count, waiter instance ('' unless the connection is counted as waiting: then a
         grant also counts it out, in the same step)
Returns  {id, ttr, body, id, ttr, body, ...} | {} when nothing is reservable
Cost     O(min(watched tubes, ready tubes)) via the ready_tubes index, O(1) in the usual
         cases (few watched tubes, or the best ready tubes watched), never a scan of the queues.
]]
--- @include "keys"
--- @include "jobs"
--- @include "waiting"
local token, now, count, waiter = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local wk = k_watch(token)
local best_pri, best_entry

local function consider(entry, pri)
  if best_pri == nil or pri < best_pri or (pri == best_pri and entry < best_entry) then
    best_pri, best_entry = pri, entry
  end
end

-- Few watched tubes: look each one's entry up. Many: walk the index in (pri, id) order and
-- take the first entry of a watched tube; a walk that has passed as many unwatched entries as
-- there are watched tubes falls back to the lookups, so the cost stays O(min(watched, ready)).
local function lookup_each()
  for _, t in ipairs(rcall('SMEMBERS', wk)) do
    local entry = rcall('HGET', k_tube(t), 'ix')
    if entry then consider(entry, tonumber(rcall('ZSCORE', K_READY_TUBES, entry))) end
  end
end

local watched = rcall('SCARD', wk)

local function pick()
  best_pri, best_entry = nil, nil
  if watched <= 8 then
    lookup_each()
    return
  end
  local start, budget = 0, watched
  while true do
    local page = rcall('ZRANGE', K_READY_TUBES, start, start + 31, 'WITHSCORES')
    if #page == 0 then return end
    for i = 1, #page, 2 do
      local _, t = split_entry(page[i])
      if rcall('SISMEMBER', wk, t) == 1 then
        consider(page[i], tonumber(page[i + 1]))
        return
      end
      budget = budget - 1
      if budget == 0 then
        lookup_each()
        return
      end
    end
    start = start + 32
  end
end

local granted = {}
for _ = 1, count do
  pick()
  if not best_entry then break end
  local m, t = split_entry(best_entry)
  rcall('ZREM', k_ready(t), m)
  index_tube(t, now)
  local job = grant(id_of(m), t, token, now)
  granted[#granted + 1] = job[1]
  granted[#granted + 1] = job[2]
  granted[#granted + 1] = job[3]
end
if #granted > 0 and waiter ~= '' then count_waiting(waiter, token, -1) end
return granted
