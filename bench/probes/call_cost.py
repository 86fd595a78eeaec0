"""What a request/reply costs the server: CALLERS bundled clients each awaiting
``client.call(...)`` in a loop against a ``consume()`` worker (a process of its own, handler
returning the body upper-cased), for SECONDS; calls per second, and tubeq's and Redis's CPU
per call from /proc.

    .venv/bin/python -m bench.probes.call_cost [--callers 32] [--seconds 6] [--reps 3]
                                               [--base REV] [--shared]

``--shared``: the callers share one client (its calls in flight together on one connection),
as a web app's handlers would; else each has its own.

With ``--base REV`` the tubeq server of ``REV`` runs too, each repetition alternating which goes
first (A/B interleaved, one CPU model: printed); callers and worker are this working tree's
client on both sides, so what differs is the server. The callers, the worker, tubeq and Redis
share the machine's cores: calls per second says little on two cores, the CPU per call is the
figure. Loopback only; one private redis-server and tubeq per side, stopped by PID; every loop
is bounded by ``--seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

from bench.harness.machine import cpu_model
from bench.harness.procstat import CpuSnapshot, CpuWindow
from bench.harness.servers import LOOPBACK, Tubeq, snapshot_revision, snapshot_tubeq

TUBE = "calls"


def _worker(port: int, concurrency: int) -> None:
    """A consume() worker answering every call with the body upper-cased, until killed."""
    import uvloop

    from tubeq.client import Client, Job

    async def run() -> None:
        async with Client(LOOPBACK, port) as client:
            async def answer(job: Job) -> bytes:
                return job.body.upper()

            await client.consume(TUBE, concurrency=concurrency).run(answer)

    uvloop.run(run())


def _calls(port: int, callers: int, seconds: float, shared: bool) -> int:
    """Calls answered by ``callers`` callers calling one after another for ``seconds``, with a
    client each or (``shared``) one client for all."""
    import uvloop

    from tubeq.client import Client

    async def run() -> int:
        done = 0
        end = time.monotonic() + seconds

        async def caller(client: Client) -> None:
            nonlocal done
            while time.monotonic() < end:
                if await client.call(TUBE, b"x" * 100, timeout=10) != b"X" * 100:
                    raise RuntimeError("a call answered another job's result")
                done += 1

        clients = [Client(LOOPBACK, port) for _ in range(1 if shared else callers)]
        try:
            await asyncio.gather(*(caller(clients[i % len(clients)]) for i in range(callers)))
        finally:
            await asyncio.gather(*(client.aclose() for client in clients))
        return done

    return uvloop.run(run())


def measure(server: Tubeq, callers: int, seconds: float, shared: bool) -> dict[str, float]:
    worker = multiprocessing.Process(target=_worker, args=(server.port, callers))
    worker.start()
    try:
        _calls(server.port, callers, 1.0, shared)  # warm-up: connections, scripts, the tube
        start = CpuSnapshot.take(server.pids)
        calls = _calls(server.port, callers, seconds, shared)
        window = CpuWindow.between(start, CpuSnapshot.take(server.pids))
    finally:
        worker.kill()
        worker.join(10)
    figures = {"calls/s": calls / window.seconds}
    for label in ("tubeq", "redis"):
        percent = window.percent_by_label[label] or 0.0
        figures[f"{label} us/call"] = percent / 100 * window.seconds / calls * 1e6
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--base", help="git revision of a base tubeq to run interleaved")
    parser.add_argument("--shared", action="store_true", help="one client for all callers")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="call-cost-") as tmp:
        sides = {"head": snapshot_tubeq(Path(tmp) / "head")}
        if args.base:
            sides["base"] = snapshot_revision(args.base, Path(tmp) / "base")
        results: dict[str, list[dict[str, float]]] = {}
        for rep in range(args.reps):
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for side in order:
                server = Tubeq(Path(tmp) / f"logs-{side}", code_dir=sides[side],
                               flags=("--events", "off"))
                server.start()
                try:
                    figures = measure(server, args.callers, args.seconds, args.shared)
                finally:
                    server.stop()
                results.setdefault(side, []).append(figures)
                print(f"rep {rep} {side:4} " + ", ".join(f"{k} {v:.0f}"
                                                         for k, v in figures.items()),
                      flush=True)
    print(f"\n{cpu_model()}, {args.callers} callers"
          f"{' sharing one client' if args.shared else ''}, {args.seconds:g} s, {args.reps} "
          "reps; medians (min-max)")
    for side, runs in results.items():
        print(f"{side:4} " + ", ".join(
            f"{key} {statistics.median(r[key] for r in runs):.0f} "
            f"({min(r[key] for r in runs):.0f}-{max(r[key] for r in runs):.0f})"
            for key in runs[0]))


if __name__ == "__main__":
    main()
