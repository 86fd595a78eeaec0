--[[ touch: give a reserved job a full TTR from now.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, id,
         now (ms)
Returns  the new deadline (ms) | 0 not reserved by this connection
Events   'touched'
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
local token, id, now = ARGV[3], ARGV[4], tonumber(ARGV[5])
local jk = k_job(id)
local f = rcall('HMGET', jk, 's', 'o', 'r')
if f[1] ~= 'reserved' or f[2] ~= token then return 0 end
local due = now + tonumber(f[3]) * 1000
rcall('HSET', jk, 'u', due)
rcall('ZADD', K_RESERVED, due, member(id))
job_event('touched', id, now, 0, 0, '')
return due
