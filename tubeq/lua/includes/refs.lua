-- Tube references of one connection (using / watching), counted per process instance and in
-- total, so a dead instance's share can be taken back by reap.lua.
-- Returns true when the reference was dropped (the caller then runs gc_tube after its loop).
local function apply_ref(op, t, token, ik, now)
  if op == '+u' then
    ensure_tube(t, now)
    bump(K_REFS, 'u:' .. t, 1)
    bump(ik, 'u:' .. t, 1)
  elseif op == '-u' then
    bump(K_REFS, 'u:' .. t, -1)
    bump(ik, 'u:' .. t, -1)
    return true
  elseif op == '+w' then
    ensure_tube(t, now)
    if rcall('SADD', k_watch(token), t) == 1 then
      bump(K_REFS, 'w:' .. t, 1)
      bump(ik, 'w:' .. t, 1)
    end
  elseif op == '-w' then
    if rcall('SREM', k_watch(token), t) == 1 then
      bump(K_REFS, 'w:' .. t, -1)
      bump(ik, 'w:' .. t, -1)
      return true
    end
  end
  return false
end
