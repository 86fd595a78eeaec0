--[[ browse: the first jobs of a tube in one state, for the dashboard and the HTTP API's job
list; changes nothing.
KEYS[1]  namespace root
ARGV     tube, state ('ready' | 'delayed' | 'buried' | 'reserved' | 'held'), limit
Returns  {id, pri, created (ms), due (ms: delayed and reserved, else 0), reserves, body (at
         most 200 bytes), ...} in the state's order: ready by (pri, id), delayed by due time,
         buried in bury order, reserved by deadline
Cost     O(limit), except reserved: the namespace's reserved set is walked in deadline order
         until `limit` jobs of the tube are found, at most 1,000 entries (a page refresh must
         not hold Redis for long; a tube whose reservations sit behind 1,000 others' shows
         fewer than it has)
]]
--- @include "keys"
--- @include "jobs"
local t, state, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local ids = {}
if state == 'reserved' then
  local start = 0
  while #ids < limit and start < 1000 do
    local page = rcall('ZRANGE', K_RESERVED, start, start + 99)
    if #page == 0 then break end
    for _, m in ipairs(page) do
      if #ids < limit and rcall('HGET', k_job(id_of(m)), JOB_TUBE) == t then
        ids[#ids + 1] = id_of(m)
      end
    end
    start = start + 100
  end
else
  local key_of = {ready = k_ready, delayed = k_delayed, buried = k_buried, held = k_held}
  for _, m in ipairs(rcall('ZRANGE', key_of[state](t), 0, limit - 1)) do ids[#ids + 1] = id_of(m) end
end
local out = {}
for _, id in ipairs(ids) do
  local f = rcall('HMGET', k_job(id), JOB_PRI, JOB_CREATED, JOB_DUE, JOB_RESERVES, JOB_BODY)
  out[#out + 1] = tonumber(id)
  out[#out + 1] = tonumber(f[1] or 0)
  out[#out + 1] = tonumber(f[2] or 0)
  out[#out + 1] = tonumber(f[3] or 0)
  out[#out + 1] = tonumber(f[4] or 0)
  out[#out + 1] = string.sub(f[5] or '', 1, 200)
end
return out
