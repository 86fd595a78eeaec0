"""The Redis-side cost of the hot path's scripts: a base revision's against the working tree's.

    .venv/bin/python -m bench.probes.lua_cost --base REV [--cycles 3000] [--reps 10] [--evalsha]
        [--events] [--batch N]

One cycle is put + reserve + delete on one tube with no settings (events off; ``--events``:
on, three XADDs a cycle; ``--batch N``: N puts, one reserve of N jobs and one delete_many of
them, as a push consumer's batch, times per job), sent pipelined
to a private redis-server, each script called as the revision's server calls it: as a function
of its library (FCALL) where the revision has one (tubeq.store.scripts.library), else by EVALSHA;
``--evalsha`` calls both revisions' scripts by EVALSHA. For each version it reports Redis's own
time per cycle (INFO commandstats, the script calls' usec: what the scripts cost inside Redis,
without the network or tubeq's Python) and the redis.call()s the scripts made per cycle (the
commandstats of every other command). The call count is exact and the same on any machine; the
time is noisy on a shared one, so repetitions alternate between the versions. The reserve
limits' cost for a tube without limits (one cheap check, bench/RESULTS-limits.md) and the move to
Redis Functions were judged by it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.harness.paths import REPO_ROOT
from bench.harness.servers import snapshot_revision
from tubeq.redisio.process import RedisProcess

SCRIPTS = ("connect", "put", "reserve", "delete", "delete_many")
SCRIPT_CALLS = ("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_fcall_ro")


@dataclass(frozen=True)
class Version:
    sources: dict[str, bytes]  # script name -> its EVALSHA source
    library: bytes | None  # the FUNCTION LOAD source, when calls go by FCALL
    functions: dict[str, str]  # script name -> function name


def load_version(tree: Path, evalsha: bool) -> Version:
    """The scripts of the ``tubeq`` package under ``tree`` (its own scripts.py), called as that
    revision's server calls them (or by EVALSHA)."""
    sys.path.insert(0, str(tree))
    for name in [m for m in sys.modules if m == "tubeq" or m.startswith("tubeq.")]:
        del sys.modules[name]
    try:
        import tubeq.store.scripts

        sources = {name: tubeq.store.scripts.load_script(name).source for name in SCRIPTS}
        make_library = getattr(tubeq.store.scripts, "library", None)
        if evalsha or make_library is None:
            return Version(sources, None, {})
        lib = make_library()
        return Version(sources, lib.source, dict(lib.functions))
    finally:
        sys.path.remove(str(tree))
        for name in [m for m in sys.modules if m == "tubeq" or m.startswith("tubeq.")]:
            del sys.modules[name]


# The events cap the scripts are called with when ``--events`` (0: events off).
EVENTS_CAP = 1_000_000


def run_cycles(r: redis.Redis, version: Version, cycles: int, events_cap: int = 0,
               batch: int = 0) -> tuple[float, dict[str, float]]:
    """Redis's usec per cycle, and the commands the scripts called per cycle (``batch``: per
    job of the batched cycles)."""
    r.flushall()
    r.function_flush()
    sha = {name: r.script_load(source) for name, source in version.sources.items()}
    if version.library is not None:
        r.function_load(version.library.decode(), replace=True)
    root, now = "{bench}:", 1_700_000_000_000
    r.evalsha(sha["connect"], 1, root, "inst", "inst:1", now)
    r.config_resetstat()
    pipe = r.pipeline(transaction=False)

    def call(name: str, *args: object) -> None:
        if version.library is None:
            pipe.evalsha(sha[name], 1, root, *args)  # type: ignore[arg-type]
        else:
            pipe.fcall(version.functions[name], 1, root, *args)

    if batch:
        for i in range(cycles // batch):
            for _ in range(batch):
                call("put", events_cap, "inst", "default", 100, 0, 60, b"x" * 100, now)
            call("reserve", events_cap, "inst", "inst:1", now, batch, "")
            call("delete_many", events_cap, "inst", "inst:1", now, 0,
                 *range(i * batch + 1, (i + 1) * batch + 1))
        cycles = cycles // batch * batch
    else:
        for i in range(cycles):
            call("put", events_cap, "inst", "default", 100, 0, 60, b"x" * 100, now)
            call("reserve", events_cap, "inst", "inst:1", now, 1, "")
            call("delete", events_cap, "inst", "inst:1", i + 1, now)
    replies = pipe.execute()
    last = replies[-1]  # delete's answer, or delete_many's per id: 0 is "not found"
    if last == 0 or (batch and 0 in last):
        raise RuntimeError("the last cycle's delete found no job: the scripts did not run")
    stats = r.info("commandstats")
    inner = {key.removeprefix("cmdstat_"): value["calls"] / cycles for key, value in stats.items()
             if key not in (*SCRIPT_CALLS, "cmdstat_config|resetstat")}
    usec = sum(stats.get(key, {}).get("usec", 0) for key in SCRIPT_CALLS)
    return usec / cycles, inner


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="git revision of the base tubeq")
    p.add_argument("--cycles", type=int, default=3000)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--evalsha", action="store_true",
                   help="call both versions' scripts by EVALSHA (no function library)")
    p.add_argument("--events", action="store_true", help="lifecycle events on")
    p.add_argument("--batch", type=int, default=0,
                   help="N puts, a reserve of N and a delete_many of N per cycle")
    args = p.parse_args()
    events_cap = EVENTS_CAP if args.events else 0
    with tempfile.TemporaryDirectory() as work:
        base_tree = snapshot_revision(args.base, Path(work) / "base")
        versions = {"base": load_version(base_tree, args.evalsha),
                    "new": load_version(REPO_ROOT, args.evalsha)}
        server = RedisProcess(Path(work) / "redis")
        server.start()
        try:
            r = redis.Redis.from_url(server.url)
            times: dict[str, list[float]] = {"base": [], "new": []}
            calls: dict[str, dict[str, float]] = {}
            for rep in range(args.reps):
                for kind in ("base", "new") if rep % 2 == 0 else ("new", "base"):
                    usec, calls[kind] = run_cycles(r, versions[kind], args.cycles, events_cap,
                                                   args.batch)
                    times[kind].append(usec)
            r.close()
        finally:
            server.stop()
    for kind in ("base", "new"):
        t = times[kind]
        how = "EVALSHA" if versions[kind].library is None else "FCALL"
        unit = "job" if args.batch else "cycle"
        print(f"{kind} ({how}): {statistics.median(t):.1f} us per {unit} in Redis (median; "
              f"{min(t):.1f}-{max(t):.1f}), {sum(calls[kind].values()):.0f} redis.call()s: "
              + ", ".join(f"{name} {n:g}" for name, n in sorted(calls[kind].items())))
    ratio = statistics.median(times["new"]) / statistics.median(times["base"])
    print(f"new / base time: {ratio:.3f}")


if __name__ == "__main__":
    main()
