--[[ reap: take back what tubeq processes that stopped heart-beating still hold: their tube
references, waiters and connection gauges. Jobs a put handed to one of their waiting
connections go back to ready; the jobs they had reserved come back by TTR (expire.lua).
Waiting tokens that are no connection (an HTTP long poll's, '<instance>:h<random>',
tubeq.http.reservations) are in no set of the process: they are found in {p}:waiting by their
instance prefix (HSCAN, O(waiting tokens of the namespace), once per process reaped) and
counted out too, their watch sets dropped; a paused process that was reaped counts them in
again after its restore (tubeq.server.context).
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then stale
         before (ms): instances whose last heartbeat is older are dead; now (ms); optionally
         an instance id: reap that one (a process leaving cleanly)
Returns  the number of instances reaped
Events   'timed-out' per job given back, reason 'reaped'
Wakes    reserves blocked on each tube that got a job back
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "waiter_counts"
--- @include "policies"
local now = tonumber(ARGV[4])
local dead = ARGV[5] and {ARGV[5]} or rcall('ZRANGEBYSCORE', K_INSTANCES, '-inf', '(' .. ARGV[3])
local woken = {}
for _, inst in ipairs(dead) do
  local ik = k_instance(inst)
  local fields = rcall('HGETALL', ik)
  local touched = {}
  for i = 1, #fields, 2 do
    local kind, t = string.match(fields[i], '^([uwq]):(.*)$')
    if kind then
      bump(K_REFS, kind .. ':' .. t, -tonumber(fields[i + 1]))
      touched[#touched + 1] = t
    end
  end
  for _, token in ipairs(rcall('SMEMBERS', k_instance_conns(inst))) do
    count_waiting(inst, token, -1)
    for _, id in ipairs(rcall('LRANGE', k_handed(token), 0, -1)) do
      local f = rcall('HMGET', k_job(id), JOB_STATE, JOB_TUBE, JOB_OWNER)
      if f[1] == 'reserved' and f[3] == token
          and give_back_handed(id, f[2], now, 'reaped') then
        woken[f[2]] = true
      end
    end
    rcall('DEL', k_watch(token), k_handed(token))
    rcall('HDEL', K_LINE_OF, token)
  end
  for _, token in ipairs(waiting_tokens_of(inst)) do
    count_waiting(inst, token, -1)
    rcall('DEL', k_watch(token))
    rcall('HDEL', K_LINE_OF, token)
  end
  rcall('DEL', ik, k_instance_conns(inst))
  rcall('ZREM', K_INSTANCES, inst)
  for _, t in ipairs(touched) do gc_tube(t) end
end
for t in pairs(woken) do wake(t) end
return #dead
