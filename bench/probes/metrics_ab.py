"""Metrics on against off as CPU per job, for a machine too busy for throughput figures.

    .venv/bin/python -m bench.probes.metrics_ab [--jobs N] [--repetitions R]

Each repetition starts a fresh tubeq (events on, as in ``make bench``) with ``--metrics``, one
with ``--slow-ms 1000`` alone (the slow-command timing only) and one with ``--slow-ms 0`` (no
hook: the default without ``--metrics``), in alternating order, drives the same fixed number of
put+reserve+delete cycles through each (8 connections x 16 in flight, 100-byte bodies), and
reads the CPU the tubeq process and its redis-server spent from /proc: CPU time a process
consumed does not shrink when other tenants take the cores, as its throughput does. Prints
the medians per job and the ratio, with the CPU model.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.harness.loadgen import LoadSpec, run_load
from bench.harness.machine import cpu_model
from bench.harness.paths import OUT_DIR
from bench.harness.procstat import CLOCK_TICKS_PER_S, process_cpu_ticks
from bench.harness.servers import EVENTS_ON, METRICS_OFF, METRICS_ON, Tubeq

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


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probes.metrics_ab")
    p.add_argument("--jobs", type=int, default=30_000)
    p.add_argument("--repetitions", type=int, default=5)
    args = p.parse_args()
    log_dir = OUT_DIR / "metrics-ab"
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    for rep in range(args.repetitions):
        order = tuple(KINDS) if rep % 2 == 0 else tuple(reversed(KINDS))
        for kind in order:
            figures = one_run(KINDS[kind], args.jobs, log_dir)
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


if __name__ == "__main__":
    main()
