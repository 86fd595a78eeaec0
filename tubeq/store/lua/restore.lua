--[[ restore: a live tubeq process whose registrations were reaped (its heartbeats missed Redis
for longer than the reap limit: a pause of the process, see tubeq.server.scheduler) or lost (a Redis
that came back empty) puts back what its tokens need: each one's watch set, its place in the
process's connection set (connections only), and the process's counts: the gauges and, per
tube, how many of its tokens watch it (absolute, as set_using is: a reap in a shard that is not
a connection's home takes the counts but leaves the watch sets and waits, tubeq.store.shards).
A wait still recorded keeps its place in its line (includes/waiter_counts.lua), which holds
no count per tube to restore; but a wait recorded while the token's watch set was gone (it
counted in between the reap and this restore) is in no tube's line: it is counted out and in
again, with its mode, in the line of the set brought back (as tubes.lua does on a watch
change). Every step is idempotent, so restoring a process that lost nothing changes nothing. A
waiting connection whose wait the reap removed counts itself in again afterwards
(count_waiting.lua), once its watch set is back.
KEYS[1]  namespace root
ARGV     instance id, now (ms), home ('1': this store counts the process's connections and
         gauges; '0': another shard of a split namespace, where its connections only watch
         tubes), connections, producers, workers (the gauges), then for every token of the
         process: token, kind ('c' a connection | 'r' an HTTP reservation), n, and the n tubes
         it watches here
Returns  the number of watches created anew
]]
--- @include "keys"
--- @include "jobs"
--- @include "waiter_counts"
local inst, now, home = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local ik = k_instance(inst)
local created, waiting_gauge = 0, 0
local watching = {}
local i = 7
while i <= #ARGV do
  local token, kind, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if home and kind == 'c' then rcall('SADD', k_instance_conns(inst), token) end
  local mode = waiting_mode(token)
  if mode and mode ~= 'o' then waiting_gauge = waiting_gauge + 1 end
  local added = 0
  for j = i + 3, i + 2 + n do
    local t = ARGV[j]
    ensure_tube(t, now)
    added = added + rcall('SADD', k_watch(token), t)
    watching[t] = (watching[t] or 0) + 1
  end
  -- Its watch set was lost: the line it names is worked out again at its next count in, and
  -- a wait recorded meanwhile moves to that line now. (The gauge is set whole below.)
  if added > 0 then
    rcall('HDEL', K_LINE_OF, token)
    if mode then
      count_waiting(inst, token, -1)
      count_waiting(inst, token, 1, mode)
    end
  end
  created = created + added
  i = i + 3 + n
end
local function set_count(field, n)
  local delta = n - tonumber(rcall('HGET', ik, field) or 0)
  if delta ~= 0 then
    bump(K_REFS, field, delta)
    bump(ik, field, delta)
  end
end
for t, n in pairs(watching) do set_count('w:' .. t, n) end
rcall('HSET', ik, 'waiting', waiting_gauge)
if home then
  rcall('HSET', ik, 'conns', ARGV[4], 'producers', ARGV[5], 'workers', ARGV[6])
end
return created
