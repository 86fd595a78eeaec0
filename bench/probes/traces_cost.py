"""What traces cost a tubeq that exports them: CPU per job of the tubeq process and its Redis.

    .venv/bin/python -m bench.probes.traces_cost [--jobs 20000] [--repetitions 3]

Five kinds, each repetition starting a fresh tubeq (private redis-server, events off as with
``--redis``) per kind, the order alternating: ``off`` (no ``--otel-endpoint``, jobs put
without a context: the default), ``off+ctx`` (no flag, every job put with ``traceparent=``:
what keeping the context costs), ``on`` (``--otel-endpoint`` to a receiver here that answers
every export 200 and keeps nothing, every job with a context: the put, queue-wait and
reservation spans), ``on-unsampled`` (the flag, every job's context not sampled: no span) and
``on-plain`` (the flag, jobs without a context: the one HMGET per reservation a traced process
makes). Each run puts ``--jobs`` jobs with the bundled client's
``put_with`` (64 in flight) while one ``consume(concurrency=32)`` deletes them, and reads the
CPU the tubeq process and its redis-server spent from /proc (the client's own is not counted;
no tracer provider is set here, so the consumer asks nothing more per job). Prints each run,
then the medians against ``off``. CPU time, not throughput: it swings far less with other
tenants of the machine. Loopback only; every process started here is stopped by its PID; each
run is bounded by RUN_TIMEOUT_S.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.harness.machine import cpu_model
from bench.harness.paths import OUT_DIR
from bench.harness.procstat import CLOCK_TICKS_PER_S, process_cpu_ticks
from bench.harness.servers import LOOPBACK, Tubeq
from tubeq.client import Client, Job

RUN_TIMEOUT_S = 300.0
IN_FLIGHT = 64
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = TRACEPARENT[:-2] + "00"  # the producer did not sample this trace
KINDS = ("off", "off+ctx", "on", "on-unsampled", "on-plain")


class _Discard(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes every export and keeps nothing."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def drive(port: int, jobs: int, context: str) -> None:
    """``jobs`` puts (with ``context``, "": none) and a consumer that deletes them all."""
    done = asyncio.Event()
    handled = 0

    async def handle(job: Job) -> None:
        nonlocal handled
        handled += 1
        if handled >= jobs:
            done.set()

    async with Client(LOOPBACK, port) as producer, Client(LOOPBACK, port) as worker:
        await producer.use("traced")
        consumer = worker.consume("traced", concurrency=32)
        running = asyncio.create_task(consumer.run(handle))
        for start in range(0, jobs, IN_FLIGHT):
            await asyncio.gather(*(producer.put_with(b"x" * 100, traceparent=context)
                                   for _ in range(min(IN_FLIGHT, jobs - start))))
        await done.wait()
        consumer.stop()
        await running


def one_run(kind: str, jobs: int, log_dir: Path, endpoint: str) -> dict[str, float]:
    flags = ("--otel-endpoint", endpoint) if kind.startswith("on") else ()
    server = Tubeq(log_dir, flags=flags)
    server.start()
    try:
        pids = server.pids
        before = {k: process_cpu_ticks(p) or 0 for k, p in pids.items()}
        context = {"off+ctx": TRACEPARENT, "on": TRACEPARENT,
                   "on-unsampled": UNSAMPLED}.get(kind, "")
        asyncio.run(asyncio.wait_for(drive(server.port, jobs, context), RUN_TIMEOUT_S))
        after = {k: process_cpu_ticks(p) or 0 for k, p in pids.items()}
    finally:
        server.stop()
    return {k: (after[k] - before[k]) / CLOCK_TICKS_PER_S / jobs * 1e6 for k in pids}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probes.traces_cost",
                                description="What exporting traces costs, in CPU per job.")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per run")
    p.add_argument("--repetitions", type=int, default=3, help="repetitions of every kind")
    args = p.parse_args()
    receiver = ThreadingHTTPServer((LOOPBACK, 0), _Discard)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    endpoint = f"http://{LOOPBACK}:{receiver.server_address[1]}"
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    try:
        for rep in range(args.repetitions):
            order = KINDS if rep % 2 == 0 else tuple(reversed(KINDS))
            for kind in order:
                figures = one_run(kind, args.jobs, OUT_DIR / "traces-cost", endpoint)
                runs[kind].append(figures)
                print(f"rep {rep} {kind:<8}: tubeq {figures['tubeq']:6.1f} us/job, "
                      f"redis {figures['redis']:6.1f} us/job", flush=True)
    finally:
        receiver.shutdown()
    print(f"cpu: {cpu_model()}, {args.jobs} jobs per run, {args.repetitions} repetitions")
    for key in ("tubeq", "redis"):
        off = statistics.median(r[key] for r in runs["off"])
        for kind in KINDS[1:]:
            value = statistics.median(r[key] for r in runs[kind])
            print(f"{key}: {kind:<8} {value:6.1f} us/job, off {off:6.1f}, "
                  f"{value - off:+6.1f} us/job ({value / off:.3f}x)")


if __name__ == "__main__":
    main()
