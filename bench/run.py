"""beanstalkd and tubeq under the same loads in one run -> bench/RESULTS.md.

    make bench                                   the full run (~15-16 min on the 2-core machine)
    .venv/bin/python -m bench.run --quick        1 repetition, small counts (~2 min)
    .venv/bin/python -m bench.run --render bench/out/results-<stamp>.json   re-render only
    .venv/bin/python -m bench.run --only metrics   the metrics on/off rows alone (~2 min)
    .venv/bin/python -m bench.run --quick --only cpu   the CPU per job table's rows alone
    .venv/bin/python -m bench.run --only delayed   the lateness and wake latency rows alone
                                                 (also: many-tubes, workers)

Owns: the scenario rows, their order, repetitions and time budget. Every run starts a fresh
server (beanstalkd, or tubeq on its own private redis-server) on a free loopback port, waits
briefly for the machine to be quiet, drives it with bench.harness.loadgen, and stops it by PID.
Repetitions are interleaved: each repetition walks every row, alternating which server goes
first, so a noisy minute hurts one repetition of many rows rather than every repetition of one.

Scenarios: 1 put and cycle matrix, 2 delayed-job lateness, 3 wake latency (one tubeq process
and two), 4 many watched tubes, then the cost of lifecycle events (4b: the 64x16 put and cycle
rows on tubeq with events on and off, interleaved), the cost of metrics (4c: the same rows with
the HTTP listener and every metrics hook on, ``--metrics``, against no metrics and no
slow-command tracking, ``--slow-ms 0``), CPU per job and ``--workers`` (4d, 4e), the batch rows
(put-many, reserve-many, delete-many, and consume() deleting in batches, through
bench/consume_bench.py's worker; `python -m bench.batch_bench` runs them alone), a py-spy
profile of the main rows, and last 5 backlog and memory per queued job. The 10M-job backlog row
is sized to what the remaining time budget can fill at the fill rates measured on the 1M row;
RESULTS.md says when it was reduced and why.

tubeq runs as it does with its private redis-server: lifecycle events on (``--events on``; the
harness starts tubeq with ``--redis``, where they default to off). The memory rows (backlog,
4 KiB, idle connections) run with events off: the event stream's memory is bounded by
``--events-maxlen``, not a cost per queued job, and would blur those figures.

Raw results go to bench/out/results-<stamp>.json (ignored by git); bench/report.py renders them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import consume_bench
from bench.harness import idle_connections as idle
from bench.harness.bench import (
    BUSY_STREAK_GIVE_UP,
    QUIET_CORES,
    RUN_SLACK_S,
    WINDOW_JOB_CAP,
    Bench,
    Row,
    Scale,
    alternate,
)
from bench.harness.loadgen import LoadResult, LoadSpec, run_backlog, run_load
from bench.harness.machine import (
    committed_summary,
    cpu_model,
    machine_and_versions,
    source_fingerprint,
)
from bench.harness.paths import BENCH_DIR, OUT_DIR, REPO_ROOT
from bench.harness.profiling import Recording, redis_per_job
from bench.harness.redisinfo import command_stats
from bench.harness.servers import (
    EVENTS_ON,
    WORKERS_1,
    WORKERS_2,
    Beanstalkd,
    Server,
    Tubeq,
    make_server,
    snapshot_tubeq,
)
from bench.report import BATCH_BODY, MANY_TUBES_64, MANY_TUBES_64_BASE, render

BACKLOG_REQUESTED = 10_000_000
# A backlog row smaller than this multiple of the 1M row would say little: skip it instead.
BACKLOG_MIN_FACTOR = 1.5
# Memory a queued 100-byte job takes in both servers together, with headroom (beanstalkd ~300 B,
# Redis ~400 B): the big backlog row never asks for more than 60 % of MemAvailable.
BACKLOG_BYTES_PER_JOB_BOTH = 900
# The rows run once more on tubeq alone, events on against off.
EVENTS_COMPARED = ("put 64x16 100B", "cycle 64x16 100B")
# Batches (issue 10): jobs each reserve-batch run fills its tubes with first: enough for
# warm-up plus window at rates up to ~150k jobs/s (the run ends early, and says so, if the
# consumers drain them).
RESERVE_FILL = {"full": 200_000, "quick": 50_000}
# consume rows: one worker process of concurrency 256 (consume_bench's best single-worker shape)
CONSUME_SHAPES = (("tubeq push", 256, 1), ("tubeq reserve", 256, 1), ("beanstalkd", 256, 1))
CONSUME_JOBS = {"full": 30_000, "quick": 10_000}


@dataclass(frozen=True)
class CoreScale(Scale):
    """Counts and durations of one kind of run (full or quick)."""

    window_s: float
    warmup_s: float
    quiet_wait_s: float
    delayed_jobs: int
    wake_jobs: int
    backlog_step: int  # the "1M" row
    backlog_cap: int  # the "10M" row, at most
    memory_4k_jobs: int
    idle_connections: int  # connections blocked in reserve, for memory per connection
    profile_s: float
    budget_s: float  # the whole run should end within this


FULL = CoreScale("full", repetitions=3, window_s=1.0, warmup_s=0.25, quiet_wait_s=1.5,
                 delayed_jobs=3000, wake_jobs=1000, backlog_step=1_000_000,
                 backlog_cap=BACKLOG_REQUESTED, memory_4k_jobs=200_000, idle_connections=10_000,
                 profile_s=4.0,
                 budget_s=14.5 * 60)  # issue 13 added ~1.5 min of rows before the backlog
QUICK = CoreScale("quick", repetitions=1, window_s=0.4, warmup_s=0.15, quiet_wait_s=0.3,
                  delayed_jobs=400, wake_jobs=150, backlog_step=20_000, backlog_cap=100_000,
                  memory_4k_jobs=5_000, idle_connections=2_000, profile_s=2.0, budget_s=4 * 60)


# -- the rows ---------------------------------------------------------------------------------

def throughput_rows(scale: CoreScale) -> list[Row]:
    rows = []
    for mode in ("put", "cycle"):
        for conns in (1, 8, 64):
            for in_flight in (1, 16):
                for body in (100, 4096):
                    spec = LoadSpec(mode=mode, port=0, connections=conns, in_flight=in_flight,
                                    body_size=body, jobs=WINDOW_JOB_CAP, seconds=scale.window_s,
                                    warmup=scale.warmup_s, procs=2 if conns == 64 else 1,
                                    time_limit=scale.warmup_s + scale.window_s + RUN_SLACK_S)
                    rows.append(Row("throughput", f"{mode} {conns}x{in_flight} {body}B", spec))
    return rows


def delayed_row(scale: CoreScale) -> Row:
    spec = LoadSpec(mode="delayed", port=0, connections=8, jobs=scale.delayed_jobs, rate=1000.0,
                    max_delay=2, time_limit=scale.delayed_jobs / 1000.0 + 2 + RUN_SLACK_S)
    return Row("delayed", "delayed 0-2 s, 1000/s", spec)


def delayed_ms_row(scale: CoreScale) -> Row:
    """delayed, with put-with delay-ms (a tubeq extension: beanstalkd has no such put)."""
    spec = LoadSpec(mode="delayed-ms", port=0, connections=8, jobs=scale.delayed_jobs,
                    rate=1000.0, max_delay=2,
                    time_limit=scale.delayed_jobs / 1000.0 + 2 + RUN_SLACK_S)
    return Row("delayed", DELAYED_MS_KEY, spec, servers=("tubeq",))


DELAYED_MS_KEY = "delayed-ms 0-2000 ms, 1000/s"


def wake_row(scale: CoreScale) -> Row:
    spec = LoadSpec(mode="wake", port=0, connections=4, jobs=scale.wake_jobs,
                    time_limit=scale.wake_jobs * 0.01 + RUN_SLACK_S)
    return Row("wake", "wake, 4 blocked consumers", spec, ("beanstalkd", "tubeq", "tubeq x2"))


def many_tube_rows(scale: CoreScale) -> list[Row]:
    """Issue 4's rows (8 producers and 8 consumers, T tubes), then the 64x16 pair
    (MANY_TUBES_64_BASE and MANY_TUBES_64, named by bench/report.py, which judges them): 64
    producer connections (2 generator processes, as the 64-connection rows of section 1) that
    each `use` the next of 100 tubes before every put, 64 consumers that watch all 100 (the
    processes share the tubes), each with 16 reserve-with-timeout in flight, and the same
    load with 8 and 256 consumers (MANY_TUBES_CONSUMERS); and as their
    reference the plain cycle 64x16 100B of section 1 (no `use`, one tube, one watched),
    measured again in this pass, interleaved with them."""
    rows = []
    for tubes, puts_per_use in ((1, 1), (10, 1), (100, 1), (1000, 1), (100, 16)):
        spec = LoadSpec(mode="many-tubes", port=0, connections=8, in_flight=16, tubes=tubes,
                        puts_per_use=puts_per_use, jobs=WINDOW_JOB_CAP, seconds=scale.window_s,
                        warmup=scale.warmup_s,
                        time_limit=scale.warmup_s + scale.window_s + RUN_SLACK_S)
        suffix = "" if puts_per_use == 1 else f", use every {puts_per_use} puts"
        rows.append(Row("many-tubes", f"{tubes} tube{'s' if tubes > 1 else ''}{suffix}", spec))
    plain = next(r.spec for r in throughput_rows(scale) if r.key == "cycle 64x16 100B")
    rows.append(Row("many-tubes", MANY_TUBES_64_BASE, plain))
    for consumers in MANY_TUBES_CONSUMERS:
        spec = LoadSpec(mode="many-tubes", port=0, connections=64, in_flight=16, tubes=100,
                        consumers=consumers, jobs=WINDOW_JOB_CAP, seconds=scale.window_s,
                        warmup=scale.warmup_s, procs=2,
                        time_limit=scale.warmup_s + scale.window_s + RUN_SLACK_S)
        rows.append(Row("many-tubes", many_tubes_key(consumers), spec))
    return rows


# Issue 33 item 7: the 64x16 load over 100 tubes with this many consumer connections, each
# watching all 100 with 16 reserve-with-timeout in flight: how the cost grows with watchers.
# 64 is MANY_TUBES_64 itself; 8 leaves jobs queued (consumers rarely wait), 256 has four
# reserves in flight for every put, so most of them wait.
MANY_TUBES_CONSUMERS = (8, 64, 256)


def many_tubes_key(consumers: int) -> str:
    """The row key of the 64x16, 100-tube load with ``consumers`` consumer connections."""
    return MANY_TUBES_64 if consumers == 64 else f"{MANY_TUBES_64}, {consumers} consumers"


def events_rows(scale: CoreScale) -> list[Row]:
    """The rows of EVENTS_COMPARED on tubeq with lifecycle events on (its "tubeq" runs) and
    off, interleaved in their own pass so the ratio compares runs minutes apart at most."""
    by_key = {r.key: r for r in throughput_rows(scale)}
    return [Row("events", f"events {key}", by_key[key].spec, ("tubeq", "tubeq events off"))
            for key in EVENTS_COMPARED]


def metrics_rows(scale: CoreScale) -> list[Row]:
    """The rows of EVENTS_COMPARED on tubeq with metrics on and off, in a pass of their own."""
    by_key = {r.key: r for r in throughput_rows(scale)}
    return [Row("metrics", f"metrics {key}", by_key[key].spec,
                ("tubeq metrics on", "tubeq metrics off")) for key in EVENTS_COMPARED]


def workers_rows(scale: CoreScale) -> list[Row]:
    """The rows of EVENTS_COMPARED on one tubeq process and on ``--workers 2`` (one Redis)."""
    by_key = {r.key: r for r in throughput_rows(scale)}
    return [Row("workers", f"workers {key}", by_key[key].spec, (WORKERS_1, WORKERS_2))
            for key in EVENTS_COMPARED]


PROFILED_ROWS = ("put 64x16 100B", "cycle 64x16 100B", "put 64x1 100B", "cycle 64x1 100B",
                 "100 tubes", MANY_TUBES_64)


def backlog_cycle_spec(scale: CoreScale) -> LoadSpec:
    """The load measured on top of a backlog: ordinary clients (1 in flight), one tube."""
    return LoadSpec(mode="cycle", port=0, connections=8, in_flight=1, body_size=100,
                    jobs=WINDOW_JOB_CAP, seconds=scale.window_s, warmup=scale.warmup_s,
                    tube="backlog", time_limit=scale.warmup_s + scale.window_s + RUN_SLACK_S)


# -- batches (issue 10): put-many, reserve-many, delete-many; consume() deleting in batches ----

def batch_rows(scale: CoreScale) -> list[Row]:
    """The tubeq batch rows: `mode connections x in-flight, batch size, body`."""
    # In flight: 3,200-4,000 jobs per row, more than beanstalkd's deepest single-job rows
    # (64x16 = 1,024), so a round trip's latency does not bound the rate.
    shapes = (("put-batch", 8, 4, 100), ("put-batch", 1, 4, 1000), ("reserve-batch", 8, 4, 100),
              ("cycle-batch", 8, 4, 100))
    rows = []
    for mode, conns, in_flight, batch in shapes:
        fill = mode == "reserve-batch"
        jobs = RESERVE_FILL.get(scale.name, RESERVE_FILL["quick"]) if fill else 2_000_000
        spec = LoadSpec(mode=mode, port=0, connections=conns, in_flight=in_flight,
                        body_size=BATCH_BODY, batch=batch, jobs=jobs, seconds=scale.window_s,
                        warmup=scale.warmup_s,
                        time_limit=scale.warmup_s + scale.window_s + RUN_SLACK_S)
        rows.append(Row("batches", f"{mode} {conns}x{in_flight} b{batch} {BATCH_BODY}B", spec,
                        ("tubeq",)))
    return rows


def consume_runs(scale: CoreScale, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The consume rows, interleaved over ``scale.repetitions``; consume_bench's entries."""
    name = "full" if scale.name == "full" else "quick"
    base = consume_bench.FULL if name == "full" else consume_bench.QUICK
    c_scale = replace(base, repetitions=scale.repetitions, jobs=CONSUME_JOBS[name])
    bench = consume_bench.ConsumeBench(c_scale, log)
    rows = [consume_bench.ConsumeRow(target, concurrency, workers)
            for target, concurrency, workers in CONSUME_SHAPES]
    for rep in range(c_scale.repetitions):
        for row in alternate(rows, rep):
            bench.consume(row, rep)
    return bench.runs


# -- running ----------------------------------------------------------------------------------

class CoreBench(Bench):
    """The rows of `make bench`, each on a fresh server, and the profile, memory and backlog
    sections after them."""

    def __init__(self, scale: CoreScale, log: Callable[[str], None]) -> None:
        super().__init__(scale, log, quiet_wait_s=scale.quiet_wait_s)
        self.scale: CoreScale = scale
        self.code_dir = REPO_ROOT  # run() points it at the snapshot of tubeq/

    def record(self, row: Row, server: str, rep: int, quiet: float, result: LoadResult,
               **extra: Any) -> None:
        entry = {"scenario": row.scenario, "row": row.key, "server": server, "rep": rep,
                 "quiet_cores": round(quiet, 3), "result": asdict(result), **extra}
        self.runs.append(entry)
        status = "" if result.ok else f"  FAILED {result.error_samples[:2]}"
        lat = result.latency
        self.log(f"[{self.elapsed():6.0f}s] {row.key:<28} {server:<10} rep {rep}: "
                 f"{result.jobs_per_s:>9,.0f} jobs/s p50 {lat['p50_ms']} p99 {lat['p99_ms']} ms "
                 f"cpu {result.cpu_pct} gen {result.generator_cpu_pct} "
                 f"other {result.other_cores}{status}")

    def fresh_run(self, row: Row, kind: str, rep: int) -> None:
        server = make_server(kind, self.log_dir, self.code_dir, EVENTS_ON)
        try:
            server.start()
            quiet = self.quiet()
            spec = replace(row.spec, port=server.port, producer_port=server.producer_port)
            result = run_load(spec, server.pids, server.redis_url)
        except Exception as exc:  # one broken run must not lose the others
            self.log(f"{row.key} {kind} rep {rep}: ERROR {exc!r}")
            self.notes.append(f"{row.key}, {kind}, repetition {rep}: the run failed: {exc!r}")
            return
        finally:
            server.stop()
        self.record(row, kind, rep, quiet, result)

    def interleaved(self, rows: list[Row]) -> None:
        for rep in range(self.scale.repetitions):
            for row in rows:
                for kind in alternate(row.servers, rep):
                    self.fresh_run(row, kind, rep)

    # -- profile ----------------------------------------------------------------------------

    def profile(self, rows: list[Row]) -> list[dict[str, Any]]:
        profiles = []
        for row in rows:
            server = Tubeq(self.log_dir, code_dir=self.code_dir, flags=EVENTS_ON)
            try:
                server.start()
                self.quiet()
                server.reset_redis_stats()
                output = self.log_dir / f"pyspy-{row.key.replace(' ', '_')}.txt"
                spec = replace(row.spec, port=server.port, producer_port=server.producer_port,
                               seconds=self.scale.profile_s, warmup=0.5)
                recording = Recording.start(server.pids["tubeq"],
                                            spec.warmup + self.scale.profile_s + 0.5, output)
                result = run_load(spec, server.pids)
                spy = recording.finish(timeout=30.0)
                assert server.redis_url is not None
                redis = redis_per_job(command_stats(server.redis_url), result.completed)
            except Exception as exc:
                self.notes.append(f"profile of {row.key} failed: {exc!r}")
                continue
            finally:
                server.stop()
            self.log(f"[{self.elapsed():6.0f}s] profile {row.key}: {result.jobs_per_s:,.0f} "
                     f"jobs/s, cpu {result.cpu_pct}, samples {spy.get('samples')}")
            profiles.append({"row": row.key, "result": asdict(result), "py_spy": spy,
                             "redis": redis})
        return profiles

    # -- backlog ----------------------------------------------------------------------------

    def backlog(self, reserve_s: float) -> dict[str, Any]:
        """Rows 0, the step (1M) and the big one (10M or what the budget allows)."""
        scale = self.scale
        fills: list[dict[str, Any]] = []
        section: dict[str, Any] = {"requested_big": BACKLOG_REQUESTED, "fills": fills,
                                   "cycle": asdict(backlog_cycle_spec(scale))}
        self._backlog_size(0, fills)
        self._backlog_size(scale.backlog_step, fills)
        big, reason = self._big_backlog_size(fills, reserve_s)
        section["big"], section["big_reason"] = big, reason
        self.log(f"[{self.elapsed():6.0f}s] big backlog row: {big:,} jobs ({reason})")
        if big:
            self._backlog_size(big, fills)
        section["sizes"] = sorted({f["size"] for f in fills})
        return section

    def _big_backlog_size(self, fills: list[dict[str, Any]], reserve_s: float) -> tuple[int, str]:
        scale = self.scale
        step = [f for f in fills if f["size"] == scale.backlog_step and f["fill_jobs_per_s"]]
        if len(step) < 2:
            return 0, "the step row's fill failed, so no fill rate to size it by"
        seconds_per_job = sum(1.0 / f["fill_jobs_per_s"] for f in step)
        measure_s = scale.repetitions * 2 * (scale.window_s + scale.warmup_s + 2.0) + 10
        fill_budget = scale.budget_s - self.elapsed() - reserve_s - measure_s
        by_time = int(max(0.0, fill_budget) / seconds_per_job)
        by_memory = int(_mem_available() * 0.6 / BACKLOG_BYTES_PER_JOB_BOTH)
        size = min(scale.backlog_cap, by_time, by_memory)
        size -= size % max(1, scale.backlog_step // 2)
        rates = " and ".join(f"{f['server']} {f['fill_jobs_per_s']:,.0f}/s" for f in step)
        if size < BACKLOG_MIN_FACTOR * scale.backlog_step:
            return 0, (f"skipped: filling at the measured rates ({rates}) leaves time for only "
                       f"{by_time:,} jobs within the {scale.budget_s / 60:.0f}-minute budget")
        if size >= scale.backlog_cap:
            return size, "as requested" if size == BACKLOG_REQUESTED else "the quick cap"
        limit = "time" if by_time <= by_memory else "memory"
        return size, (f"reduced from {scale.backlog_cap:,} by the {limit} budget: the 1M row "
                      f"filled at {rates} ({seconds_per_job * 1e6:.1f} us per job for both), "
                      f"{max(0.0, fill_budget):.0f} s were left for filling within the "
                      f"{scale.budget_s / 60:.0f}-minute budget of `make bench`")

    def _backlog_size(self, size: int, fills: list[dict[str, Any]]) -> None:
        """Fill both servers with ``size`` jobs, then interleave the measured cycles."""
        scale = self.scale
        spec = backlog_cycle_spec(scale)
        servers: dict[str, Server] = {"beanstalkd": Beanstalkd(self.log_dir),
                                      "tubeq": Tubeq(self.log_dir, code_dir=self.code_dir)}
        row = Row("backlog", f"backlog {size:,}", spec)
        try:
            for kind, server in servers.items():
                server.start()
                fill_spec = replace(spec, mode="backlog", port=server.port, jobs=0,
                                    backlog=size, time_limit=size / 5000 + RUN_SLACK_S)
                started = time.monotonic()
                filled = run_backlog(fill_spec, server.memory_pids, server.redis_url)
                memory = filled.extra["memory"]
                fills.append({"size": size, "server": kind, "ok": filled.ok,
                              "fill_jobs_per_s": memory["fill_jobs_per_s"],
                              "fill_s": round(time.monotonic() - started, 1),
                              "bytes_per_job": memory["bytes_per_job"],
                              "before": memory["before"], "after": memory["after"]})
                self.log(f"[{self.elapsed():6.0f}s] backlog {size:,} {kind}: filled at "
                         f"{memory['fill_jobs_per_s'] or 0:,.0f}/s, bytes/job "
                         f"{_short(memory['bytes_per_job'])}")
            for rep in range(scale.repetitions):
                order = list(servers) if rep % 2 == 0 else list(reversed(servers))
                for kind in order:
                    server = servers[kind]
                    quiet = self.quiet()
                    if isinstance(server, Tubeq):
                        server.reset_redis_stats()
                    result = run_load(replace(spec, port=server.port), server.pids)
                    redis = None
                    if isinstance(server, Tubeq) and server.redis_url is not None:
                        redis = redis_per_job(command_stats(server.redis_url), result.completed)
                    self.record(row, kind, rep, quiet, result, backlog=size, redis=redis)
        except Exception as exc:
            self.notes.append(f"backlog {size:,} failed: {exc!r}")
            self.log(f"backlog {size:,}: ERROR {exc!r}")
        finally:
            for server in servers.values():
                server.stop()

    def memory_4k(self) -> list[dict[str, Any]]:
        """Memory per queued 4 KiB job (no load on top)."""
        out = []
        for kind in ("beanstalkd", "tubeq"):
            server = make_server(kind, self.log_dir, self.code_dir)
            try:
                server.start()
                spec = LoadSpec(mode="backlog", port=server.port, jobs=0, body_size=4096,
                                backlog=self.scale.memory_4k_jobs, tube="memory",
                                time_limit=self.scale.memory_4k_jobs / 2000 + RUN_SLACK_S)
                filled = run_backlog(spec, server.memory_pids, server.redis_url)
                memory = filled.extra["memory"]
                out.append({"size": self.scale.memory_4k_jobs, "server": kind, "ok": filled.ok,
                            "fill_jobs_per_s": memory["fill_jobs_per_s"],
                            "bytes_per_job": memory["bytes_per_job"]})
                self.log(f"[{self.elapsed():6.0f}s] memory 4 KiB {kind}: "
                         f"{_short(memory['bytes_per_job'])}")
            except Exception as exc:
                self.notes.append(f"4 KiB memory row on {kind} failed: {exc!r}")
            finally:
                server.stop()
        return out


    def idle_connections(self) -> list[dict[str, Any]]:
        """Memory per connection blocked in reserve (issue 8), each server fresh."""
        out = []
        count = self.scale.idle_connections
        try:
            idle.raise_fd_limit(count + idle.WARM_CONNECTIONS + 500)
        except (RuntimeError, ValueError, OSError) as exc:
            self.notes.append(f"idle connections row skipped: {exc}")
            return out
        for kind in ("beanstalkd", "tubeq"):
            server = make_server(kind, self.log_dir, self.code_dir)
            try:
                server.start()
                measured = idle.measure(server, count)
                out.append(measured)
                self.log(f"[{self.elapsed():6.0f}s] idle connections {kind}: "
                         f"{measured['bytes_per_connection']:,.0f} B each ({count:,})")
            except Exception as exc:
                self.notes.append(f"idle connections row on {kind} failed: {exc!r}")
            finally:
                server.stop()
        return out


def _short(per_job: dict[str, float | None]) -> str:
    return ", ".join(f"{k} {v:,.0f}" for k, v in per_job.items() if v is not None)


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# -- main -------------------------------------------------------------------------------------

def run(scale: CoreScale, output: Path, only: str | None = None) -> Path:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    bench = CoreBench(scale, log)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC)
    # Every row runs this snapshot of tubeq/, so the run measures one version of the code even
    # when the working tree changes under it.
    machine = machine_and_versions()
    committed = committed_summary(BENCH_DIR / "RESULTS.md")
    fingerprint = source_fingerprint(REPO_ROOT)
    bench.code_dir = snapshot_tubeq(bench.log_dir / "code")
    if source_fingerprint(bench.code_dir) != fingerprint:
        raise RuntimeError("tubeq/ changed while it was being copied; run again")
    log(f"bench: {scale.name} run, logs in {bench.log_dir.relative_to(REPO_ROOT)}")
    if only is not None:
        for rows in ONLY[only](scale):
            bench.interleaved(rows)
        return _finish(bench, scale, started_at, machine, fingerprint, output, {}, {}, [], {},
                       committed=committed)
    bench.interleaved(throughput_rows(scale))
    bench.interleaved([delayed_row(scale), delayed_ms_row(scale), wake_row(scale)])
    tube_rows = many_tube_rows(scale)
    bench.interleaved(tube_rows)
    bench.interleaved(events_rows(scale))
    bench.interleaved(metrics_rows(scale))
    bench.interleaved(workers_rows(scale))
    # batches (issue 10): tubeq's put-many / reserve-many / delete-many rows, then consume()
    # deleting in batches (bench/batch_bench.py)
    bench.interleaved(batch_rows(scale))
    batches_consume = consume_runs(scale, log)
    by_key = {r.key: r for r in [*throughput_rows(scale), *tube_rows]}
    profiles = bench.profile([by_key[k] for k in PROFILED_ROWS])
    memory_4k = bench.memory_4k()
    idle_connections = bench.idle_connections()
    backlog = bench.backlog(reserve_s=15.0)
    return _finish(bench, scale, started_at, machine, fingerprint, output, memory_4k, backlog,
                   profiles, idle_connections, batches_consume, committed)


def _main_64x16_rows(scale: CoreScale) -> list[Row]:
    return [r for r in throughput_rows(scale) if r.key in EVENTS_COMPARED]


# `--only NAME`: some passes alone, for development (bench/out/, never RESULTS.md).
ONLY: dict[str, Callable[[CoreScale], list[list[Row]]]] = {
    "metrics": lambda scale: [metrics_rows(scale)],
    "many-tubes": lambda scale: [[r for r in many_tube_rows(scale)
                                  if r.key == MANY_TUBES_64_BASE
                                  or r.key.startswith(MANY_TUBES_64)]],
    "workers": lambda scale: [workers_rows(scale)],
    "delayed": lambda scale: [[delayed_row(scale), delayed_ms_row(scale), wake_row(scale)]],
    "cpu": lambda scale: [_main_64x16_rows(scale), events_rows(scale), workers_rows(scale)],
}


def _finish(bench: CoreBench, scale: CoreScale, started_at: datetime, machine: dict[str, Any],
            fingerprint: str, output: Path, memory_4k: Any, backlog: Any, profiles: Any,
            idle_connections: Any, batches_consume: Any = None,
            committed: Any = None) -> Path:
    log = bench.log
    if bench.gate.busy_starts:
        bench.notes.append(
            f"{bench.gate.busy_starts} runs started while other processes used >= {QUIET_CORES} "
            f"cores; after {BUSY_STREAK_GIVE_UP} such runs in a row the harness stops waiting "
            "for quiet until the machine is quiet again (see `other cores` per row).")
    if source_fingerprint(REPO_ROOT) != fingerprint:
        bench.notes.append(
            "tubeq/ in the working tree changed during this run; every row still measured the "
            "copy taken at the start (the `tubeq` and `tubeq source` lines above), so the "
            "figures describe that version, not the current tree.")
    results = {
        "meta": {"scale": asdict(scale), "started": started_at.isoformat(timespec="seconds"),
                 "elapsed_s": round(bench.elapsed(), 1), "machine": machine,
                 "tubeq_source_sha256": fingerprint, "cpu_model": cpu_model(),
                 # Read before this run writes its report (issue 13 part 6).
                 "committed": committed},
        "runs": bench.runs, "profiles": profiles, "memory_4k": memory_4k, "backlog": backlog,
        "idle_connections": idle_connections, "batches_consume": batches_consume,
        "notes": bench.notes,
    }
    raw = OUT_DIR / f"results-{bench.stamp}.json"
    raw.write_text(json.dumps(results, indent=1))
    output.write_text(render(results))
    log(f"bench: done in {bench.elapsed() / 60:.1f} min; raw results {raw.relative_to(REPO_ROOT)}"
        f", report {output.relative_to(REPO_ROOT) if output.is_relative_to(REPO_ROOT) else output}")
    return output


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--quick", action="store_true",
                   help="1 repetition, small counts (development); writes bench/out/")
    p.add_argument("--output", type=Path, default=None,
                   help="report path (default bench/RESULTS.md, quick: bench/out/RESULTS-quick.md)")
    p.add_argument("--only", choices=sorted(ONLY), default=None,
                   help="run some passes alone: metrics (on/off rows), many-tubes (the 64x16 "
                        "rows over 100 tubes, with 8, 64 and 256 consumers, and their plain "
                        "cycle), workers (1 vs 2), cpu (the 64x16 put and cycle rows, events "
                        "on/off, workers: the CPU per job table), delayed (lateness and wake "
                        "latency); writes bench/out/")
    p.add_argument("--repetitions", type=int, default=None, metavar="N",
                   help="repetitions per row instead of the scale's (3 full, 1 quick)")
    p.add_argument("--render", type=Path, default=None, metavar="RESULTS_JSON",
                   help="only re-render a saved results file")
    args = p.parse_args(argv)
    quick_default = OUT_DIR / "RESULTS-quick.md"
    output = args.output or (quick_default if args.quick
                             else OUT_DIR / "RESULTS-only.md" if args.only
                             else BENCH_DIR / "RESULTS.md")
    if args.render is not None:
        results = json.loads(args.render.read_text())
        output.write_text(render(results))
        return 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    scale = QUICK if args.quick else FULL
    if args.repetitions is not None:
        scale = replace(scale, repetitions=max(1, args.repetitions))
    run(scale, output, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
