-- Lifecycle events: the Lua side of tubeq/model/events.py. A script that changes a job's state
-- appends its event here, in the same script, so an event exists if and only if its transition
-- happened. Every entry carries every field of tubeq.model.events.FIELDS in that order ("" or 0 where
-- one does not apply; tests/store/test_events.py keeps the two equal), so Redis stores the field
-- names once per stream node.
-- A script that includes this receives two bound arguments first (tubeq/store/scripts.py):
-- ARGV[1] the stream's cap (0: events off; the cap itself is kept by each process's scheduler,
-- XTRIM MAXLEN ~ once a second, not by every XADD: tubeq.store.store.Store.trim_events) and ARGV[2]
-- the calling process's instance id (the event's `by`). Its own arguments start at ARGV[3].
-- Include it before "jobs": grant and requeue there write their events through it.
local EVENTS_MAXLEN, EVENTS_BY = tonumber(ARGV[1]), ARGV[2]
-- The most bytes of a fail's error text an event keeps (tubeq.model.events.ERROR_EXCERPT_BYTES):
-- the job keeps the whole text; the stream, capped by entries and not by bytes, keeps its head.
local EVENT_ERROR_MAX = 256

-- Append one event. Durations and times in ms; ttr_s is the job's TTR in seconds. The ends'
-- three (finish, fail) may be left out: size, the bytes of the result or error; err, the error's
-- head (error_excerpt); failures, the job's fail count. traceparent (put.lua, for a job put with
-- one) adds that trailing field after every other (tubeq.model.events.TRAILING_FIELDS): only
-- such entries carry it, so the others cost nothing more (Redis keeps a differing entry's field
-- names in it). One function with a branch, not a second one: every function an include defines
-- is made anew at each call of a script that uses it (callgrind: a second function and a closure
-- in put.lua cost a put ~6,000 instructions, 3.5 %; bench/probes/put_instructions.py).
local function add_event(event, id, t, pri, delay_ms, ttr_s, due_ms, tries, now, reason, size,
                         err, failures, traceparent)
  if EVENTS_MAXLEN == 0 then return end
  if traceparent then
    redis.call('XADD', K_EVENTS, '*',
      'event', event, 'id', text(id), 'tube', t, 'pri', text(pri), 'delay_ms', text(delay_ms),
      'ttr_ms', text(ttr_s * 1000), 'due_ms', text(due_ms), 'tries', text(tries or 0),
      'time_ms', text(now), 'by', EVENTS_BY, 'reason', reason, 'size', text(size or 0),
      'error', err or '', 'failures', text(failures or 0), 'traceparent', traceparent)
    return
  end
  -- The hot path's entry (put, reserved, deleted: ~2 a processed job): a number already in
  -- text()'s table is looked up here, not through a call (a Lua call costs ~0.1 us in Redis:
  -- bench.probes.lua_cost --events, 2.6 % of a put + reserve + delete); strings (a hash's
  -- fields) miss the table and go through text(), which passes them on.
  local ttr_ms = ttr_s * 1000
  redis.call('XADD', K_EVENTS, '*',
    'event', event, 'id', texts[id] or text(id), 'tube', t, 'pri', texts[pri] or text(pri),
    'delay_ms', texts[delay_ms] or text(delay_ms), 'ttr_ms', texts[ttr_ms] or text(ttr_ms),
    'due_ms', texts[due_ms] or text(due_ms), 'tries', texts[tries or 0] or text(tries),
    'time_ms', texts[now] or text(now), 'by', EVENTS_BY, 'reason', reason,
    'size', size and text(size) or '0', 'error', err or '',
    'failures', failures and text(failures) or '0')
end

-- Append one event about a job whose tube, priority, TTR and reserve count its hash holds
-- (read only when events are on): for the transitions off the hot path.
local function job_event(event, id, now, delay_ms, due_ms, reason)
  if EVENTS_MAXLEN == 0 then return end
  local f = redis.call('HMGET', k_job(id), JOB_TUBE, JOB_PRI, JOB_TTR, JOB_RESERVES)
  add_event(event, id, f[1], f[2], delay_ms, f[3], due_ms, f[4], now, reason)
end

-- The first EVENT_ERROR_MAX bytes of s, cut where a UTF-8 character begins (a cut inside one
-- would leave bytes no reader decodes): the cut steps back over at most three continuation
-- bytes (10xxxxxx), so text that is not UTF-8 is cut at the bound or just before it.
local function error_excerpt(s)
  if #s <= EVENT_ERROR_MAX then return s end
  local cut = EVENT_ERROR_MAX
  for _ = 1, 3 do
    local b = string.byte(s, cut + 1)
    if b < 128 or b >= 192 then break end
    cut = cut - 1
  end
  return string.sub(s, 1, cut)
end
