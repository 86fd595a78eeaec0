--[[ list_jobs: one page of a tube's jobs in one state (list-jobs), after a cursor.
KEYS[1]  namespace root
ARGV     tube, state (ready | delayed | buried | reserved | held), cursor score and cursor id (the
         last job seen; both '' for the first page), count (jobs per page), budget (reserved
         only: index entries examined per call at most)
Returns  {0} when the tube does not exist, else {1, next score, next id, id, pri, due, ...}:
         the next cursor ('' '' when the state has no job after this page), then each job's
         id, priority and due time (delayed: when it becomes ready; reserved: its TTR deadline;
         ms, 0 otherwise)
The order is the state's own: ready (pri, id), delayed (due, id), buried (bury order),
reserved (deadline, id), held (id). A cursor is a position in that order, not an offset, so jobs added or
deleted meanwhile do not shift it: a job that stays in the state and keeps its place is listed
exactly once over a whole walk. Reserved jobs live in one index for all tubes; a page of them
examines at most `budget` entries and may come back short (even empty) with a next cursor.
]]
--- @include "keys"
--- @include "jobs"
local t, state, cursor_score, cursor_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local count, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
if rcall('EXISTS', k_tube(t)) == 0 then return {0} end
local keys = {ready = k_ready, delayed = k_delayed, buried = k_buried, held = k_held}
local key = state == 'reserved' and K_RESERVED or keys[state](t)

-- Whether member a comes after member b (a member's first letter gives its digit count, so
-- (length, text) order is numeric id order, the zset's order among equal scores).
local function after(a, b)
  return #a > #b or (#a == #b and a > b)
end

-- The rank of the first entry after (score, m): entries of a lower score come before it; among
-- those of its score (consecutive ranks), a binary search finds the first member after m.
-- O(log^2 n) whatever happened to the cursor's own job.
local function first_after(score, m)
  local lo = rcall('ZCOUNT', key, '-inf', '(' .. score)
  local hi = lo + rcall('ZCOUNT', key, score, score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if after(rcall('ZRANGE', key, mid, mid)[1], m) then hi = mid else lo = mid + 1 end
  end
  return lo
end

local start = 0
if cursor_score ~= '' then start = first_after(cursor_score, member(cursor_id)) end
local out = {1, '', ''}
local function add(m, score)
  local id = id_of(m)
  local pri = state == 'ready' and score or rcall('HGET', k_job(id), JOB_PRI)
  local due = (state == 'delayed' or state == 'reserved') and score or 0
  out[#out + 1] = id
  out[#out + 1] = pri
  out[#out + 1] = due
end

if state ~= 'reserved' then
  -- One entry more than the page, to know whether a next page exists.
  local page = rcall('ZRANGE', key, start, start + count, 'WITHSCORES')
  local n = math.min(#page / 2, count)
  for i = 1, n do add(page[2 * i - 1], page[2 * i]) end
  if #page / 2 > count then
    out[2], out[3] = page[2 * count], id_of(page[2 * count - 1])
  end
  return out
end

local page = rcall('ZRANGE', key, start, start + budget - 1, 'WITHSCORES')
local found = 0
for i = 1, #page, 2 do
  local m, score = page[i], page[i + 1]
  if rcall('HGET', k_job(id_of(m)), JOB_TUBE) == t then
    add(m, score)
    found = found + 1
    if found == count then
      if i + 1 < #page or rcall('ZCARD', key) > start + (i + 1) / 2 then
        out[2], out[3] = score, id_of(m)
      end
      return out
    end
  end
end
if #page / 2 == budget then
  out[2], out[3] = page[#page], id_of(page[#page - 1])
end
return out
