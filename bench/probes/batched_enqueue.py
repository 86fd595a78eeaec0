"""The peers' batched enqueue alone: ``await client.put_many(...)`` of 1000 bodies in a loop,
each awaited, against tubeq with events on; client and server of one revision together.

    .venv/bin/python -m bench.probes.batched_enqueue [--jobs 200000] [--reps 3] [--base REV]

With ``--base REV`` the client and server of ``REV`` run too, each repetition alternating
which goes first (A/B interleaved, one CPU model: printed). Each side's producer is a process
of its own that imports ``tubeq`` from that side's snapshot. Loopback only: one private
redis-server and one tubeq process per side and repetition, stopped by PID; the loop is
bounded by ``--jobs``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness.machine import cpu_model
from bench.harness.paths import REPO_ROOT
from bench.harness.procstat import CpuSnapshot, CpuWindow
from bench.harness.servers import EVENTS_ON, LOOPBACK, Tubeq, snapshot_revision, snapshot_tubeq

CHUNK = 1000
BODY = b"{}"  # the peers' job
WARM_UP = 5 * CHUNK
DRIVER_TIMEOUT_S = 300.0


def drive(port: int, jobs: int) -> float:
    """Run in the side's own process: ``jobs`` put_many'd in chunks of CHUNK; seconds taken."""
    import uvloop

    from tubeq.client import Client

    async def run() -> float:
        client = Client(LOOPBACK, port)
        await client.connect()
        await client.use("batched")
        try:
            for _ in range(WARM_UP // CHUNK):
                await client.put_many([BODY] * CHUNK)
            began = time.perf_counter()
            for _ in range(jobs // CHUNK):
                ids = await client.put_many([BODY] * CHUNK)
                if not all(isinstance(i, int) for i in ids):
                    raise RuntimeError(f"put_many refused entries: {ids[:3]}")
            return time.perf_counter() - began
        finally:
            await client.aclose()

    return uvloop.run(run())


def measure(code_dir: Path, log_dir: Path, jobs: int) -> dict[str, float]:
    """jobs/s of one side, and tubeq's and Redis's CPU us per job over the whole driver run
    (its warm-up included: WARM_UP is small beside ``jobs``)."""
    server = Tubeq(log_dir, code_dir=code_dir, flags=EVENTS_ON)
    server.start()
    try:
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        start = CpuSnapshot.take(server.pids)
        # cwd first on sys.path: ``tubeq`` is the side's snapshot, ``bench`` the repository's.
        done = subprocess.run(
            [sys.executable, "-m", "bench.probes.batched_enqueue", "--drive", str(server.port),
             "--jobs", str(jobs)],
            cwd=code_dir, env=env, capture_output=True, text=True, check=True,
            timeout=DRIVER_TIMEOUT_S)
        window = CpuWindow.between(start, CpuSnapshot.take(server.pids))
    finally:
        server.stop()
    seconds = float(done.stdout.strip().splitlines()[-1])
    figures = {"jobs/s": jobs / seconds, "other cores": window.other_cores}
    for label in ("tubeq", "redis"):
        percent = window.percent_by_label[label] or 0.0
        figures[label] = percent / 100 * window.seconds / (jobs + WARM_UP) * 1e6
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--base", help="git revision of a base tubeq (client and server)")
    parser.add_argument("--drive", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive is not None:
        print(drive(args.drive, args.jobs))
        return
    with tempfile.TemporaryDirectory(prefix="batched-enqueue-") as tmp:
        sides = {"head": snapshot_tubeq(Path(tmp) / "head")}
        if args.base:
            sides["base"] = snapshot_revision(args.base, Path(tmp) / "base")
        results: dict[str, list[dict[str, float]]] = {}
        for rep in range(args.reps):
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for side in order:
                figures = measure(sides[side], Path(tmp) / f"logs-{side}", args.jobs)
                results.setdefault(side, []).append(figures)
                print(f"rep {rep} {side:4} " + ", ".join(
                    f"{k} {v:,.2f}" for k, v in figures.items()), flush=True)
    print(f"\n{cpu_model()}, {args.jobs:,} jobs in put_many of {CHUNK}, events on, "
          f"{args.reps} reps; medians (min-max of jobs/s), CPU us per job")
    for side, runs in results.items():
        rates = [r["jobs/s"] for r in runs]
        print(f"{side:4} {statistics.median(rates):9,.0f} jobs/s ({min(rates):,.0f}-"
              f"{max(rates):,.0f}), tubeq {statistics.median(r['tubeq'] for r in runs):.2f}, "
              f"redis {statistics.median(r['redis'] for r in runs):.2f}, other cores "
              f"{max(r['other cores'] for r in runs):.2f}")


if __name__ == "__main__":
    main()
