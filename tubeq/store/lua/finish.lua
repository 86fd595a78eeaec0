--[[ finish: the connection holding reserved jobs says they are done, each with a result: each
is deleted as delete.lua deletes it, and its end is kept with the result for `keep` ms. One
job (a lone finish) or several, in the order given (a connection's finishes of one read,
tubeq.server.runs: an id given twice is finished once, then not held).
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, now
         (ms), keep (ms: the process's --result-ttl; a job's own put-with result-ttl-ms wins),
         the number of the first reserve it was pipelined behind ('0': none), then per job: id,
         result
Returns  per job: {held, tube} finished (held as delete.lua's) | {held, tube, 1} finished and
         its end not published: only this process waits for it (JOB_WAITED_BY), and hears it
         here | 0 not reserved by this connection | -2 cancelled (the job is gone, its result
         dropped); or -1 deferred, nothing finished (see blocked_ahead in includes/jobs.lua)
Events   per job: 'deleted' with reason 'finished' and size (the result's bytes), as
         delete.lua's but for those two; its end published when a wait marked it
]]
--- @include "keys"
--- @include "ends"
--- @include "events"
--- @include "jobs"
--- @include "groups"
--- @include "policies"
local token, now, keep = ARGV[3], tonumber(ARGV[4]), ARGV[5]
if blocked_ahead(token, ARGV[6]) then return DEFERRED end

-- What the call finished, per tube: the tube's counters move once a tube, not once a job
-- ('nres', 'del', 'nfin'), and the tube is looked at for removal once, at the end, as
-- delete_many.lua does.
local finished = {}
local tubes = {}  -- in the order first met
local unreserved = {}  -- the members of the jobs finished, for one ZREM

local function finish_one(id, result)
  local jk = k_job(id)
  local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_OWNER, JOB_PRI, JOB_TTR, JOB_RESERVES,
    JOB_RESERVED_AT, JOB_DEDUPE_KEY, JOB_EXPIRES_AT, JOB_WAITED, JOB_CANCELLED, JOB_RESULT_TTL,
    JOB_WAITED_BY, JOB_GROUP_COUNTED)
  local t = f[2]
  if f[1] ~= 'reserved' or f[3] ~= token then return 0 end
  if f[11] then
    drop_cancelled(id, t, jk, 'reserved', now)
    return CANCELLED
  end
  local told = f[13] == EVENTS_BY
  end_job(id, t, 'finished', result, now, f[12] or keep, f[10], nil, told)
  if not finished[t] then
    finished[t] = 0
    tubes[#tubes + 1] = t
  end
  finished[t] = finished[t] + 1
  unreserved[#unreserved + 1] = member(id)  -- out of K_RESERVED, and counted: below
  if f[14] then uncount_group_reserve(t, jk, now) end  -- its group's limits (groups.lua)
  forget_job(id, jk, {f[8], f[9]})
  rcall('DEL', jk)
  add_event('deleted', id, t, f[4], 0, f[5], 0, f[6], now, 'finished', #result)
  local held = f[7] and now - f[7] or -1
  if told then return {held, t, 1} end
  return {held, t}
end

local out = {}
for i = 7, #ARGV, 2 do
  out[#out + 1] = finish_one(ARGV[i], ARGV[i + 1])
end
unreserve_all(unreserved)
for _, t in ipairs(tubes) do
  local tk = k_tube(t)
  local n = text(finished[t])
  -- as unlink does for one reserved job (a 0 stays)
  rcall('HINCRBY', tk, 'nres', text(-finished[t]))
  if rcall('HEXISTS', tk, 'lim') == 1 then  -- reserve limits: maybe below its cap now
    index_tube(t, now)
    wake(t)
  end
  rcall('HINCRBY', tk, 'del', n)
  rcall('HINCRBY', tk, 'nfin', n)
  gc_tube(t)
end
return out
