--[[ best: the job reserve.lua would give a connection now, without taking it. A namespace
split into shards (tubeq.store.shards) asks every shard the connection watches, then reserves on the
one whose answer comes first in (pri, put time, id) order.
KEYS[1]  namespace root
ARGV     token
Returns  {pri, put (us, by Redis's clock; ms * 1000 for a job older than that field), id} |
         {-1, 0, 0} when a put handed it a job (reserve.lua gives that
         one first) | {} when nothing is reservable here
Cost     see includes/picking.lua; reads only
]]
--- @include "keys"
--- @include "jobs"
--- @include "waiter_counts"
--- @include "picking"
local token = ARGV[1]
if rcall('LLEN', k_handed(token)) > 0 then return {-1, 0, 0} end
-- The shard's best ready job first: nothing ready here ends the look at one call, and a
-- connection that watches many tubes (the reason to reserve across shards) usually watches it.
local head = rcall('ZRANGE', K_READY_TUBES, 0, 0)
if #head == 0 then return {} end
local entry = head[1]
local _, t = split_entry(entry)
if rcall('SISMEMBER', k_watch(token), t) == 0 then entry = best_entry(token) end
if not entry then return {} end
local id = id_of(split_entry(entry))
local put = rcall('HMGET', k_job(id), JOB_CREATED_US, JOB_CREATED)
return {tonumber(rcall('ZSCORE', K_READY_TUBES, entry)),
        tonumber(put[1] or (tonumber(put[2]) * 1000)), tonumber(id)}
