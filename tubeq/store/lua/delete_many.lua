--[[ delete_many: delete several jobs, each as delete.lua would, in the order given (an id given
twice is deleted once, then not found).
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, now
         (ms), the number of the first reserve it was pipelined behind ('0': none), then the ids
Returns  per id, as delete.lua: {held, tube} deleted (held: ms since the caller reserved it, -1
         when it was not reserved) | 0 not found (or reserved by another connection); or -1
         deferred, nothing deleted (see blocked_ahead in includes/jobs.lua)
Events   'deleted' per job deleted; ends as delete.lua
]]
--- @include "keys"
--- @include "ends"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local token, now = ARGV[3], tonumber(ARGV[4])
if blocked_ahead(token, ARGV[5]) then return DEFERRED end

-- What the batch deleted, per tube: the tube's counters move once a tube, not once a job
-- (a reserved job's 'nres', 'del'), and the tube is looked at for removal once, at the end.
local deleted, held = {}, {}
local tubes = {}  -- in the order first met
local unreserved = {}  -- the members of the reserved jobs deleted, for one ZREM

local function delete_one(id)
  local jk = k_job(id)
  local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_OWNER, JOB_PRI, JOB_TTR, JOB_RESERVES,
    JOB_DEDUPE_KEY, JOB_EXPIRES_AT, JOB_RESERVED_AT, JOB_WAITED, JOB_CANCELLED,
    JOB_GROUP_COUNTED)
  local state, t = f[1], f[2]
  if not state or (state == 'reserved' and f[3] ~= token) then return 0 end
  if f[10] then
    end_job(id, t, 'deleted', '', now, nil, f[10], state == 'reserved' and not f[11])
  end
  if not deleted[t] then
    deleted[t], held[t] = 0, 0
    tubes[#tubes + 1] = t
  end
  if state == 'reserved' then
    unreserved[#unreserved + 1] = member(id)  -- out of K_RESERVED, and counted: below
    held[t] = held[t] + 1
    if f[12] then uncount_group_reserve(t, jk, now) end  -- its group's limits (groups.lua)
  else
    unlink(id, t, state, now)
  end
  forget_job(id, jk, {f[7], f[8]})  -- its dedupe key is free, its TTL entry goes (as delete.lua)
  rcall('DEL', jk)
  deleted[t] = deleted[t] + 1
  add_event('deleted', id, t, f[4], 0, f[5], 0, f[6], now, '')
  if state == 'reserved' and f[9] then return {now - f[9], t} end
  return {-1, t}
end

local out = {}
for i = 6, #ARGV do
  out[#out + 1] = delete_one(ARGV[i])
end
unreserve_all(unreserved)
for _, t in ipairs(tubes) do
  local tk = k_tube(t)
  if held[t] > 0 then
    -- as unlink does for one reserved job (a 0 stays)
    rcall('HINCRBY', tk, 'nres', text(-held[t]))
    if rcall('HEXISTS', tk, 'lim') == 1 then  -- reserve limits: maybe below its cap now
      index_tube(t, now)
      wake(t)
    end
  end
  rcall('HINCRBY', tk, 'del', text(deleted[t]))
  gc_tube(t)
end
return out
