--[[ reap: take back what tubeq processes that stopped heart-beating still hold: their tube
references, waiters and connection gauges. Their reserved jobs come back by TTR (expire.lua).
KEYS[1]  namespace root
ARGV     stale before (ms): instances whose last heartbeat is older are dead;
         optionally an instance id: reap that one (a process leaving cleanly)
Returns  the number of instances reaped
]]
--- @include "keys"
--- @include "jobs"
local dead = ARGV[2] and {ARGV[2]} or rcall('ZRANGEBYSCORE', K_INSTANCES, '-inf', '(' .. ARGV[1])
for _, inst in ipairs(dead) do
  local ik = k_instance(inst)
  local fields = rcall('HGETALL', ik)
  local touched = {}
  for i = 1, #fields, 2 do
    local kind, t = string.match(fields[i], '^([uwq]):(.*)$')
    if kind then
      bump(K_REFS, kind .. ':' .. t, -tonumber(fields[i + 1]))
      touched[#touched + 1] = t
    end
  end
  for _, token in ipairs(rcall('SMEMBERS', k_instance_conns(inst))) do
    rcall('DEL', k_watch(token))
  end
  rcall('DEL', ik, k_instance_conns(inst))
  rcall('ZREM', K_INSTANCES, inst)
  for _, t in ipairs(touched) do gc_tube(t) end
end
return #dead
