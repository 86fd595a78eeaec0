--- @include "text"

-- The job record: one hash per living job, k_job(id), holding everything tubeq knows of the job
-- (a tube's sets hold only its member, includes/jobs.lua). Scripts name its fields through the
-- JOB_* constants below, never by their letters (a script's own source has the letters written
-- in, tubeq.store.scripts); tubeq.store.keys.JobField mirrors them for Python's reads
-- (tests/store/test_lua.py keeps the two equal). Field names are one or two letters:
-- they are stored in every job, and a small hash stays a compact listpack in Redis.
-- If you change what a field means or how it is encoded, or add one an older build would
-- misread, raise LAYOUT_VERSION (tubeq/store/keys.py) and say there what the new layout adds:
-- a namespace then refuses the older builds that would misread it (README, "Upgrades and
-- rollback").
-- Encoding: Redis keeps every value as a string. "ms" is an integer instant or span of the
-- scripts' clock (the `now` a caller passes); "s" a whole number of seconds; a count starts
-- absent (0) and is raised by HINCRBY. An absent field reads as the default its row gives.
-- The record is written whole once, by store_job (put, put_many, schedule_tick); the other
-- writers below change single fields, each where its transition happens.

-- What a put gives: set by store_job.
local JOB_TUBE = 't'  -- tube name; never changes
local JOB_STATE = 's'  -- 'ready' | 'delayed' | 'reserved' | 'buried' | 'held' (tubeq.model.states)
local JOB_PRI = 'p'  -- priority, 0 to 2^32-1; bury, release and change-pri set it again
local JOB_DELAY = 'd'  -- s, the delay last asked for (put, release, change-delay); absent: 0
local JOB_TTR = 'r'  -- s, time to run; never changes
local JOB_CREATED = 'c'  -- ms, when it was put
local JOB_DUE = 'u'  -- ms: delayed, when it becomes ready; reserved, its TTR deadline; else absent
local JOB_BODY = 'b'  -- the body's bytes; never changes
-- ...and for a split namespace's job (new_job, includes/keys.lua): us, when it was put by Redis's
-- own clock, which orders jobs of equal priority across shards (best.lua).
local JOB_CREATED_US = 'cu'
-- ...and for a recurring schedule's job (schedule_tick.lua): the schedule's name and the due
-- time (ms) of the tick that put it.
local JOB_SCHEDULE = 'sn'
local JOB_TICK_DUE = 'st'

-- Reservations (grant, includes/jobs.lua) and the moves that end them.
local JOB_OWNER = 'o'  -- the reserving connection's token, while reserved
local JOB_RESERVED_AT = 'ra'  -- ms, when last reserved (delete's held time)
-- ms, when it last became ready by release, kick, promote or requeue (absent: since 'c')
local JOB_READY_SINCE = 'a'

-- stats-job's counts, each raised where it happens.
local JOB_RESERVES = 'nr'  -- grant
local JOB_TIMEOUTS = 'nt'  -- expire.lua (TTR ran out)
local JOB_RELEASES = 'nl'  -- release.lua
local JOB_BURIES = 'nb'  -- bury.lua, and a policy's bury (includes/policies.lua)
local JOB_KICKS = 'nk'  -- kick.lua, kick_job.lua

-- Job policies and deduplicated put (put-with, includes/policies.lua): its own settings, only
-- when the put gave them (start_policies), and its policy state.
local JOB_MAX_TRIES = 'mt'  -- count
local JOB_BACKOFF = 'bo'  -- ms
local JOB_BACKOFF_MAX = 'bx'  -- ms
local JOB_ON_EXPIRE = 'oe'  -- 'bury' | 'delete'
local JOB_DEDUPE_KEY = 'k'  -- its dedupe key (K_DEDUPE maps it back while the job lives)
local JOB_EXPIRES_AT = 'x'  -- ms, its TTL's end, while that is pending (start_policies)
local JOB_TRIES = 'ny'  -- end_try: reservations ended by a TTR timeout, a release or a disconnect
-- bury_for: why tubeq last buried it, 'max-tries' | 'expired' | 'parent-failed' (after.lua)
local JOB_BURIED_FOR = 'why'

-- Ends (wait.lua, includes/ends.lua): ms to keep its end for, set by a wait (the longest a
-- waiter's process asked for), so the script that ends it keeps the end and tells the waiters.
local JOB_WAITED = 'w'
-- put-with wait-ms / notify-ms: the instance id of the process whose request/reply marked it,
-- while no other wait did (wait.lua removes it): finish.lua then tells that process in its
-- reply instead of publishing the end (includes/ends.lua).
local JOB_WAITED_BY = 'wb'
-- fail.lua: the failures its holders reported, and the last one's error text.
local JOB_FAILURES = 'nf'
local JOB_ERROR = 'er'
-- cancel.lua: set on a reserved job that is not to run again (its holder hears CANCELLED).
local JOB_CANCELLED = 'cx'
-- progress.lua: the latest progress its holder reported, and how many it reported (a wait
-- asks for a progress newer than the one it saw).
local JOB_PROGRESS = 'pg'
local JOB_PROGRESS_SEQ = 'ps'
-- put-with result-ttl-ms: ms to keep its result (finish.lua) instead of the --result-ttl of the
-- process that finished it.
local JOB_RESULT_TTL = 'rt'
-- put-with after= (includes/after.lua): ms, the delay a held job takes when its last parent
-- finished (absent: none; its parents still pending are the set k_after(id)).
local JOB_AFTER_DELAY = 'ad'
-- put-with group= (includes/groups.lua): the job's group key; absent: the group "". Never
-- changes.
local JOB_GROUP = 'g'
-- ...and while reserved from a tube with group limits: 1 when its group's reserved count
-- (k_group_reserved) counts it, so the end of the reservation counts it out exactly once.
local JOB_GROUP_COUNTED = 'gk'
-- put-with traceparent=: the producer's W3C traceparent, as given (protocol.md, "Traces"); an
-- older build ignores the field (it reads only the fields it names), so no new layout.
local JOB_TRACEPARENT = 'tp'

-- Write a new job's record whole (new_job gave its key `jk`): ready when `due` is nil, else
-- delayed until `due` (ms) with `delay` (s) kept as given. `...`: more (field, value) pairs
-- (a schedule's tick: JOB_SCHEDULE, JOB_TICK_DUE). The policy fields are start_policies'.
local function store_job(jk, t, pri, ttr, body, now, delay, due, ...)
  if due then
    redis.call('HSET', jk, JOB_TUBE, t, JOB_STATE, 'delayed', JOB_PRI, text(pri), JOB_DELAY,
      text(delay), JOB_TTR, text(ttr), JOB_CREATED, text(now), JOB_DUE, text(due), JOB_BODY, body,
      ...)
  else
    -- no JOB_DELAY: a delay of 0 is the default every reader assumes (a field less per job)
    redis.call('HSET', jk, JOB_TUBE, t, JOB_STATE, 'ready', JOB_PRI, text(pri), JOB_TTR,
      text(ttr), JOB_CREATED, text(now), JOB_BODY, body, ...)
  end
end
