"""What the metrics hooks cost: each hook alone, in process, or CPU per job of a whole tubeq.

    .venv/bin/python -m bench.probes.metrics_cost                  each hook, in process (~1 min)
    .venv/bin/python -m bench.probes.metrics_cost --per-job [--jobs 30000] [--repetitions 5]

Hooks (the default): times each hook the hot path calls with metrics on (a reply recorded as
it is queued and counted as it is written, 16 to a write; the histogram hooks), many times
over, in CPU time of this process (``process_time``: time other tenants take from the core is
not counted; the best of 5 runs is kept). Prints one line per hook and the total for the
commands of one put+reserve+delete cycle. Deterministic instruction counts per job of a whole
tubeq: bench.probes.metrics_instructions.

Per job (``--per-job``): each repetition starts a fresh tubeq (events on, as in ``make bench``)
with ``--metrics``, one with ``--slow-ms 1000`` alone (the slow-command timing only) and one with
``--slow-ms 0`` (no hook: the default without ``--metrics``), in alternating order, drives the
same fixed number of put+reserve+delete cycles through each (8 connections x 16 in flight, 100 B
bodies), and reads the CPU the tubeq process and its redis-server spent from /proc. Prints the
medians per job and the ratio to off.

Both are CPU time, not throughput: a process's CPU time does not shrink when other tenants take
the cores, as its throughput does, so either swings far less with the machine's load than the
metrics rows of ``make bench`` (section 4c). Both print the CPU model. Per job is loopback only,
one private redis-server and tubeq per run, stopped by PID, bounded by ``--jobs``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from time import perf_counter

from bench.harness.loadgen import LoadSpec, run_load
from bench.harness.machine import cpu_model
from bench.harness.paths import OUT_DIR
from bench.harness.procstat import CLOCK_TICKS_PER_S, process_cpu_ticks
from bench.harness.servers import EVENTS_ON, METRICS_OFF, METRICS_ON, Tubeq
from tubeq.protocol import commands as c
from tubeq.server.metrics import Metrics

# -- each hook, in process ----------------------------------------------------------------------

ROUNDS = 200_000
# Replies per write: a pipelining client's turn (the cycle rows keep 16 in flight).
WRITE = 16


def per_call_ns(fn: Callable[[], object], rounds: int = ROUNDS) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.process_time_ns()
        for _ in range(rounds):
            fn()
        best = min(best, (time.process_time_ns() - start) / rounds)
    return best


def written_ns(m: Metrics, replies: list[bytes], kind: type[c.Command]) -> float:
    """Per reply: what a connection records as it queues a reply (tubeq.server.connection:
    the command's class, and its turn's start for the slow log) and the count as the reply
    leaves in a write of ``len(replies)`` (Metrics.written)."""
    kinds, since = m.asked_lists()
    turn_at = perf_counter()

    def one_write() -> None:
        for _ in replies:
            kinds.append(kind)
            if since is not None:
                since.append(turn_at)
        m.written("abc:1", kinds, since, replies)

    return per_call_ns(one_write, ROUNDS // len(replies)) / len(replies)


async def measure() -> dict[str, float]:
    m = Metrics()
    inserted = [b"INSERTED %d\r\n" % (123456 + i) for i in range(WRITE)]
    reserved = [b"RESERVED %d 100\r\n%s\r\n" % (123456 + i, b"x" * 100) for i in range(WRITE)]
    return {
        "put reply (queued + written)": written_ns(m, inserted, c.Put),
        "reserve reply (queued + written)": written_ns(m, reserved, c.ReserveWithTimeout),
        "delete reply (queued + written)": written_ns(m, [b"DELETED\r\n"] * WRITE, c.Delete),
        "job_reserved (wait histogram)": per_call_ns(lambda: m.job_reserved("default", 3)),
        "job_deleted (run histogram)": per_call_ns(lambda: m.job_deleted("default", 40)),
        "redis_round_trip (per batch)": per_call_ns(lambda: m.redis_round_trip(0.0004)),
    }


def hooks() -> None:
    """Print each hook's CPU time and one cycle's total."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        figures = asyncio.run(measure())
    else:
        figures = uvloop.run(measure())  # as the server runs
    print(f"cpu: {cpu_model()}; replies written {WRITE} at a time")
    for name, ns in figures.items():
        print(f"{name:<34} {ns:8.0f} ns")
    # a put, a reserve and a delete: a reply each, a wait and a run observation.
    cycle = sum(v for k, v in figures.items() if not k.startswith("redis"))
    print(f"{'one put+reserve+delete cycle':<34} {cycle:8.0f} ns")


# -- CPU per job of a whole tubeq ---------------------------------------------------------------

# on: every hook; slow: the slow-command timing only (no listener); off: none (the default).
KINDS = {"on": EVENTS_ON + METRICS_ON, "slow": (*EVENTS_ON, "--slow-ms", "1000"),
         "off": EVENTS_ON + METRICS_OFF}


def one_run(flags: tuple[str, ...], jobs: int, log_dir: Path) -> dict[str, float]:
    server = Tubeq(log_dir, flags=flags)
    server.start()
    try:
        pids = server.pids
        before = {k: process_cpu_ticks(p) or 0 for k, p in pids.items()}
        spec = LoadSpec(mode="cycle", port=server.port, producer_port=server.producer_port,
                        connections=8, in_flight=16, body_size=100, jobs=jobs,
                        time_limit=300.0)
        result = run_load(spec, pids)
        after = {k: process_cpu_ticks(p) or 0 for k, p in pids.items()}
    finally:
        server.stop()
    if not result.ok:
        raise RuntimeError(f"run failed: {result.error_samples[:2]} {result.stop_reasons}")
    us = {k: (after[k] - before[k]) / CLOCK_TICKS_PER_S / result.completed * 1e6
          for k in pids}
    return {"tubeq_us": us["tubeq"], "redis_us": us["redis"], "jobs_per_s": result.jobs_per_s}


def per_job(jobs: int, repetitions: int) -> None:
    """Print each run's CPU per job, then the medians of each kind against off."""
    log_dir = OUT_DIR / "metrics-cost"
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    for rep in range(repetitions):
        order = tuple(KINDS) if rep % 2 == 0 else tuple(reversed(KINDS))
        for kind in order:
            figures = one_run(KINDS[kind], jobs, log_dir)
            runs[kind].append(figures)
            print(f"rep {rep} metrics {kind:<4}: tubeq {figures['tubeq_us']:6.1f} us/job, "
                  f"redis {figures['redis_us']:6.1f} us/job, {figures['jobs_per_s']:8,.0f} "
                  "jobs/s", flush=True)
    print(f"cpu: {cpu_model()}")
    for key in ("tubeq_us", "redis_us"):
        off = statistics.median(r[key] for r in runs["off"])
        for kind in ("on", "slow"):
            value = statistics.median(r[key] for r in runs[kind])
            print(f"{key}: {kind} {value:.1f}, off {off:.1f}, {kind} - off "
                  f"{value - off:+.1f} us/job ({value / off:.3f}x)")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probes.metrics_cost",
                                description="What the metrics hooks cost, in CPU time.")
    p.add_argument("--per-job", action="store_true",
                   help="CPU per job of whole tubeq processes (on, slow-log only, off) "
                        "instead of each hook in process")
    p.add_argument("--jobs", type=int, default=30_000, help="cycles per run (--per-job)")
    p.add_argument("--repetitions", type=int, default=5, help="repetitions (--per-job)")
    args = p.parse_args()
    if args.per_job:
        per_job(args.jobs, args.repetitions)
    else:
        hooks()


if __name__ == "__main__":
    main()
