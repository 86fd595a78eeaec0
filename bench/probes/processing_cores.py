"""What the second core gives the processing of the peers benchmark: the same ``consume()`` run
with the worker, tubeq and its Redis free to use both cores, and with all three held on one.

    .venv/bin/python -m bench.probes.processing_cores [--jobs 20000] [--reps 3]
        [--concurrency 32] [--connections N] [--events on]

Each repetition runs both placements (the order alternating), each on a fresh private
redis-server and tubeq process: the tube is filled with ``put_many``, then this process runs
``Client.consume(concurrency=...)`` with a handler that only returns, as the peers benchmark's
worker does, on uvloop. The window runs from the consumer's start to the last handler's
return. Printed per run and as medians: jobs/s, CPU us per job of the worker (this process),
tubeq and Redis (/proc), the cores the three used together, and ``other`` (the rest of the
machine). One core = ``sched_setaffinity`` to the first CPU of this process before the servers
start (they inherit it). Loopback only; servers stopped by PID; every loop bounded by
``--jobs``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.harness.machine import cpu_model
from bench.harness.procstat import CpuSnapshot, CpuWindow
from bench.harness.servers import EVENTS_OFF, EVENTS_ON, LOOPBACK, Tubeq

BODY = b"x" * 100
FILL_BATCH = 1000
TUBE = "processing-cores"
PLACEMENTS = ("two cores", "one core")
DEADLINE_S = 120.0


@contextmanager
def placed(placement: str) -> Iterator[None]:
    """This process (and what it starts meanwhile) on every CPU it may use, or on the first."""
    allowed = os.sched_getaffinity(0)
    if placement == "one core":
        os.sched_setaffinity(0, {min(allowed)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


async def fill_then_consume(port: int, pids: dict[str, int], jobs: int, concurrency: int,
                            connections: int | None) -> dict[str, float]:
    from tubeq.client import Client

    client = Client(LOOPBACK, port)
    await client.connect()
    try:
        await client.use(TUBE)
        for start in range(0, jobs, FILL_BATCH):
            await client.put_many([BODY] * min(FILL_BATCH, jobs - start))
        handled = 0
        all_handled = asyncio.Event()

        async def handler(job: object) -> None:
            nonlocal handled
            handled += 1
            if handled == jobs:
                all_handled.set()

        consumer = client.consume(TUBE, concurrency=concurrency, connections=connections)
        servers = CpuSnapshot.take(pids)
        worker = time.process_time()
        runner = asyncio.get_running_loop().create_task(consumer.run(handler))
        async with asyncio.timeout(DEADLINE_S):
            await all_handled.wait()
        worker = time.process_time() - worker
        window = CpuWindow.between(servers, CpuSnapshot.take(pids))
        consumer.stop()
        await runner
    finally:
        await client.aclose()
    figures = {"jobs/s": jobs / window.seconds, "worker": worker / jobs * 1e6}
    for label in ("tubeq", "redis"):
        figures[label] = (window.percent_by_label[label] or 0.0) / 100 * window.seconds / jobs * 1e6
    figures["cores"] = (figures["worker"] + figures["tubeq"] + figures["redis"]) * jobs / 1e6 / (
        window.seconds)
    figures["other"] = window.other_cores
    return figures


def run_once(tmp: Path, placement: str, args: argparse.Namespace) -> dict[str, float]:
    import uvloop

    flags = EVENTS_ON if args.events == "on" else EVENTS_OFF
    with placed(placement):
        server = Tubeq(tmp / f"logs-{placement.replace(' ', '-')}", flags=flags)
        server.start()
        try:
            pids = {label: pid for label, pid in server.pids.items() if label in ("tubeq", "redis")}
            return uvloop.run(fill_then_consume(server.port, pids, args.jobs, args.concurrency,
                                                args.connections))
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--connections", type=int, default=None,
                        help="consume()'s connections (default: its own default)")
    parser.add_argument("--events", choices=("on", "off"), default="on")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        parser.error("this process may use one CPU only: nothing to compare")
    results: dict[str, list[dict[str, float]]] = {placement: [] for placement in PLACEMENTS}
    with tempfile.TemporaryDirectory(prefix="processing-cores-") as tmp:
        for rep in range(args.reps):
            order = PLACEMENTS if rep % 2 == 0 else tuple(reversed(PLACEMENTS))
            for placement in order:
                figures = run_once(Path(tmp), placement, args)
                results[placement].append(figures)
                print(f"rep {rep} {placement:9} " + ", ".join(
                    f"{name} {value:,.2f}" for name, value in figures.items()), flush=True)
    print(f"\n{cpu_model()}, {args.jobs} jobs, concurrency {args.concurrency}, connections "
          f"{args.connections or 'default'}, events {args.events}, {args.reps} reps; medians "
          f"(min-max of jobs/s); CPU in us per job")
    for placement, runs in results.items():
        rates = [run["jobs/s"] for run in runs]
        print(f"{placement:9} {statistics.median(rates):8,.0f} jobs/s ({min(rates):,.0f}-"
              f"{max(rates):,.0f}), " + ", ".join(
                  f"{name} {statistics.median(run[name] for run in runs):.2f}"
                  for name in ("worker", "tubeq", "redis", "cores", "other")))


if __name__ == "__main__":
    main()
