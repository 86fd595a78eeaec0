--[[ restore: a live tubeq process whose registrations were reaped (its heartbeats missed Redis
for longer than the reap limit: a pause of the process, see tubeq.scheduler) or lost (a Redis
that came back empty) puts back what its connections need: each connection's watch set and
tube references, its place in the process's connection set, and the process's gauges. Every
step is idempotent (a watch already there is not counted twice, the gauges are absolute), so
restoring a process that lost nothing changes nothing. Waiting connections count themselves in
again afterwards (wait.lua), as their watch sets must exist first.
KEYS[1]  namespace root
ARGV     instance id, now (ms), home ('1': this store counts the process's connections and
         gauges; '0': another shard of a split namespace, tubeq.shards, where its connections
         only watch tubes), connections, producers, workers (the gauges, absolute), then for each
         connection: token, n, and the n tubes it watches here
Returns  the number of watches created anew
]]
--- @include "keys"
--- @include "jobs"
--- @include "refs"
local inst, now, home = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local ik = k_instance(inst)
local created = 0
local i = 7
while i <= #ARGV do
  local token, n = ARGV[i], tonumber(ARGV[i + 1])
  if home then rcall('SADD', k_instance_conns(inst), token) end
  for j = i + 2, i + 1 + n do
    if rcall('SISMEMBER', k_watch(token), ARGV[j]) == 0 then
      apply_watch('+w', ARGV[j], token, ik, now)
      created = created + 1
    end
  end
  i = i + 2 + n
end
if home then
  rcall('HSET', ik, 'conns', ARGV[4], 'producers', ARGV[5], 'workers', ARGV[6])
end
return created
