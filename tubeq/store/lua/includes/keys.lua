--- @include "job_record"

-- Key schema: the Lua mirror of tubeq/store/keys.py (tests/store/test_lua.py keeps the two equal).
-- KEYS[1] is the namespace root "{prefix}:"; every key below starts with it, so a script
-- touches one Redis Cluster slot whatever tubes it works on.
local NS = KEYS[1]
local K_JOB_IDS = NS .. 'id'
local K_TUBES = NS .. 'tubes'
local K_READY_TUBES = NS .. 'ready_tubes'
local K_TIMERS = NS .. 'timers'
local K_RESERVED = NS .. 'reserved'
local K_STATS = NS .. 'stats'
-- The namespace's jobs by state (includes/jobs.lua, count_ready and count_in).
local K_COUNTS = NS .. 'counts'
local K_REFS = NS .. 'refs'
local K_SEQS = NS .. 'seq'
local K_INSTANCES = NS .. 'instances'
local K_WAITING = NS .. 'waiting'
local K_EVENTS = NS .. 'events'
-- The namespace's data layout version (tubeq.store.keys.LAYOUT_VERSION; lua/layout.lua).
local K_LAYOUT = NS .. 'layout'
local function k_job(id) return NS .. 'j:' .. text(id) end
-- A new job: its id and the key of its hash. A namespace split into shards (tubeq.store.shards: root
-- "{<prefix>#<k>/<n>}:") numbers shard k's jobs k + n, k + 2n, ... (id mod n names the shard
-- that holds a job) and stamps when each was put by Redis's clock (us, field 'cu'): a reserve
-- over several shards orders jobs of equal priority by it (best.lua), as ids of two shards
-- tell nothing. An unsplit namespace pays one plain find for it. `given`: an id this shard
-- gave out already (INCR of K_JOB_IDS, made the shard's by tubeq.store.shards), for a job whose
-- id had to be known before it was stored (put-with after= over several shards).
local function new_job(given)
  local seq = given or redis.call('INCR', K_JOB_IDS)
  if string.find(NS, '#', 1, true) then
    local shard, shards = string.match(NS, '#(%d+)/(%d+)}:$')
    if shards then
      local id = given or seq * tonumber(shards) + tonumber(shard)
      local jk = k_job(id)
      local clock = redis.call('TIME')
      redis.call('HSET', jk, JOB_CREATED_US, clock[1] * 1000000 + clock[2])
      return id, jk
    end
  end
  return seq, k_job(seq)
end
local function k_tube(t) return NS .. 't:' .. t end
local function k_settings(t) return NS .. 's:' .. t end
local function k_ready(t) return NS .. 't:' .. t .. ':r' end
local function k_delayed(t) return NS .. 't:' .. t .. ':d' end
local function k_buried(t) return NS .. 't:' .. t .. ':b' end
-- Groups of a tube (put-with group=, includes/groups.lua): a group's ready jobs, the groups in
-- serving order, every group with ready jobs -> its turn, and per group its reserved jobs and
-- its rate window (tube-set group-concurrency, group-rate).
local function k_group_ready(t, g) return NS .. 't:' .. t .. ':g:' .. g .. ':r' end
local function k_group_turns(t) return NS .. 't:' .. t .. ':gt' end
local function k_group_places(t) return NS .. 't:' .. t .. ':gp' end
local function k_group_reserved(t) return NS .. 't:' .. t .. ':gc' end
local function k_group_windows(t) return NS .. 't:' .. t .. ':gw' end
local function k_instance(i) return NS .. 'i:' .. i end
local function k_instance_conns(i) return NS .. 'i:' .. i .. ':conns' end
local function k_watch(token) return NS .. 'c:' .. token .. ':w' end
local function k_wake(t) return NS .. 'wake:' .. t end
-- Waiting connections, grouped in lines by watch set (includes/waiter_counts.lua): a tube's lines
-- with a waiter, each scored by (at most) the seq its first waiter has; token -> its watch set's
-- line; a line's waiting tokens by seq; the tubes a line with waiters was entered in.
local function k_waiters(t) return NS .. 't:' .. t .. ':q' end
local K_LINE_OF = NS .. 'lines'
local function k_line(line) return NS .. 'l:' .. line end
local function k_line_tubes(line) return NS .. 'l:' .. line .. ':t' end
local function k_handed(token) return NS .. 'c:' .. token .. ':g' end
local function k_blocked(token) return NS .. 'c:' .. token .. ':b' end
local function k_grant(i) return NS .. 'grant:' .. i end
-- Where cancel.lua tells a process that a job one of its connections holds was cancelled
-- (message '<token> <id>'; tubeq.server.process, push ... cancels=1).
local function k_cancels(i) return NS .. 'cancels:' .. i end
-- The channel that asks every process's push consumers to stop taking jobs (quiet.lua).
local K_QUIET = NS .. 'quiet'
-- How a job ended, kept for a while (includes/ends.lua), and the channel that tells every
-- process an end its connections may wait for (data: the job id).
local function k_end(id) return NS .. 'e:' .. text(id) end
local K_ENDED = NS .. 'ended'
-- Dependencies (put-with after=, includes/after.lua): a held job's parents that have not
-- finished yet (a set of ids), a parent's children (ids, on any shard), a tube's held jobs
-- (scored by id), ends that came before their child (below), and the ends of parents not yet
-- told to their children: member
-- '<child> <parent> <1 finished | 0 not>', scored by when (ms), drained by every process
-- (tubeq.server.parents) when told on its channel.
local function k_after(id) return NS .. 'af:' .. text(id) end
local function k_children(id) return NS .. 'ch:' .. text(id) end
local function k_held(t) return NS .. 't:' .. t .. ':h' end
-- Parents' ends that reached this shard before their child (a child of a split namespace is
-- told to its parents before it is stored): '<parent> <1|0>', read by the child's put.
local function k_early_ends(id) return NS .. 'ae:' .. text(id) end
local K_PARENT_ENDS = NS .. 'parent_ends'
-- Job policies and deduplicated put (includes/policies.lua).
local K_TTL = NS .. 'ttl'
local K_DEDUPE = NS .. 'dedupe'
-- Recurring jobs (schedule-*): every schedule by its next due time (member '<tube>:<name>'),
-- one hash per schedule, the names of a tube's schedules; and the channel that tells every
-- process's scheduler of a due instant another process created (a tick, a rate window's end).
local K_SCHEDULES = NS .. 'schedules'
local K_DUE_CHANNEL = NS .. 'due'
local function k_schedule(t, name) return NS .. 'sc:' .. t .. ':' .. name end
local function k_schedule_names(t) return NS .. 'sc:' .. t end
