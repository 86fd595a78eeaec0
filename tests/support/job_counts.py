"""The invariant behind stats and the scrapes: each namespace root's jobs by state
(``{p}:counts``, kept as jobs move by the scripts: tubeq/store/lua/includes/jobs.lua) equal what
its tubes' sets hold.

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
        return wrong
    finally:
        client.close()
