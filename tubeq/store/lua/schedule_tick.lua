--[[ schedule_tick: put the job of one schedule's due tick and advance the schedule to its next
due time, in one step, so a tick is done exactly once whichever processes race it and a crash
between ticks loses or doubles none.
KEYS[1]  namespace root
ARGV     [1] events cap and [2] instance id (bound, see includes/events.lua), then tube, name,
         generation and due (ms) as schedule_due read them, next due (ms, computed by the
         caller from the definition and its clock), now (ms)
Returns  the new job's id | 0 when the tick is not this caller's to do: the schedule is gone,
         was replaced (generation), was already ticked by another process (due moved), or is
         not due yet
Events   'put' with reason 'schedule:<name>' (delay_ms and due_ms set when the job is delayed)
Wakes    reserves blocked on the tube when the job is ready; tells every process's scheduler of
         the schedule's next due time (K_DUE_CHANNEL)
The job is an ordinary job of the tube; its hash also keeps 'sn' (the schedule's name) and 'st'
(the tick's due time), so a consumer can tell ticks apart. It counts in total-jobs.
]]
--- @include "keys"
--- @include "events"
--- @include "jobs"
--- @include "policies"
local t, name, gen, due, next_due, now =
  ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local sk = k_schedule(t, name)
local s = rcall('HMGET', sk, 'g', 'u', 'p', 'r', 'dm', 'b')
if tonumber(s[1]) ~= gen or tonumber(s[2]) ~= due or due > now
    or tonumber(next_due) <= due then
  return 0
end
local pri, ttr, delay_ms, body = s[3], s[4], tonumber(s[5]), s[6]
ensure_tube(t, now)
-- The tube's ttl-ms applies to the tick's job as to any put; max-jobs does not: a tick is
-- never dropped (protocol.md, schedule-add).
local tube_ttl = tube_limits(t)[2]
local id, jk = new_job()
if delay_ms > 0 then
  local job_due = now + delay_ms
  store_job(jk, t, pri, ttr, body, now, math.floor(delay_ms / 1000), job_due,
    JOB_SCHEDULE, name, JOB_TICK_DUE, ARGV[6])
  start_policies(id, jk, t, false, now, tube_ttl)
  enqueue_delayed(id, t, job_due)
  add_event('put', id, t, pri, delay_ms, ttr, job_due, 0, now, 'schedule:' .. name)
else
  store_job(jk, t, pri, ttr, body, now, nil, nil, JOB_SCHEDULE, name, JOB_TICK_DUE, ARGV[6])
  start_policies(id, jk, t, false, now, tube_ttl)
  enqueue_ready(id, t, tonumber(pri), now)
  add_event('put', id, t, pri, 0, ttr, 0, 0, now, 'schedule:' .. name)
  wake(t)
end
count_stored(t, 1)
rcall('HSET', sk, 'u', next_due, 'lt', ARGV[6], 'lj', id)
rcall('HINCRBY', sk, 'n', 1)
rcall('ZADD', K_SCHEDULES, next_due, t .. ':' .. name)
rcall('PUBLISH', K_DUE_CHANNEL, next_due)
return id
