--[[ delete: remove jobs in any state; a reserved job only by the connection holding it. One
call can carry the deletes a connection sent together (its process batches them).
KEYS[1]  namespace root
ARGV     token, now (ms), then one or more job ids
Returns  per id: 1 deleted | 0 not found (or reserved by another connection)
]]
--- @include "keys"
--- @include "jobs"
local token, now = ARGV[1], tonumber(ARGV[2])
local done, deleted = {}, {}  -- deleted: tube -> jobs deleted from it
for i = 3, #ARGV do
  local id = ARGV[i]
  local jk = k_job(id)
  local f = rcall('HMGET', jk, 's', 't', 'o')
  local state, t = f[1], f[2]
  if not state or (state == 'reserved' and f[3] ~= token) then
    done[#done + 1] = 0
  else
    unlink(id, t, state, now)
    rcall('DEL', jk)
    deleted[t] = (deleted[t] or 0) + 1
    done[#done + 1] = 1
  end
end
for t, n in pairs(deleted) do
  rcall('HINCRBY', k_tube(t), 'del', n)
  gc_tube(t)
end
return done
