--[[ count_waiting: count a connection in (delta 1) or out of (delta -1) the waiters of every
tube it watches (see includes/waiter_counts.lua). Counting out a connection a put has already
counted out does nothing.
KEYS[1]  namespace root
ARGV     instance id, token, delta, claim ('1': also take the jobs puts handed to it), and
         optionally the mode to count it in with (see count_waiting in
         includes/waiter_counts.lua: 'h' or 'o', wake-ups only, for a connection that waits
         on several shards)
Returns  the reservations claimed, one after another (see grant in includes/jobs.lua; none
         unless claim is '1')
Events   none: a claimed job's 'reserved' event was written when put.lua handed it over
]]
--- @include "keys"
--- @include "jobs"
--- @include "waiter_counts"
local inst, token, delta = ARGV[1], ARGV[2], tonumber(ARGV[3])
count_waiting(inst, token, delta, ARGV[5])
if ARGV[4] == '1' then return claim_handed(token, nil) end
return {}
