-- Which ready job a connection gets: the smallest (pri, id) across its watched, non-paused
-- tubes, found through the ready_tubes index in O(min(watched tubes, ready tubes)), O(1) in the
-- usual cases (few watched tubes, or the best ready tubes watched); never a scan of the queues.

-- The best of the ready_tubes entries of `tubes` (a list of tube names), or nil: each tube's
-- entry from its meta, then, when more than one has one, their scores in one ZMSCORE.
local function best_of_tubes(tubes)
  local entries = {}
  for _, t in ipairs(tubes) do
    local entry = rcall('HGET', k_tube(t), 'ix')
    if entry then entries[#entries + 1] = entry end
  end
  if #entries <= 1 then return entries[1] end
  local scores = rcall('ZMSCORE', K_READY_TUBES, unpack(entries))
  local best, best_pri
  for i, entry in ipairs(entries) do
    local pri = tonumber(scores[i])
    if best_pri == nil or pri < best_pri or (pri == best_pri and entry < best) then
      best, best_pri = entry, pri
    end
  end
  return best
end

-- The ready_tubes entry of the job `token` would reserve now, or nil; and how many tubes it
-- watches.
local function best_entry(token)
  local wk = k_watch(token)
  -- Few watched tubes: look each one's entry up. (SCARD then SMEMBERS, not one SRANDMEMBER of
  -- 9: on a set of 100 tubes that built a dict of 9 random picks per reserve, ~7 us of Redis
  -- against SCARD's O(1), measured on a private Redis.)
  local watched = rcall('SCARD', wk)
  if watched <= 8 then return best_of_tubes(rcall('SMEMBERS', wk)), watched end
  -- Many: walk the index in (pri, id) order and take the first entry of a watched tube; a walk
  -- that has passed as many unwatched entries as there are watched tubes falls back to the
  -- lookups, so the cost stays O(min(watched, ready)). The first page is the index's head
  -- alone: a connection that watches many tubes usually watches the best one (every consumer
  -- of a pool watching the same tubes), and a page of 32 entries with scores cost ~5 us of
  -- Redis per reserve in the 100-tube bench row for 31 entries nobody read.
  local start, size, budget = 0, 1, watched
  while true do
    local page = rcall('ZRANGE', K_READY_TUBES, start, start + size - 1)
    if #page == 0 then return nil, watched end
    for _, entry in ipairs(page) do
      local _, t = split_entry(entry)
      if rcall('SISMEMBER', wk, t) == 1 then
        return entry, watched
      end
      budget = budget - 1
      if budget == 0 then return best_of_tubes(rcall('SMEMBERS', wk)), watched end
    end
    start, size = start + size, 32
  end
end

-- Reserve for `token` the job best_entry named; returns its reservation (see grant). In a
-- tube in group mode its group is served: it goes behind the others (includes/groups.lua).
local function take_entry(entry, token, now)
  local m, t = split_entry(entry)
  rcall('ZREM', k_ready(t), m)
  local meta = tube_meta(t)
  local head_member, head_pri
  if meta[4] then head_member, head_pri = group_serve(t, m, now, meta[3]) end
  local limited = index_tube(t, now, head_member, head_pri, meta)
  return grant(id_of(m), t, token, now, true, limited)
end

-- Reserve for `token`, which watches no tube but the one of `entry`, up to `n` jobs of that
-- tube in (pri, id) order, the one `entry` named first; returns their reservations one after
-- another. The tube's index entry is brought up to date once for them all, not once a job
-- (the push extension takes up to 64 at a time). A tube with reserve limits gives one job:
-- its limit is counted and checked job by job (take_entry). A tube in group mode gives its
-- jobs one by one in its groups' turns.
local function take_run(entry, token, now, n)
  local _, t = split_entry(entry)
  local meta = tube_meta(t)
  if meta[3] then return take_entry(entry, token, now) end
  if meta[4] then
    local out = {}
    for _ = 1, n do
      for _, v in ipairs(take_entry(entry, token, now)) do out[#out + 1] = v end
      entry = rcall('HGET', k_tube(t), 'ix')
      if not entry then break end
    end
    return out
  end
  -- ZRANGE then ZREMRANGEBYRANK, not ZPOPMIN: a reply without scores, which Redis would
  -- write as text ('%.17g') for nobody to read.
  local rk = k_ready(t)
  local popped = rcall('ZRANGE', rk, '0', text(n - 1))
  rcall('ZREMRANGEBYRANK', rk, '0', text(n - 1))
  index_tube(t, now, nil, nil, meta)
  local out, run = {}, {u = 0, r = 0}  -- (the pairs in its array part, the counts by name)
  for i = 1, #popped do
    for _, v in ipairs(grant(id_of(popped[i]), t, token, now, true, false, run)) do
      out[#out + 1] = v
    end
  end
  rcall('ZADD', K_RESERVED, unpack(run))
  rcall('HINCRBY', k_tube(t), 'nres', text(#run / 2))
  if run.u > 0 then rcall('HINCRBY', K_COUNTS, 'u', text(-run.u)) end
  if run.r > 0 then rcall('HINCRBY', K_COUNTS, 'r', text(-run.r)) end
  return out
end
