-- Groups inside a tube (put-with group=<key>): among the ready jobs of a tube at its best
-- priority the groups take turns (round robin); inside a group, beanstalkd's (pri, id) order.
-- Jobs put without a group are the group "" (JOB_GROUP absent). jobs.lua includes this and
-- calls it where a job moves into or out of ready and where a reservation starts or ends.
-- A tube is in group mode (its meta field 'grp') from the put of its first job with a group
-- until a put finds it holding no job at all (leave_group_mode); a tube that never held one
-- has none of the keys below and pays one field read where its meta is read anyway.
-- In group mode:
--   * k_ready(t) still holds every ready job, as in any tube: what counts, peeks by state,
--     lists and clears read is the same for both kinds of tube;
--   * k_group_ready(t, g) holds group g's ready jobs (score: priority), the same members;
--   * k_group_places(t): group -> its turn number, for every group with ready jobs;
--   * k_group_turns(t): the groups a reserve may serve now, score = the priority of the
--     group's best job, member = turn_member(turn, group), so at equal priority the group with
--     the lowest turn number comes first. A served group takes the tube's next turn number
--     (meta 'gturn'): it goes behind every group waiting at its priority. A group new to the
--     tube takes the next number too. A group that keeps its place (a job added or removed
--     that it was not served) keeps its number;
--   * the tube's head (its ready_tubes entry, index_tube) is the best job of the first group
--     of k_group_turns(t).
-- Group limits (tube-set group-concurrency, group-rate) set the tube's 'lim' flag
-- (includes/limits.lua); a group they hold keeps its place but leaves k_group_turns (it is
-- parked): its jobs stay ready, no reserve sees them. It comes back (group_place) when one of
-- its reservations ends, when the rate window ends (the timer 'l:<tube>', promote.lua) and
-- when tube-set changes the limits (regroup). Reservations of a limited tube in group mode are
-- counted per group (k_group_reserved; the job's JOB_GROUP_COUNTED says it is counted, and it is
-- counted out when its reservation ends, limits or not), rate
-- windows are the clock's whole seconds as for the tube's own rate (k_group_windows:
-- '<window> <reserves in it>').

-- A group's member of k_group_turns: its turn number's digit count as one letter, the digits,
-- the group key (numbers then sort as numbers, and the key needs no separator).
local function turn_member(turn, g)
  local s = text(turn)
  return string.char(64 + #s) .. s .. g
end

-- The group key of a turns member.
local function turn_group(tm)
  return string.sub(tm, 2 + string.byte(tm, 1) - 64)
end

-- The group of job `id`.
local function group_of(id)
  return redis.call('HGET', k_job(id), JOB_GROUP) or ''
end

-- Whether group g of tube t (flagged 'lim') may be given no job now: it holds group-concurrency
-- reservations, or group-rate reserves in this second (then the window's end is armed as the
-- tube's rate does: the timer 'l:<tube>', told once to every process's scheduler).
local function group_blocked(t, g, now)
  local s = redis.call('HMGET', k_settings(t), 'group-concurrency', 'group-rate')
  local cap = tonumber(s[1] or 0)
  if cap > 0 and tonumber(redis.call('HGET', k_group_reserved(t), g) or 0) >= cap then
    return true
  end
  local rate = tonumber(s[2] or 0)
  if rate == 0 then return false end
  local w = redis.call('HGET', k_group_windows(t), g)
  local window = math.floor(now / 1000)
  if not w then return false end
  local seen, n = string.match(w, '^(%d+) (%d+)$')
  if tonumber(seen) ~= window or tonumber(n) < rate then return false end
  local ends = (window + 1) * 1000
  if redis.call('ZADD', K_TIMERS, ends, 'l:' .. t) == 1 then
    redis.call('PUBLISH', K_DUE_CHANNEL, ends)
  end
  return true
end

-- Put group g of tube t where its ready jobs say: no place when it has none; else in
-- k_group_turns at its best priority, or parked when `limited` (the tube's 'lim') and its
-- limits hold it. `new_turn`: it was just served, it takes the tube's next turn number (a
-- group without a place always does).
local function group_place(t, g, now, limited, new_turn)
  local places, turns = k_group_places(t), k_group_turns(t)
  local old = redis.call('HGET', places, g)
  local head = redis.call('ZRANGE', k_group_ready(t, g), 0, 0, 'WITHSCORES')
  if not head[1] then
    if old then
      redis.call('HDEL', places, g)
      redis.call('ZREM', turns, turn_member(old, g))
    end
    return
  end
  local turn = old
  if new_turn or not old then
    turn = redis.call('HINCRBY', k_tube(t), 'gturn', 1)
    redis.call('HSET', places, g, turn)
    if old then redis.call('ZREM', turns, turn_member(old, g)) end
  end
  if limited and group_blocked(t, g, now) then
    redis.call('ZREM', turns, turn_member(turn, g))
  else
    redis.call('ZADD', turns, head[2], turn_member(turn, g))
  end
end

-- Job member m (priority pri) of group g became ready in tube t (in group mode); the caller
-- has added it to k_ready(t). A group already placed keeps its turn (and stays parked if it
-- is): only its best priority may have improved. Returns whether the group's place changed
-- (it is new, or its best priority improved): if not, a job newer than every other of its
-- group cannot be the tube's new head (at its priority its group's older jobs come first).
local function group_add(t, g, m, pri, now, limited)
  redis.call('ZADD', k_group_ready(t, g), pri, m)
  local turn = redis.call('HGET', k_group_places(t), g)
  if turn then
    return redis.call('ZADD', k_group_turns(t), 'XX', 'LT', 'CH', pri, turn_member(turn, g)) == 1
  end
  group_place(t, g, now, limited)
  return true
end

-- Job member m of group g left tube t's ready jobs (the caller took it out of k_ready(t)):
-- `served` when a reserve took it in its turn (the group goes behind the others), else
-- (delete, bury, kick-job's move, reserve-job, a new priority's re-entry) it keeps its turn.
local function group_remove(t, g, m, now, limited, served)
  redis.call('ZREM', k_group_ready(t, g), m)
  group_place(t, g, now, limited, served)
end

-- A reserve took job member m, the head of the group whose turn it was in tube t (index_tube
-- named it), out of k_ready(t): the group goes behind the others. Its group and turn come from
-- the first member of k_group_turns (no read of the job or of the group's place); should m not
-- be that group's (never, while the index is right), the job's own group is looked up.
-- A group served alone (no other group in the turns, and no limits, so none parked either)
-- keeps its turn number: a new one would change no order, as every group that comes later
-- takes a later number anyway. That spares a tube that one group fills four calls a reserve;
-- and its new head is the tube's, returned (member, pri) so index_tube need not look.
local function group_serve(t, m, now, limited)
  local turns = k_group_turns(t)
  local firsts = redis.call('ZRANGE', turns, 0, 1, 'WITHSCORES')
  local first = firsts[1]
  local g = first and turn_group(first)
  if not g or redis.call('ZREM', k_group_ready(t, g), m) == 0 then
    g = redis.call('HGET', k_job(string.sub(m, 2)), JOB_GROUP) or ''
    group_remove(t, g, m, now, limited, true)
    return
  end
  local head = redis.call('ZRANGE', k_group_ready(t, g), 0, 0, 'WITHSCORES')
  if head[1] and not limited and not firsts[3] then
    if tonumber(head[2]) ~= tonumber(firsts[2]) then redis.call('ZADD', turns, head[2], first) end
    return head[1], head[2]
  end
  redis.call('ZREM', turns, first)
  if not head[1] then
    redis.call('HDEL', k_group_places(t), g)
    return
  end
  local turn = redis.call('HINCRBY', k_tube(t), 'gturn', 1)
  redis.call('HSET', k_group_places(t), g, turn)
  if not (limited and group_blocked(t, g, now)) then
    redis.call('ZADD', turns, head[2], turn_member(turn, g))
  end
end

-- The best job of the group whose turn it is in tube t: {member, pri}, or {} when no group
-- may be served.
local function group_head(t)
  local first = redis.call('ZRANGE', k_group_turns(t), 0, 0)[1]
  if not first then return {} end
  return redis.call('ZRANGE', k_group_ready(t, turn_group(first)), 0, 0, 'WITHSCORES')
end

-- Tube t enters group mode: its ready jobs (none has a group) become the group "". Called
-- before the first job with a group is stored in it.
local function enter_group_mode(t, now, limited)
  redis.call('HSET', k_tube(t), 'grp', 1)
  if redis.call('EXISTS', k_ready(t)) == 1 then
    redis.call('ZUNIONSTORE', k_group_ready(t, ''), 1, k_ready(t))
    group_place(t, '', now, limited)
  end
end

-- Tube t (in group mode) leaves it when it holds no job at all (none ready, reserved,
-- delayed, buried or held): a put of a job without a group into it calls this, so a tube
-- whose groups are gone is served as any tube again. Returns whether it left.
local function leave_group_mode(t)
  local tk = k_tube(t)
  if tonumber(redis.call('HGET', tk, 'nres') or 0) > 0
      or redis.call('EXISTS', k_ready(t), k_delayed(t), k_buried(t), k_held(t)) > 0 then
    return false
  end
  redis.call('DEL', k_group_turns(t), k_group_places(t), k_group_reserved(t),
    k_group_windows(t), k_group_ready(t, ''))
  redis.call('HDEL', tk, 'grp', 'gturn')
  return true
end

-- A reservation of job `jk` (group g) of tube t (in group mode, flagged 'lim') starts: counted
-- for its group's limits; the group is parked if they now hold it.
local function count_group_reserve(t, g, jk, now)
  redis.call('HINCRBY', k_group_reserved(t), g, 1)
  redis.call('HSET', jk, JOB_GROUP_COUNTED, 1)
  if tonumber(redis.call('HGET', k_settings(t), 'group-rate') or 0) > 0 then
    local wk, window = k_group_windows(t), math.floor(now / 1000)
    local w = redis.call('HGET', wk, g)
    local seen, n = string.match(w or '', '^(%d+) (%d+)$')
    n = tonumber(seen) == window and tonumber(n) + 1 or 1
    redis.call('HSET', wk, g, window .. ' ' .. n)
    -- Two entries picked at random go if they are of a past second (only this second's
    -- count matters): the hash holds about the groups reserved lately, not every group the
    -- tube ever served (one per tenant would grow without end).
    local some = redis.call('HRANDFIELD', wk, 2, 'WITHVALUES')
    for i = 1, #some, 2 do
      if tonumber(string.match(some[i + 1], '^(%d+) ') or window) < window then
        redis.call('HDEL', wk, some[i])
      end
    end
  end
  if redis.call('HEXISTS', k_group_places(t), g) == 1 then group_place(t, g, now, true) end
end

-- A reservation of job `jk` in tube t ends: if its group counted it, counted out, and the
-- group comes back to its turn if its limits let it. Returns whether it was.
local function uncount_group_reserve(t, jk, now)
  local f = redis.call('HMGET', jk, JOB_GROUP, JOB_GROUP_COUNTED)
  if not f[2] then return false end
  local g = f[1] or ''
  redis.call('HDEL', jk, JOB_GROUP_COUNTED)
  if redis.call('HINCRBY', k_group_reserved(t), g, -1) <= 0 then
    redis.call('HDEL', k_group_reserved(t), g)
  end
  if redis.call('HEXISTS', k_group_places(t), g) == 1 then group_place(t, g, now, true) end
  return true
end

-- Every group of tube t (in group mode) placed again: after its group limits changed
-- (tube_set.lua) or a rate window ended (promote.lua). O(groups with ready jobs).
local function regroup(t, now, limited)
  for _, g in ipairs(redis.call('HKEYS', k_group_places(t))) do
    group_place(t, g, now, limited)
  end
end
