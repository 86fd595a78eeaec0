--[[ bury: move a reserved job to the end of its tube's buried FIFO, with a new priority.
KEYS[1]  namespace root
ARGV     token, id, pri, now (ms)
Returns  1 buried | 0 not reserved by this connection
]]
--- @include "keys"
--- @include "jobs"
local token, id, pri, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local jk = k_job(id)
local f = rcall('HMGET', jk, 's', 't', 'o')
if f[1] ~= 'reserved' or f[3] ~= token then return 0 end
local t = f[2]
unlink(id, t, 'reserved', now)
rcall('ZADD', k_buried(t), rcall('HINCRBY', K_SEQS, 'bury', 1), member(id))
rcall('HSET', jk, 's', 'buried', 'p', pri)
rcall('HDEL', jk, 'o', 'u')
rcall('HINCRBY', jk, 'nb', 1)
return 1
