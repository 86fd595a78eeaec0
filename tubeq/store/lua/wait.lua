--[[ wait: how job `id` ended, or, while it lives, mark it waited so the script that ends it
keeps its end and publishes it (includes/ends.lua).
KEYS[1]  namespace root
ARGV     id, keep (ms: how long its end is to be kept, the waiter's result lifetime),
         optionally a progress number: a living job whose progress count (progress.lua) is
         past it answers its progress
Returns  {how, data} it ended (or lies buried now: {'buried', buried_data}) | {'progress',
         count, data} | 1 not ended, marked | 0 no such job and no end kept (never seen, or
         its end's time is up)
A job that lives is the truth before any kept end: a job buried, ended there, then kicked is
waited for again. Job ids are never reused, so a kept end of a job gone is final.
]]
--- @include "keys"
--- @include "ends"
local id, keep, seen = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local jk = k_job(id)
local f = redis.call('HMGET', jk, JOB_STATE, JOB_BURIED_FOR, JOB_WAITED, JOB_ERROR,
  JOB_PROGRESS_SEQ, JOB_PROGRESS, JOB_WAITED_BY)
if f[1] then
  if f[1] == 'buried' then return {'buried', buried_data(f[2], f[4])} end
  if seen and tonumber(f[5] or 0) > tonumber(seen) then
    return {'progress', tonumber(f[5]), f[6]}
  end
  if not f[3] or tonumber(f[3]) < keep then redis.call('HSET', jk, JOB_WAITED, keep) end
  -- a wait of any process: its end is published, not only told to the request's process
  if f[7] then redis.call('HDEL', jk, JOB_WAITED_BY) end
  return 1
end
local e = redis.call('HMGET', k_end(id), END_HOW, END_DATA)
if e[1] then return {e[1], e[2]} end
return 0
