-- Tube references, counted per process instance and in total, so a dead instance's share can
-- be taken back by reap.lua. Watching is per connection (its watch set); using is per process:
-- each process keeps its own count of connections using a tube and sends it in batches.

-- A connection starts or stops watching a tube ('+w' | '-w'). Returns true when the reference
-- was dropped (the caller then runs gc_tube after its loop). A change of the watch set drops
-- the connection's line (K_LINE_OF, includes/waiter_counts.lua): a waiting connection is counted
-- out before its set changes, and its next count in finds the line of its new set.
local function apply_watch(op, t, token, ik, now)
  if op == '+w' then
    ensure_tube(t, now)
    if rcall('SADD', k_watch(token), t) == 1 then
      bump(K_REFS, 'w:' .. t, 1)
      bump(ik, 'w:' .. t, 1)
      rcall('HDEL', K_LINE_OF, token)
    end
  elseif op == '-w' then
    if rcall('SREM', k_watch(token), t) == 1 then
      bump(K_REFS, 'w:' .. t, -1)
      bump(ik, 'w:' .. t, -1)
      rcall('HDEL', K_LINE_OF, token)
      return true
    end
  end
  return false
end

-- This instance now has n connections using tube t (an absolute count, so sending it twice is
-- harmless). Returns true when the instance's reference was dropped (the caller runs gc_tube).
local function set_using(t, n, ik, now)
  local field = 'u:' .. t
  local delta = n - tonumber(rcall('HGET', ik, field) or 0)
  if delta == 0 then return false end
  if n > 0 then ensure_tube(t, now) end
  bump(K_REFS, field, delta)
  bump(ik, field, delta)
  return n == 0
end
