"""The Redis-side cost of the hot path's scripts: a base revision's against the working tree's.

    .venv/bin/python -m bench.lua_cost --base REV [--cycles 3000] [--reps 10]

One cycle is put.lua + reserve.lua + delete.lua on one tube with no settings (events off), sent
pipelined to a private redis-server. For each version it reports Redis's own time per cycle
(INFO commandstats, EVALSHA usec: what the scripts cost inside Redis, without the network or
tubeq's Python) and the redis.call()s the scripts made per cycle (the commandstats of every
other command). The call count is exact and the same on any machine; the time is noisy on a
shared one, so repetitions alternate between the versions. Used for issue 10's reserve limits,
whose cost for a tube without limits must stay one cheap check (bench/RESULTS-limits.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import redis

from bench.ab import snapshot_revision
from bench.servers import REPO_ROOT
from tubeq.redis_process import RedisProcess

SCRIPTS = ("connect", "put", "reserve", "delete")


def load_sources(tree: Path) -> dict[str, bytes]:
    """The assembled scripts of the ``tubeq`` package under ``tree`` (its own scripts.py)."""
    sys.path.insert(0, str(tree))
    for name in [m for m in sys.modules if m == "tubeq" or m.startswith("tubeq.")]:
        del sys.modules[name]
    try:
        import tubeq.scripts

        return {name: tubeq.scripts.load_script(name).source for name in SCRIPTS}
    finally:
        sys.path.remove(str(tree))
        for name in [m for m in sys.modules if m == "tubeq" or m.startswith("tubeq.")]:
            del sys.modules[name]


def run_cycles(r: redis.Redis, sources: dict[str, bytes], cycles: int,
               ) -> tuple[float, dict[str, float]]:
    """Redis's usec per cycle, and the commands the scripts called per cycle."""
    r.flushall()
    sha = {name: r.script_load(source) for name, source in sources.items()}
    root, now = "{bench}:", 1_700_000_000_000
    r.evalsha(sha["connect"], 1, root, "inst", "inst:1", now)
    r.config_resetstat()
    pipe = r.pipeline(transaction=False)
    for i in range(cycles):
        pipe.evalsha(sha["put"], 1, root, 0, "inst", "default", 100, 0, 60, b"x" * 100, now)
        pipe.evalsha(sha["reserve"], 1, root, 0, "inst", "inst:1", now, 1, "")
        pipe.evalsha(sha["delete"], 1, root, 0, "inst", "inst:1", i + 1, now)
    pipe.execute()
    stats = r.info("commandstats")
    inner = {key.removeprefix("cmdstat_"): value["calls"] / cycles for key, value in stats.items()
             if key not in ("cmdstat_evalsha", "cmdstat_config|resetstat")}
    return stats["cmdstat_evalsha"]["usec"] / cycles, inner


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="git revision of the base tubeq")
    p.add_argument("--cycles", type=int, default=3000)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        base_tree = snapshot_revision(args.base, Path(work) / "base")
        sources = {"base": load_sources(base_tree), "new": load_sources(REPO_ROOT)}
        server = RedisProcess(Path(work) / "redis")
        server.start()
        try:
            r = redis.Redis.from_url(server.url)
            times: dict[str, list[float]] = {"base": [], "new": []}
            calls: dict[str, dict[str, float]] = {}
            for rep in range(args.reps):
                for kind in ("base", "new") if rep % 2 == 0 else ("new", "base"):
                    usec, calls[kind] = run_cycles(r, sources[kind], args.cycles)
                    times[kind].append(usec)
            r.close()
        finally:
            server.stop()
    for kind in ("base", "new"):
        t = times[kind]
        print(f"{kind}: {statistics.median(t):.1f} us per cycle in Redis (median; "
              f"{min(t):.1f}-{max(t):.1f}), {sum(calls[kind].values()):.0f} redis.call()s: "
              + ", ".join(f"{name} {n:g}" for name, n in sorted(calls[kind].items())))
    ratio = statistics.median(times["new"]) / statistics.median(times["base"])
    print(f"new / base time: {ratio:.3f}")


if __name__ == "__main__":
    main()
