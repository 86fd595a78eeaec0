--[[ disconnect: a connection closed (quit, EOF, reset): its reserved jobs go back to ready at
once (no timeouts/releases counted), those a put handed it and it never claimed too, and
its waiting count, its watches and gauges are dropped (its process
counts its use of a tube, see using.lua).
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, was
         producer (0|1), was worker (0|1), now (ms), home (1: connect.lua counted it here; 0:
         another shard of a split namespace, tubeq.store.shards, where it only watched tubes),
         shutdown (1: its process is stopping and closed it), then the ids of the jobs it
         reserved
Returns  the number of jobs released. Idempotent: sent again after a failure (its process
         retries), it gives back and takes away nothing twice
Events   'timed-out' per job given back, reason 'disconnect'; a job it held ends a try and
         its policies apply as on a TTR timeout (includes/policies.lua: backoff, max-tries,
         TTL), so it may be delayed, buried or expired instead; but with shutdown a job it held
         goes back to ready with no try counted (reason 'shutdown'), or expires past its TTL,
         as a hand-back would
Wakes    reserves blocked on each tube that got a job back
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "refs"
--- @include "waiter_counts"
--- @include "policies"
local inst, token, producer, worker, now, home, shutdown =
  EVENTS_BY, ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1',
  ARGV[8] == '1'
local ik = k_instance(inst)
local released, woken = 0, {}
-- `held`: the connection had the job (it ends a try); else a put handed it and it never knew.
local function give_back(id, held)
  local f = rcall('HMGET', k_job(id), JOB_STATE, JOB_TUBE, JOB_OWNER)
  if f[1] == 'reserved' and f[3] == token then
    local fate = 'ready'
    if held and not shutdown then
      fate = retry(id, f[2], now, 'disconnect')
    elseif held and rcall('HEXISTS', k_job(id), JOB_CANCELLED) == 0
        and expire_if_past_ttl(id, f[2], k_job(id), now) then
      fate = false  -- past its TTL: expired, as after any reservation
    elseif not give_back_handed(id, f[2], now, held and 'shutdown' or 'disconnect') then
      fate = false  -- cancelled meanwhile: gone
    end
    released = released + 1
    if fate == 'ready' then woken[f[2]] = true end
  end
end
for i = 9, #ARGV do give_back(ARGV[i], true) end
for _, id in ipairs(rcall('LRANGE', k_handed(token), 0, -1)) do give_back(id, false) end
rcall('DEL', k_handed(token))
rcall('DEL', k_blocked(token))
count_waiting(inst, token, -1)  -- normally done already, when its reserve stopped waiting
local dropped = {}
for _, t in ipairs(rcall('SMEMBERS', k_watch(token))) do
  apply_watch('-w', t, token, ik, now)
  dropped[#dropped + 1] = t
end
rcall('HDEL', K_LINE_OF, token)
-- The gauges only when the connection was still listed: a disconnect sent again (its first
-- call's reply was lost) or one after a reap takes nothing twice.
if home and rcall('SREM', k_instance_conns(inst), token) == 1 then
  bump(ik, 'conns', -1)
  if producer > 0 then bump(ik, 'producers', -1) end
  if worker > 0 then bump(ik, 'workers', -1) end
end
for _, t in ipairs(dropped) do gc_tube(t) end
for t in pairs(woken) do wake(t) end
return released
