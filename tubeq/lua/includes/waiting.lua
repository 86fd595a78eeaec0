-- Count a connection in (delta 1) or out of (delta -1) the waiters of every tube it watches,
-- for its process `inst` and in total. put/release/kick/promote PUBLISH a wake-up only for
-- tubes with waiters; stats-tube's current-waiting reads the same counts.
local function count_waiting(inst, token, delta)
  local ik = k_instance(inst)
  for _, t in ipairs(rcall('SMEMBERS', k_watch(token))) do
    bump(K_REFS, 'q:' .. t, delta)
    bump(ik, 'q:' .. t, delta)
  end
  bump(ik, 'waiting', delta)
end
