--[[ touch: give a reserved job a full TTR from now.
KEYS[1]  namespace root
ARGV     token, id, now (ms)
Returns  the new deadline (ms) | 0 not reserved by this connection
]]
--- @include "keys"
--- @include "jobs"
local token, id, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local jk = k_job(id)
local f = rcall('HMGET', jk, 's', 'o', 'r')
if f[1] ~= 'reserved' or f[2] ~= token then return 0 end
local due = now + tonumber(f[3]) * 1000
rcall('HSET', jk, 'u', due)
rcall('ZADD', K_RESERVED, due, member(id))
return due
