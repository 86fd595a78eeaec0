--[[ reserve: take the ready job with the smallest (pri, id) across the connection's watched,
non-paused tubes; with a count, up to that many jobs in that order (the push extension).
KEYS[1]  namespace root
ARGV     token (the connection), now (ms), count, waiter instance ('' unless the connection is counted as waiting: then a
         grant also counts it out, in the same step)
Returns  {id, ttr, body, id, ttr, body, ...} | {} when nothing is reservable
Cost     O(watched tubes that have ready jobs) via the ready_tubes index, never a scan of
         every watched tube's queue.
]]
--- @include "keys"
--- @include "jobs"
--- @include "waiting"
local token, now, count, waiter = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local wk = k_watch(token)
local best_tube, best_pri, best_member

local function consider(t, pri)
  local head = rcall('ZRANGE', k_ready(t), 0, 0)[1]
  if head and (best_pri == nil or pri < best_pri or (pri == best_pri and head < best_member)) then
    best_tube, best_pri, best_member = t, pri, head
  end
end

-- Few watched tubes: look each one up in the index. Many: walk the index best-first and stop
-- past the best priority found; a walk that has seen as many unwatched entries as there are
-- watched tubes stops and falls back to the lookups, so the cost stays O(min(watched, ready)).
local function lookup_each()
  for _, t in ipairs(rcall('SMEMBERS', wk)) do
    local score = rcall('ZSCORE', K_READY_TUBES, t)
    if score then consider(t, tonumber(score)) end
  end
end

local watched = rcall('SCARD', wk)

local function pick()
  best_tube, best_pri, best_member = nil, nil, nil
  if watched <= 8 then
    lookup_each()
  else
    local start, budget, done = 0, watched, false
    while not done do
      local page = rcall('ZRANGE', K_READY_TUBES, start, start + 31, 'WITHSCORES')
      if #page == 0 then break end
      for i = 1, #page, 2 do
        local pri = tonumber(page[i + 1])
        if best_pri and pri > best_pri then done = true break end
        if rcall('SISMEMBER', wk, page[i]) == 1 then
          consider(page[i], pri)
        else
          budget = budget - 1
          if budget == 0 and not best_pri then
            lookup_each()
            done = true
            break
          end
        end
      end
      start = start + 32
    end
  end
end

local granted = {}
for _ = 1, count do
  pick()
  if not best_tube then break end
  rcall('ZREM', k_ready(best_tube), best_member)
  index_tube(best_tube, now)
  local job = grant(id_of(best_member), best_tube, token, now)
  granted[#granted + 1] = job[1]
  granted[#granted + 1] = job[2]
  granted[#granted + 1] = job[3]
end
if #granted > 0 and waiter ~= '' then count_waiting(waiter, token, -1) end
return granted
