"""What groups inside a tube cost Redis per reserve and delete, counted, not timed.

    .venv/bin/python -m bench.probes.group_cost [--jobs 2000] [--no-callgrind] [--base REV]

Three loads into one tube of a private redis-server, each through the store's own calls
(tubeq.store.store.Store, events off): jobs without a group, jobs of one group, jobs spread
over 51 groups (put-with group=). Then ``--jobs`` reserves, each followed by its delete, one at
a time. Printed per load: the redis.call()s the scripts made per reserve+delete and per put
(INFO commandstats of every command but the script calls: exact, the same on any machine),
and with valgrind the instructions Redis executed per put (each awaited alone) and per
reserve+delete (callgrind's Ir, zeroed before each phase and dumped after: a figure that does
not drift with a shared host's load).
``--base REV`` runs the load without groups once more with REV's scripts (its ``tubeq/``, a
``git archive`` snapshot, in a process of its own), to show a tube without groups pays nothing.
Loopback only; every redis-server is started here and stopped by its PID; each phase is bounded
by ``PHASE_TIMEOUT_S``.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from bench.harness.machine import cpu_model
from bench.harness.paths import REPO_ROOT
from bench.harness.servers import snapshot_revision
from tubeq.redisio.client import RedisClient
from tubeq.redisio.process import RedisProcess, free_port
from tubeq.store.keys import Keys
from tubeq.store.records import Reservation
from tubeq.store.store import Store

LOOPBACK = "127.0.0.1"
TOKEN = "inst:1"
TUBE = "q"
PHASE_TIMEOUT_S = 600.0
LOADS: dict[str, Sequence[str] | None] = {
    "no groups": None,
    "one group": ["big"],
    "51 groups": [f"g{i}" for i in range(51)],
}
_SCRIPT_CALLS = ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_config", "cmdstat_info")


async def _open(url: str) -> tuple[RedisClient, Store]:
    client = await RedisClient.connect(url)
    store = Store(client, Keys("cost"), "inst", lambda: 1_700_000_000_000, events_maxlen=0)
    await store.load_scripts()
    await store.heartbeat()
    await store.connect(TOKEN)
    await store.change_watches(TOKEN, [("+w", TUBE), ("-w", "default")])
    return client, store


async def _put_one(store: Store, groups: Sequence[str] | None, i: int) -> None:
    await store.put_with(TUBE, 0, 0, 600, b"x",
                         (("group", groups[i % len(groups)]),) if groups else ())


async def _put(store: Store, groups: Sequence[str] | None, count: int) -> None:
    await asyncio.gather(*(_put_one(store, groups, i) for i in range(count)))


async def _cycles(store: Store, count: int) -> None:
    for _ in range(count):
        r = await store.reserve(TOKEN)
        assert isinstance(r, Reservation), r
        await store.delete(TOKEN, r.id)


def _calls(raw: redis.Redis) -> int:
    stats = raw.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if not k.startswith(_SCRIPT_CALLS))


async def count_calls(groups: Sequence[str] | None, jobs: int) -> tuple[float, float]:
    """redis.call()s per put and per reserve+delete."""
    with tempfile.TemporaryDirectory() as folder:
        server = RedisProcess(Path(folder))
        server.start()
        try:
            client, store = await _open(server.url)
            raw = redis.Redis.from_url(server.url)
            await _put(store, groups, 100)
            raw.config_resetstat()
            await _put(store, groups, jobs)
            per_put = _calls(raw) / jobs
            raw.config_resetstat()
            await _cycles(store, jobs)
            per_cycle = _calls(raw) / jobs
            raw.close()
            await client.close()
        finally:
            server.stop()
    return per_put, per_cycle


def _ir(path: str) -> int:
    total = 0
    with open(path) as f:
        for line in f:
            found = re.match(r"^(?:summary|totals): (\d+)", line)
            if found:
                total = int(found[1])
    return total


def _callgrind(pid: int, what: str) -> None:
    subprocess.run(["callgrind_control", what, str(pid)], capture_output=True,
                   timeout=PHASE_TIMEOUT_S, check=True)


async def count_instructions(groups: Sequence[str] | None, jobs: int) -> tuple[float, float]:
    """Redis's instructions per put (each awaited alone) and per reserve+delete, under
    callgrind."""
    with tempfile.TemporaryDirectory() as folder:
        port = free_port(LOOPBACK)
        out = os.path.join(folder, "callgrind.out")
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "redis-server",
             "--port", str(port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            while True:
                try:
                    socket.create_connection((LOOPBACK, port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            client, store = await _open(f"redis://{LOOPBACK}:{port}")
            await _put(store, groups, 100)
            _callgrind(proc.pid, "-z")
            for i in range(jobs):
                await _put_one(store, groups, i)
            _callgrind(proc.pid, "-d")
            _callgrind(proc.pid, "-z")
            await asyncio.wait_for(_cycles(store, jobs), PHASE_TIMEOUT_S)
            _callgrind(proc.pid, "-d")
            await client.close()
        finally:
            proc.terminate()
            proc.wait(60)
        dumps = sorted(glob.glob(out + ".*"), key=lambda name: int(name.rsplit(".", 1)[1]))
        return _ir(dumps[-2]) / jobs, _ir(dumps[-1]) / jobs


async def row(name: str, jobs: int, callgrind: bool) -> str:
    groups = LOADS[name]
    per_put, per_cycle = await count_calls(groups, jobs)
    ir = "- | -"
    if callgrind:
        ir_put, ir_cycle = await count_instructions(groups, jobs)
        ir = f"{ir_put / 1000:,.0f}k | {ir_cycle / 1000:,.0f}k"
    return f"{per_put:.1f} | {per_cycle:.1f} | {ir} |"


async def run(jobs: int, callgrind: bool, base: str | None) -> None:
    print(f"cpu: {cpu_model()}; load average {os.getloadavg()}; {jobs:,} jobs per load")
    print("| load | redis.call()s per put | per reserve+delete | Redis instructions per put | "
          "per reserve+delete |")
    print("|---|---|---|---|---|")
    for name in LOADS:
        print(f"| {name} | {await row(name, jobs, callgrind)}", flush=True)
    if base is not None:
        with tempfile.TemporaryDirectory() as folder:
            code = snapshot_revision(base, Path(folder))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(code), str(REPO_ROOT)))}
            argv = [sys.executable, "-m", "bench.probes.group_cost", "--row", "no groups",
                    "--jobs", str(jobs), *(() if callgrind else ("--no-callgrind",))]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True,
                                  timeout=PHASE_TIMEOUT_S)
            print(f"| no groups, {base}'s scripts | {done.stdout.strip()}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.group_cost",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--no-callgrind", action="store_true", help="only count the calls")
    p.add_argument("--base", help="also the load without groups with this revision's scripts")
    p.add_argument("--row", choices=tuple(LOADS), help=argparse.SUPPRESS)  # --base's own run
    args = p.parse_args(argv)
    callgrind = not args.no_callgrind and shutil.which("valgrind") is not None
    if args.row is not None:
        print(asyncio.run(row(args.row, args.jobs, callgrind)))
        return 0
    asyncio.run(run(args.jobs, callgrind, args.base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
