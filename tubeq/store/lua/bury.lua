--[[ bury: move a reserved job to the end of its tube's buried FIFO, with a new priority.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then token, id,
         pri, now (ms), optionally the number of the first reserve it was pipelined behind
Returns  1 buried | 0 not reserved by this connection | -1 deferred (see blocked_ahead in
         includes/jobs.lua)
Events   'buried'; its end kept and published when a wait marked it (includes/ends.lua). A
         job cancelled while held is deleted instead (drop_cancelled), and the reply is 1
]]
--- @include "keys"
--- @include "ends"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local token, id, pri, now = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
if blocked_ahead(token, ARGV[7]) then return DEFERRED end
local jk = k_job(id)
local f = rcall('HMGET', jk, JOB_STATE, JOB_TUBE, JOB_OWNER, JOB_WAITED, JOB_ERROR,
  JOB_CANCELLED)
if f[1] ~= 'reserved' or f[3] ~= token then return 0 end
local t = f[2]
if f[6] then  -- cancelled while held: it goes instead (the reply is still BURIED)
  drop_cancelled(id, t, jk, 'reserved', now)
  return 1
end
if f[4] then end_job(id, t, 'buried', buried_data(nil, f[5]), now, nil, f[4]) end
unlink(id, t, 'reserved', now)
count_in('b', rcall('ZADD', k_buried(t), rcall('HINCRBY', K_SEQS, 'bury', 1), member(id)))
rcall('HSET', jk, JOB_STATE, 'buried', JOB_PRI, pri)
rcall('HDEL', jk, JOB_OWNER, JOB_DUE)
rcall('HINCRBY', jk, JOB_BURIES, 1)
job_event('buried', id, now, 0, 0, '')
return 1
