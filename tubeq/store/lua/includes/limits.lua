-- Per-tube reserve limits (tube-set `rate` and `concurrency`), enforced where jobs are
-- reserved, on every process alike. jobs.lua includes this and calls it from index_tube, grant,
-- unlink and wake.
-- A tube with a limit carries the field 'lim' in its meta hash (k_tube), kept in step with its
-- settings by tube_set.lua and by ensure_tube when the tube is (re)created; a tube without one
-- pays for the feature with that one field read where its entry is indexed, and one HEXISTS
-- where a job is reserved or leaves reserved.
-- While a limit is reached the tube has no ready_tubes entry: reserves see no job there and
-- wait as if it had none (they do not spin), and put hands nothing over. It comes back
--   * for `concurrency`: when one of its reserved jobs leaves reserved (delete, release, bury,
--     TTR timeout, disconnect): unlink re-indexes it and wakes its waiters;
--   * for `rate`: when the one-second window ends: the timer 'l:<tube>' in K_TIMERS, fired by
--     promote.lua, which re-indexes and wakes.
-- Rate windows are the clock's whole seconds (window = floor(now / 1000)): at most `rate`
-- reserves are granted within one; 'rw' (the window) and 'rn' (reserves granted in it) live
-- in the tube's meta hash and go with the tube when it vanishes.

-- Keep the tube's 'lim' flag in step with its settings (the tube's meta hash must exist); the
-- group limits (group-concurrency, group-rate: includes/groups.lua) set it too.
local function sync_limit_flag(t)
  local s = redis.call('HMGET', k_settings(t), 'rate', 'concurrency', 'group-concurrency',
    'group-rate')
  if tonumber(s[1] or 0) > 0 or tonumber(s[2] or 0) > 0 or tonumber(s[3] or 0) > 0
      or tonumber(s[4] or 0) > 0 then
    redis.call('HSET', k_tube(t), 'lim', 1)
  else
    redis.call('HDEL', k_tube(t), 'lim')
  end
end

-- True when tube t (flagged 'lim') may give no job now. When its rate is what holds it, arms
-- the timer that ends the hold and tells every process's scheduler (once per window).
local function limit_reached(t, now)
  local s = redis.call('HMGET', k_settings(t), 'rate', 'concurrency')
  local m = redis.call('HMGET', k_tube(t), 'nres', 'rw', 'rn')
  local cap = tonumber(s[2] or 0)
  if cap > 0 and tonumber(m[1] or 0) >= cap then return true end
  local rate = tonumber(s[1] or 0)
  local window = math.floor(now / 1000)
  if rate > 0 and tonumber(m[2] or -1) == window and tonumber(m[3] or 0) >= rate then
    local ends = (window + 1) * 1000
    if redis.call('ZADD', K_TIMERS, ends, 'l:' .. t) == 1 then
      redis.call('PUBLISH', K_DUE_CHANNEL, ends)
    end
    return true
  end
  return false
end

-- Count one reserve granted from tube t (flagged 'lim') in the current rate window.
local function count_limited_reserve(t, now)
  local tk = k_tube(t)
  local window = math.floor(now / 1000)
  if tonumber(redis.call('HGET', tk, 'rw') or -1) == window then
    redis.call('HINCRBY', tk, 'rn', 1)
  else
    redis.call('HSET', tk, 'rw', window, 'rn', 1)
  end
end

-- At most how many of tube t's `n` ready jobs (n > 1; t flagged 'lim', in group mode when
-- `grouped`) its reserve limits let go now: an upper bound, never less than one, for the
-- wake-up hint (jobs.lua's wake). Fewer would leave reserves asleep with jobs ready for them;
-- more only sends a few tries for nothing. concurrency: its free slots; rate: the rate (the
-- current window may have less left); group limits: the groups that may be served now, each
-- up to the smaller of its limits.
local function limited_room(t, n, grouped)
  local s = redis.call('HMGET', k_settings(t), 'rate', 'concurrency', 'group-concurrency',
    'group-rate')
  local rate, cap = tonumber(s[1] or 0), tonumber(s[2] or 0)
  if cap > 0 then
    n = math.min(n, cap - tonumber(redis.call('HGET', k_tube(t), 'nres') or 0))
  end
  if rate > 0 then n = math.min(n, rate) end
  local gcap, grate = tonumber(s[3] or 0), tonumber(s[4] or 0)
  if grouped and (gcap > 0 or grate > 0) then
    local each = (gcap > 0 and grate > 0) and math.min(gcap, grate) or math.max(gcap, grate)
    n = math.min(n, redis.call('ZCARD', k_group_turns(t)) * each)
  end
  return math.max(n, 1)
end
