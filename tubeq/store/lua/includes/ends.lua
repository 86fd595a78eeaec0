--- @include "keys"

-- How a job ended, for `wait` (wait.lua): a hash at k_end(id) with the fields below, kept for
-- a while after the job is gone. Only a job that asked for it keeps one (finish.lua always, the
-- other ends when a wait marked the job, JOB_WAITED), so beanstalkd's own verbs pay nothing
-- for a job nobody waits for.
local END_HOW = 'h'  -- 'finished' | 'deleted' | 'buried' | 'expired' | 'cancelled'
local END_DATA = 'd'  -- the result (finished), buried_data (buried), else ''
local END_AT = 'at'  -- ms, when it ended
local END_TUBE = 't'  -- its tube

-- A buried job's end data: why tubeq buried it ('' when a client did), and after a newline
-- the last error a holder reported with fail (fail.lua), when there is one.
local function buried_data(why, err)
  if err then return (why or '') .. '\n' .. err end
  return why or ''
end

-- An end whose data is at most this long travels in its message (tubeq.server.end_waits
-- parse_ended): the waits then need no read.
local END_INLINE_MAX = 4096

-- Whether a parent's end lets its children run (put-with after=, includes/after.lua): it
-- finished, or its holder deleted it (beanstalkd's way of saying a job is done). Kept in the
-- end record ('1', else absent) for a child put after its parent ended.
local END_DONE = 'ok'

-- Job `id` (tube t) ended `how` with `data`: keep that for `keep` ms (nil: not kept), and
-- when a wait marked the job (`waited`, its JOB_WAITED) tell every process: '<id>', or
-- '<id>\n<how>\n<data>' when the data is short; unless `told`: the caller's own process is
-- the only one waiting (JOB_WAITED_BY) and hears it from the script's reply (finish.lua).
-- `done`: its holder deleted it (see END_DONE).
-- A job with children (includes/after.lua marked it waited) leaves its end for them in
-- K_PARENT_ENDS, in the same call: no end of a parent is lost on the way to a child.
local function end_job(id, t, how, data, now, keep, waited, done, told)
  if waited then keep = math.max(tonumber(keep) or 0, tonumber(waited)) end
  if not keep then return end
  done = done or how == 'finished'
  local ek = k_end(id)
  if done then  -- (one HSET either way)
    redis.call('HSET', ek, END_HOW, how, END_DATA, data, END_AT, text(now), END_TUBE, t,
      END_DONE, '1')
  else
    redis.call('HSET', ek, END_HOW, how, END_DATA, data, END_AT, text(now), END_TUBE, t)
  end
  redis.call('PEXPIRE', ek, keep)
  if waited then
    if told then  -- (nothing to publish)
    elseif #data <= END_INLINE_MAX then
      redis.call('PUBLISH', K_ENDED, text(id) .. '\n' .. how .. '\n' .. data)
    else
      redis.call('PUBLISH', K_ENDED, text(id))
    end
    local ck = k_children(id)
    local children = redis.call('SMEMBERS', ck)
    if children[1] then
      local tail = ' ' .. text(id) .. (done and ' 1' or ' 0')
      for _, child in ipairs(children) do
        redis.call('ZADD', K_PARENT_ENDS, now, child .. tail)
      end
      redis.call('DEL', ck)
      redis.call('PUBLISH', K_PARENT_ENDS, '')
    end
  end
end
