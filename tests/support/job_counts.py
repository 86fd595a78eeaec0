"""The invariant behind stats and the scrapes: each namespace root's jobs by state
(``{p}:counts``, kept as jobs move by the scripts: tubeq/store/lua/includes/jobs.lua) equal what
its tubes' sets hold; and the groups of every tube (tubeq/store/lua/includes/groups.lua) agree
with its ready set, its index entry and its reserved jobs.

The fixtures that own a private Redis check it at teardown (tests/conftest.py ``redis_url``,
tests/support/servers.py ``TubeqCluster.stop_all``), so every test that moves jobs through a
real Redis also checks the counts its moves kept. The check is one script per root: an atomic
read, right even while a server still runs.
"""

from __future__ import annotations

import redis

# For one root (KEYS[1]): {u, r, d, b, h} as counted, then as the tubes' sets hold them, then
# the tubes whose held count (tube field nheld, stats-tube's current-jobs-held) differs from
# their held set.
_COMPARE = """
local ns = KEYS[1]
local c = redis.call('HMGET', ns .. 'counts', 'u', 'r', 'd', 'b', 'h')
local out = {tonumber(c[1] or 0), tonumber(c[2] or 0), tonumber(c[3] or 0), tonumber(c[4] or 0),
             tonumber(c[5] or 0), 0, 0, 0, 0, 0, 0}
for _, t in ipairs(redis.call('ZRANGE', ns .. 'tubes', 0, -1)) do
  local rk = ns .. 't:' .. t .. ':r'
  local urgent = redis.call('ZCOUNT', rk, '-inf', '(1024')
  out[6] = out[6] + urgent
  out[7] = out[7] + redis.call('ZCARD', rk) - urgent
  out[8] = out[8] + redis.call('ZCARD', ns .. 't:' .. t .. ':d')
  out[9] = out[9] + redis.call('ZCARD', ns .. 't:' .. t .. ':b')
  local held = redis.call('ZCARD', ns .. 't:' .. t .. ':h')
  out[10] = out[10] + held
  if held ~= tonumber(redis.call('HGET', ns .. 't:' .. t, 'nheld') or 0) then
    out[11] = out[11] + 1
  end
end
return out
"""

# For one root (KEYS[1]): what is wrong with its tubes' groups, one line each. A tube in group
# mode: its groups' ready sets hold exactly its ready jobs, each in the group its record names,
# at its priority; every group with ready jobs has a place (a turn number no later than the
# tube's 'gturn') and a group in turns is scored by its best priority under that number; its
# index entry names the best job of the first group in turns. A tube not in group mode has no
# group keys and no ready job with a group. Every tube: each group's reserved count equals its
# reserved jobs marked counted.
_GROUPS = """
local ns = KEYS[1]
local bad = {}
local function say(t, what) bad[#bad + 1] = t .. ': ' .. what end
local reserved = {}
for _, m in ipairs(redis.call('ZRANGE', ns .. 'reserved', 0, -1)) do
  local f = redis.call('HMGET', ns .. 'j:' .. string.sub(m, 2), 't', 'g', 'gk')
  if f[1] and f[3] then
    local key = f[1] .. ' ' .. (f[2] or '')
    reserved[key] = (reserved[key] or 0) + 1
  end
end
for _, t in ipairs(redis.call('ZRANGE', ns .. 'tubes', 0, -1)) do
  local tk = ns .. 't:' .. t
  local rk, turns, places = tk .. ':r', tk .. ':gt', tk .. ':gp'
  local gc = redis.call('HGETALL', tk .. ':gc')
  for i = 1, #gc, 2 do
    local n = reserved[t .. ' ' .. gc[i]] or 0
    if n ~= tonumber(gc[i + 1]) then
      say(t, 'group ' .. gc[i] .. ' counts ' .. gc[i + 1] .. ' reserved, holds ' .. n)
    end
    reserved[t .. ' ' .. gc[i]] = nil
  end
  if redis.call('HGET', tk, 'grp') then
    local sum = 0
    local place = redis.call('HGETALL', places)
    local gturn = tonumber(redis.call('HGET', tk, 'gturn') or 0)
    for i = 1, #place, 2 do
      local g, turn = place[i], tonumber(place[i + 1])
      if turn > gturn then say(t, 'group ' .. g .. ' turn past gturn') end
      local jobs = redis.call('ZRANGE', tk .. ':g:' .. g .. ':r', 0, -1, 'WITHSCORES')
      if #jobs == 0 then say(t, 'group ' .. g .. ' placed without ready jobs') end
      sum = sum + #jobs / 2
      for j = 1, #jobs, 2 do
        local f = redis.call('HMGET', ns .. 'j:' .. string.sub(jobs[j], 2), 's', 'g', 'p')
        if f[1] ~= 'ready' or (f[2] or '') ~= g or f[3] ~= jobs[j + 1]
            or redis.call('ZSCORE', rk, jobs[j]) ~= jobs[j + 1] then
          say(t, 'group ' .. g .. ' holds ' .. jobs[j] .. ' wrongly')
        end
      end
      local tm = string.char(64 + #place[i + 1]) .. place[i + 1] .. g
      local score = redis.call('ZSCORE', turns, tm)
      if score and score ~= jobs[2] then say(t, 'group ' .. g .. ' scored off its best') end
    end
    if sum ~= redis.call('ZCARD', rk) then
      say(t, 'groups hold ' .. sum .. ' ready jobs, the tube ' .. redis.call('ZCARD', rk))
    end
    if redis.call('ZCARD', turns) > #place / 2 then say(t, 'turns without places') end
    local ix = redis.call('HGET', tk, 'ix')
    local first = redis.call('ZRANGE', turns, 0, 0)[1]
    if ix then
      local head = first and redis.call('ZRANGE',
        tk .. ':g:' .. string.sub(first, 2 + string.byte(first, 1) - 64) .. ':r', 0, 0)[1]
      if ix ~= (head or '') .. ':' .. t then say(t, 'index ' .. ix .. ' is not the turn head') end
    end
  else
    if redis.call('EXISTS', turns, places) > 0 then say(t, 'group keys out of group mode') end
    for _, m in ipairs(redis.call('ZRANGE', rk, 0, -1)) do
      if redis.call('HEXISTS', ns .. 'j:' .. string.sub(m, 2), 'g') == 1 then
        say(t, 'ready job ' .. m .. ' has a group out of group mode')
      end
    end
  end
end
for key, n in pairs(reserved) do bad[#bad + 1] = key .. ': ' .. n .. ' counted, not in gc' end
return bad
"""


def count_mismatches(url: str) -> list[str]:
    """Every namespace root of the Redis at ``url`` whose counts differ from its sets, with
    both; empty when all agree."""
    client = redis.Redis.from_url(url)
    try:
        roots = {key[:-len(b"tubes")] for key in client.scan_iter(match="*:tubes", count=1000)}
        roots |= {key[:-len(b"counts")] for key in client.scan_iter(match="*:counts",
                                                                       count=1000)}
        wrong = []
        for root in sorted(roots):
            got = client.eval(_COMPARE, 1, root)
            counted, held, tubes_off = got[:5], got[5:10], got[10]
            if counted != held:
                wrong.append(f"{root.decode(errors='replace')}: counted (urgent, other ready, "
                              f"delayed, buried, held) {counted}, the sets hold {held}")
            if tubes_off:
                wrong.append(f"{root.decode(errors='replace')}: {tubes_off} tubes' nheld differ "
                              f"from their held sets")
            wrong += [f"{root.decode(errors='replace')}: groups of {line.decode()}"
                      for line in client.eval(_GROUPS, 1, root)]
        return wrong
    finally:
        client.close()
