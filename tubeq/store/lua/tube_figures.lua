--[[ tube_figures: tubeq's own stats-tube figures (extended connections): the tube's delayed
jobs by time left until due, and the age of its oldest ready job.
KEYS[1]  namespace root
ARGV     tube, now (ms), then the bucket bounds (ms of time left, ascending), then the most
         priority levels to visit
Returns  {} when the tube does not exist, else {one count per bucket (bounds + 1 of them:
         under the first bound, ..., at least the last), creation time (ms) of the oldest ready
         job or -1 when none}
Buckets are ZCOUNTs over the delayed set's score (due time) ranges relative to now: a job
overdue but not yet promoted counts in the first bucket.
The oldest ready job: ready jobs of one priority sort by id, so the oldest of each priority
is that priority's first; this visits the first job of each distinct priority, most urgent
first (O(levels * log n)), up to the given number of levels. Past that many distinct
priorities the answer is the oldest among those levels.
]]
--- @include "keys"
--- @include "jobs"
local t, now = ARGV[1], tonumber(ARGV[2])
if rcall('EXISTS', k_tube(t)) == 0 then return {} end
local out = {}
local dk = k_delayed(t)
local low = '-inf'
for i = 3, #ARGV - 1 do
  local high = now + tonumber(ARGV[i])
  out[#out + 1] = rcall('ZCOUNT', dk, low, '(' .. high)
  low = high
end
out[#out + 1] = rcall('ZCOUNT', dk, low, '+inf')
local rk = k_ready(t)
local oldest = -1
local head = rcall('ZRANGE', rk, 0, 0, 'WITHSCORES')
for _ = 1, tonumber(ARGV[#ARGV]) do
  if not head[1] then break end
  local created = tonumber(rcall('HGET', k_job(id_of(head[1])), JOB_CREATED))
  if created and (oldest < 0 or created < oldest) then oldest = created end
  head = rcall('ZRANGE', rk, '(' .. head[2], '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
end
out[#out + 1] = oldest
return out
