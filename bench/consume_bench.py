"""consume() throughput: what the push extension gains, against beanstalkd, in one run.

    .venv/bin/python -m bench.consume_bench            full run (3 repetitions, ~4 min)
    .venv/bin/python -m bench.consume_bench --quick    1 repetition, small counts (~1 min)

Owns: the consume benchmark's rows, its worker processes, its time budget and its report,
bench/RESULTS-consume.md (``--quick`` writes bench/out/RESULTS-consume-quick.md). Servers come
from bench/harness/servers.py (fresh beanstalkd, or tubeq on its own private redis-server, each
on a free loopback port, stopped by PID), loads and the CPU arithmetic from
bench/harness/loadgen.py and bench/harness/procstat.py, the run's clock, records and quiet gate
from bench/harness/bench.py; this module imports them and changes none of them.

Rows, each run against a fresh server, repetitions interleaved (each repetition walks every row,
the order reversed every other repetition):

* ``cycle 64x16`` and ``cycle 8x16``: beanstalkd's pipelined put+reserve+delete rate,
  bench.harness.loadgen cycle mode (64 connections use 2 generator processes, as in bench/run.py).
  The best median of the two is the reference every consume row is divided by; the target is a
  push row at >= 1.5x that reference.
* consume rows: the tube is pre-filled with ``jobs`` jobs of 100 B (loadgen put mode, 8
  connections x 64 in flight; that fill rate is reported on its own), then 1 or 2 worker
  processes each run ``Client.consume(tube, concurrency=C)`` with a handler that only returns (so
  every job is deleted), under uvloop. The clock starts when the workers start consuming
  (connecting included) and stops at the DELETED that completes 90 % of the jobs, while the
  tube still has ready jobs (TIMED_SHARE says why); the time to all of them is reported too,
  and every run is bounded in time. Three targets:
  beanstalkd (``push=None``: the client probes, gets UNKNOWN_COMMAND and falls back to
  pipelined reserves), tubeq with ``push=False`` (the same fallback, forced) and tubeq with
  ``push=True`` (the extension).
* CPU over each window, in % of one core from /proc: the server (beanstalkd, or the tubeq process
  and its redis-server separately), each worker process, and ``other`` (in cores: everything else
  on the machine, i.e. other tenants). A row whose median ``other`` is >= 0.5 shared the box.
* Last, the best push row runs once more under py-spy (bench.harness.profiling's Recording, on
  the tubeq process and on a worker at the same time) and Redis's INFO commandstats; that run's
  rate is not used in the table (py-spy slows what it samples).

Rules: loopback only; never the Redis on 6379 (tubeq's Redis is private); every process started
here (servers, generators, workers, py-spy) is stopped by its PID, SIGTERM then SIGKILL, in error
paths too; every loop is bounded in count and time; the whole run stays within its budget
(repetitions that would overrun it are skipped, and the report says so).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import logging
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import multiprocessing.sharedctypes
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import uvloop

from bench.harness.bench import (
    BUSY_STREAK_GIVE_UP,
    QUIET_CORES,
    RUN_SLACK_S,
    Bench,
    Scale,
    alternate,
)
from bench.harness.loadgen import LoadResult, LoadSpec, run_load
from bench.harness.machine import machine_and_versions
from bench.harness.paths import BENCH_DIR, OUT_DIR, REPO_ROOT
from bench.harness.procstat import CpuSnapshot, CpuWindow, watched_pids
from bench.harness.profiling import SAMPLING, SCRIPT_RUNNERS, Recording
from bench.harness.redisinfo import command_stats
from bench.harness.servers import LOOPBACK, Beanstalkd, Server, Tubeq, make_server
from bench.harness.summary import (
    SHARED_BOX_CORES,
    fmt_pct,
    fmt_x,
    median_of,
    ratio_of,
    table,
)
from tubeq.client import Client, Job

RESULTS_PATH = BENCH_DIR / "RESULTS-consume.md"
QUICK_RESULTS_PATH = OUT_DIR / "RESULTS-consume-quick.md"
# Everything after this line of an existing report is kept when the report is rewritten: the
# reading written by hand for a run.
HAND_MARKER = "<!-- hand-written below this line: kept when consume_bench rewrites the file -->"

BODY_SIZE = 100
# Pre-fill: as bench.harness.loadgen's backlog fill (beanstalkd and Redis saturate well below this).
FILL_CONNECTIONS = 8
FILL_IN_FLIGHT = 64
# Issue 3's target: consume() with push >= this times beanstalkd's best pipelined cycle rate.
TARGET_RATIO = 1.5
CORES = os.cpu_count() or 2
# A process above this share of one core is (close to) saturated.
SATURATED_PCT = 90.0
# The clock stops when this share of the pre-filled jobs is deleted, while the tube still has
# ready jobs. Draining the last ones measures something else: a pipelined reserve that finds the
# tube empty blocks for reserve_timeout (1 s), and the DELETED replies queued behind it (replies
# keep command order, in beanstalkd and in tubeq) arrive only when it times out. That idle tail
# would hit the reserve rows and not the push rows. The time to all jobs is reported as well.
TIMED_SHARE = 0.9
# After the timed share, how long to wait for the rest (the tail above is ~1 s).
DRAIN_WAIT_S = 4.0
# How often the coordinator looks at the workers' completion counters.
POLL_S = 0.005
# Bounds on the worker processes' start and stop.
WORKER_READY_TIMEOUT_S = 20.0
WORKER_STOP_TIMEOUT_S = 10.0
JOIN_TIMEOUT_S = 5.0
# py-spy is told -d seconds; it gets this much longer to write its output.
PY_SPY_SLACK_S = 20.0
TOP_FUNCTIONS = 10
# The profiled run's backlog: enough for the py-spy duration at the measured rate, within these.
PROFILE_MIN_JOBS = 20_000
PROFILE_MAX_JOBS = 300_000

# -- scale and rows -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ConsumeScale(Scale):
    """Counts and durations of one kind of run (full or quick)."""

    jobs: int  # per consume run
    cycle_window_s: float
    cycle_warmup_s: float
    quiet_wait_s: float
    consume_limit_s: float  # a consume run that has not finished by then reports what it did
    profile_s: int
    budget_s: float


FULL = ConsumeScale("full", repetitions=3, jobs=50_000, cycle_window_s=1.0,
                    cycle_warmup_s=0.25, quiet_wait_s=1.0, consume_limit_s=25.0, profile_s=4,
                    budget_s=280.0)
QUICK = ConsumeScale("quick", repetitions=1, jobs=10_000, cycle_window_s=0.5,
                     cycle_warmup_s=0.15, quiet_wait_s=0.3, consume_limit_s=10.0, profile_s=2,
                     budget_s=100.0)


@dataclass(frozen=True)
class CycleRow:
    """beanstalkd's pipelined put+reserve+delete (bench.harness.loadgen cycle mode)."""

    key: str
    connections: int
    in_flight: int
    procs: int


@dataclass(frozen=True)
class ConsumeRow:
    """A consume() worker (or two) draining a pre-filled tube on one server."""

    target: str  # "beanstalkd", "tubeq reserve", "tubeq push"
    concurrency: int  # per worker process
    workers: int

    @property
    def key(self) -> str:
        per = f"{self.workers}x{self.concurrency}" if self.workers > 1 else f"{self.concurrency}"
        return f"{self.target} c{per}"

    @property
    def server(self) -> str:
        return "beanstalkd" if self.target == "beanstalkd" else "tubeq"

    @property
    def push(self) -> bool | None:
        """consume()'s ``push``: beanstalkd probes (None), tubeq is forced either way."""
        return {"beanstalkd": None, "tubeq reserve": False, "tubeq push": True}[self.target]

    @property
    def expected_mode(self) -> str:
        return "push" if self.target == "tubeq push" else "reserve"


CYCLE_ROWS = (CycleRow("cycle 64x16", 64, 16, 2), CycleRow("cycle 8x16", 8, 16, 1))
TARGETS = ("beanstalkd", "tubeq reserve", "tubeq push")
TARGET_LABELS = {
    "beanstalkd": "beanstalkd, consume() falls back to pipelined reserves",
    "tubeq reserve": "tubeq, push=False (pipelined reserves)",
    "tubeq push": "tubeq, push=True (push extension)",
}


def consume_rows(scale: ConsumeScale) -> list[ConsumeRow]:
    shapes = ((64, 1), (256, 1), (128, 2)) if scale.name == "full" else ((256, 1), (128, 2))
    return [ConsumeRow(t, c, w) for t in TARGETS for c, w in shapes]


ConsumeBenchRow = CycleRow | ConsumeRow


# -- the worker process -------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerSpec:
    port: int
    tube: str
    concurrency: int
    push: bool | None
    time_limit_s: float


class _WarningCounter(logging.Handler):
    """Counts the client's warnings (a failed delete, a lost connection) in a worker."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.samples) < 3:
            self.samples.append(record.getMessage())


Counters = Any  # a multiprocessing RawArray of 'q': completions per worker process


def _worker_main(spec: WorkerSpec, index: int, pipe: multiprocessing.connection.Connection,
                 done: Counters) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the coordinator's handler is not ours
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the coordinator stops us by PID
    try:
        result = uvloop.run(_worker(spec, index, pipe, done))
        pipe.send(("result", result))
    except BaseException as exc:
        with contextlib.suppress(OSError):
            pipe.send(("error", f"worker {index}: {exc!r}"))
    finally:
        pipe.close()


async def _worker(spec: WorkerSpec, index: int, pipe: multiprocessing.connection.Connection,
                  done: Counters) -> dict[str, Any]:
    """One consume() worker: a no-op handler; each DELETED bumps ``done[index]`` and records
    its CLOCK_MONOTONIC instant (the same clock in every process of the machine)."""
    loop = asyncio.get_running_loop()
    warnings = _WarningCounter()
    logging.getLogger("tubeq.client").addHandler(warnings)
    client = Client(LOOPBACK, spec.port)
    consumer = client.consume(spec.tube, concurrency=spec.concurrency, push=spec.push)

    async def handler(job: Job) -> None:
        return None

    completions: list[float] = []

    async def handle(job: Job) -> None:  # Consumer.run's per-job task, plus the counter
        async with job:
            await handler(job)
        completions.append(time.monotonic())
        done[index] += 1

    tasks: set[asyncio.Task[None]] = set()

    async def iterate() -> None:
        async for job in consumer:
            task = loop.create_task(handle(job))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    pipe.send(("ready", os.getpid()))
    message = pipe.recv()  # blocking on purpose: nothing runs before the go
    if message[0] != "go":
        raise RuntimeError("aborted by the coordinator")
    await asyncio.sleep(max(0.0, message[1] - time.monotonic()))
    stop = asyncio.Event()

    def on_message() -> None:  # any message (or EOF) from the coordinator: stop
        unwatch()  # level-triggered: once is enough
        # Read it: closing a Unix socket with unread data resets the coordinator's end, which
        # may still be reading our (large) result.
        with contextlib.suppress(EOFError, OSError):
            pipe.recv()
        stop.set()

    def unwatch() -> None:
        loop.remove_reader(pipe.fileno())
        # The event loop made the descriptor non-blocking; the result is sent with a blocking
        # send (it can be larger than the socket buffer).
        os.set_blocking(pipe.fileno(), True)


    loop.add_reader(pipe.fileno(), on_message)
    cpu_start = time.process_time()
    runner = loop.create_task(iterate())
    stopper = loop.create_task(stop.wait())
    try:
        await asyncio.wait({runner, stopper}, timeout=spec.time_limit_s,
                           return_when=asyncio.FIRST_COMPLETED)
        if runner.done():
            runner.result()  # the consumer failed (e.g. push=True against beanstalkd)
        cpu_s = time.process_time() - cpu_start
        modes = consumer.modes
        consumer.stop()
        async with asyncio.timeout(WORKER_STOP_TIMEOUT_S):
            await runner
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await consumer.wait_closed()
    finally:
        unwatch()
        stopper.cancel()
        runner.cancel()
        await consumer.aclose()
    return {"pid": os.getpid(), "done": done[index], "modes": modes, "cpu_s": round(cpu_s, 3),
            "warnings": warnings.count, "warning_samples": warnings.samples,
            "completions": completions}


# -- the run -----------------------------------------------------------------------------------

class Stop(BaseException):
    """SIGTERM: unwind through every finally (servers, workers and py-spy stop by PID). Not an
    Exception, so the per-run handlers that keep one broken run from losing the others let it
    through, as they let KeyboardInterrupt through."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Stop(f"signal {signum}")


def _us_per_job(pct: float | None, seconds: float, jobs: int) -> float | None:
    if pct is None or jobs <= 0:
        return None
    return pct / 100.0 * seconds / jobs * 1e6


class ConsumeBench(Bench):
    """beanstalkd's cycle rows and the consume rows, each on a fresh server, within the scale's
    time budget; then the best push row under py-spy."""

    def __init__(self, scale: ConsumeScale, log: Callable[[str], None]) -> None:
        super().__init__(scale, log, log_name="consume-logs", quiet_wait_s=scale.quiet_wait_s)
        self.scale: ConsumeScale = scale
        self.rep_seconds: list[float] = []

    # -- repetitions ---------------------------------------------------------------------------

    def repetitions(self, rows: Sequence[ConsumeBenchRow]) -> None:
        reserve_s = 12.0 + 2 * self.scale.profile_s  # the profile run at the end
        for rep in range(self.scale.repetitions):
            if rep and self.rep_seconds:
                projected = self.elapsed() + max(self.rep_seconds) + reserve_s
                if projected > self.scale.budget_s:
                    self.notes.append(
                        f"repetitions {rep + 1}-{self.scale.repetitions} skipped: one takes up "
                        f"to {max(self.rep_seconds):.0f} s and the run's budget is "
                        f"{self.scale.budget_s:.0f} s")
                    self.log(self.notes[-1])
                    return
            began = self.elapsed()
            for row in alternate(rows, rep):
                if isinstance(row, CycleRow):
                    self.cycle(row, rep)
                else:
                    self.consume(row, rep)
            self.rep_seconds.append(self.elapsed() - began)

    def cycle(self, row: CycleRow, rep: int) -> None:
        scale = self.scale
        server = Beanstalkd(self.log_dir)
        entry: dict[str, Any] = {"kind": "cycle", "row": row.key, "server": "beanstalkd",
                                 "rep": rep}
        try:
            server.start()
            entry["quiet_cores"] = round(self.quiet(), 3)
            spec = LoadSpec(mode="cycle", port=server.port, connections=row.connections,
                            in_flight=row.in_flight, procs=row.procs, body_size=BODY_SIZE,
                            jobs=2_000_000, seconds=scale.cycle_window_s,
                            warmup=scale.cycle_warmup_s, tube="cycle",
                            time_limit=scale.cycle_warmup_s + scale.cycle_window_s + RUN_SLACK_S)
            result = run_load(spec, server.pids)
            entry.update(ok=result.ok, jobs_per_s=result.jobs_per_s,
                         cpu_pct=result.cpu_pct, generator_cpu_pct=result.generator_cpu_pct,
                         other_cores=result.other_cores, errors=result.error_samples)
        except Exception as exc:  # one broken run must not lose the others
            entry.update(ok=False, error=repr(exc))
        finally:
            server.stop()
        self._record(entry)

    def consume(self, row: ConsumeRow, rep: int, *, profile: bool = False,
                jobs: int | None = None) -> dict[str, Any]:
        jobs = jobs or self.scale.jobs
        server = make_server(row.server, self.log_dir)
        tube = f"consume{rep}"
        entry: dict[str, Any] = {"kind": "profile" if profile else "consume", "row": row.key,
                                 "target": row.target, "server": row.server, "rep": rep,
                                 "jobs": jobs, "concurrency": row.concurrency,
                                 "workers": row.workers}
        try:
            server.start()
            fill = self._fill(server, tube, jobs)
            entry["fill_jobs_per_s"] = fill.jobs_per_s
            if not fill.ok or fill.completed != jobs:
                raise RuntimeError(f"fill put {fill.completed} of {jobs} jobs: "
                                   f"{fill.error_samples}")
            entry["quiet_cores"] = round(self.quiet(), 3)
            if isinstance(server, Tubeq):
                server.reset_redis_stats()
            entry.update(self._drain(server, row, f"{tube}-0", jobs, profile))
            if isinstance(server, Tubeq) and server.redis_url is not None:
                entry["redis_scripts"] = _script_stats(command_stats(server.redis_url), jobs)
        except Exception as exc:
            entry.update(ok=False, error=repr(exc))
        finally:
            server.stop()
        self._record(entry)
        return entry

    def _fill(self, server: Server, tube: str, jobs: int) -> LoadResult:
        spec = LoadSpec(mode="put", port=server.port, connections=FILL_CONNECTIONS,
                        in_flight=FILL_IN_FLIGHT, body_size=BODY_SIZE, jobs=jobs, tube=tube,
                        time_limit=jobs / 2000 + RUN_SLACK_S)
        return run_load(spec, server.pids)

    def _drain(self, server: Server, row: ConsumeRow, tube: str, jobs: int,
               profile: bool) -> dict[str, Any]:
        """Start the workers, time ``jobs`` completions, stop the workers; CPU per process."""
        context = multiprocessing.get_context("fork")
        done = context.RawArray("q", row.workers)
        timed = timed_jobs(jobs)
        spec = WorkerSpec(port=server.port, tube=tube, concurrency=row.concurrency,
                          push=row.push,
                          time_limit_s=self.scale.consume_limit_s + DRAIN_WAIT_S + 5.0)
        pipes: list[multiprocessing.connection.Connection] = []
        workers: list[multiprocessing.process.BaseProcess] = []
        spies: dict[str, Recording] = {}
        try:
            for index in range(row.workers):
                ours, theirs = context.Pipe()
                child = context.Process(target=_worker_main, args=(spec, index, theirs, done),
                                        daemon=True)
                child.start()
                theirs.close()
                pipes.append(ours)
                workers.append(child)
            for pipe in pipes:
                _expect(pipe, "ready", WORKER_READY_TIMEOUT_S)
            watched = watched_pids(server.pids, workers, "worker")
            go_at = time.monotonic() + 0.05
            for pipe in pipes:
                pipe.send(("go", go_at))
            if profile:
                spies = self._spies(server, workers)
            time.sleep(max(0.0, go_at - time.monotonic()))
            cpu_start = CpuSnapshot.take(watched)
            deadline = go_at + self.scale.consume_limit_s
            failure: str | None = None
            cpu_end: CpuSnapshot | None = None
            drain_deadline = math.inf
            while True:  # bounded by deadline, then by drain_deadline
                completed = sum(done)
                now = time.monotonic()
                if cpu_end is None and completed >= timed:
                    cpu_end = CpuSnapshot.take(watched)
                    drain_deadline = now + DRAIN_WAIT_S
                if completed >= jobs or now >= drain_deadline:
                    break  # an unfinished drain is reported (all-jobs rate n/a), not a failure
                if cpu_end is None and now >= deadline:
                    failure = (f"time limit: {completed} of {timed} timed jobs in "
                               f"{self.scale.consume_limit_s:.0f} s")
                    break
                early = [p for p in pipes if p.poll()]
                if early:  # a worker failed (or died) before the jobs were done
                    failure = _early_message(early[0])
                    break
                time.sleep(POLL_S)
            if cpu_end is None:
                cpu_end = CpuSnapshot.take(watched)
            cpu = CpuWindow.between(cpu_start, cpu_end)
            for pipe in pipes:
                with contextlib.suppress(OSError):
                    pipe.send(("stop",))
            reports = [_result_of(pipe) for pipe in pipes]
            profiles = {label: spy.finish(self.scale.profile_s + PY_SPY_SLACK_S)
                        for label, spy in spies.items()}
        finally:
            for spy in spies.values():
                spy.stop()
            for pipe in pipes:
                pipe.close()
            for process in workers:
                _stop_process(process)
        stamps = sorted(t for r in reports for t in r.pop("completions", []))
        problems = [failure] if failure else []
        problems += [r["error"] for r in reports if "error" in r]
        for index, report in enumerate(reports):
            modes = report.get("modes")
            if modes is not None and set(modes) != {row.expected_mode}:
                problems.append(f"worker {index} consumed in modes {modes}, expected "
                                f"{row.expected_mode}")
            if report.get("warnings"):
                problems.append(f"worker {index}: {report['warnings']} client warnings, e.g. "
                                f"{report.get('warning_samples')}")
        if len(stamps) >= timed:
            counted, seconds = timed, stamps[timed - 1] - go_at
        else:
            counted, seconds = len(stamps), cpu_end.at - go_at
        seconds = max(seconds, 1e-9)
        all_jobs_s = stamps[jobs - 1] - go_at if len(stamps) >= jobs else None
        in_cpu_window = bisect.bisect_right(stamps, cpu_end.at)
        pct = cpu.percent_by_label
        worker_pct = [pct.get(f"worker{i}") for i in range(row.workers)]
        server_pct = {k: v for k, v in pct.items()
                      if not k.startswith("worker") and k != "coordinator"}
        us_per_job = {k: _us_per_job(v, cpu.seconds, in_cpu_window)
                      for k, v in server_pct.items()}
        us_per_job["workers"] = _us_per_job(sum(v or 0.0 for v in worker_pct), cpu.seconds,
                                            in_cpu_window)
        out: dict[str, Any] = {
            "ok": not problems, "timed": timed, "completed": len(stamps),
            "seconds": round(seconds, 4), "jobs_per_s": counted / seconds,
            "all_jobs_s": None if all_jobs_s is None else round(all_jobs_s, 4),
            "all_jobs_per_s": None if all_jobs_s is None else jobs / all_jobs_s,
            "cpu_pct": server_pct, "worker_cpu_pct": worker_pct,
            "coordinator_cpu_pct": pct.get("coordinator"),
            "other_cores": round(cpu.other_cores, 3), "us_per_job": us_per_job,
            "workers_report": reports,
        }
        if problems:
            out["error"] = "; ".join(problems)
        if profile:
            out["profiles"] = profiles
        return out

    def _spies(self, server: Server, workers: Sequence[multiprocessing.process.BaseProcess],
               ) -> dict[str, Recording]:
        """py-spy on the tubeq process (when the server is tubeq) and on the first worker."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        targets = [("worker", workers[0].pid)]
        if isinstance(server, Tubeq):
            targets.insert(0, ("tubeq", server.pids["tubeq"]))
        return {label: Recording.start(pid, self.scale.profile_s,
                                       self.log_dir / f"pyspy-{label}.txt")
                for label, pid in targets if pid is not None}

    def _record(self, entry: dict[str, Any]) -> None:
        self.runs.append(entry)
        rate = entry.get("jobs_per_s")
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in (entry.get("cpu_pct") or {}).items()
                        if v is not None)
        workers = entry.get("worker_cpu_pct") or entry.get("generator_cpu_pct") or []
        who = "workers" if "worker_cpu_pct" in entry else "gen"
        extra = f" fill {entry['fill_jobs_per_s']:,.0f}/s" if entry.get("fill_jobs_per_s") else ""
        if entry.get("all_jobs_per_s"):
            extra += f" all {entry['all_jobs_per_s']:,.0f}/s"
        status = "" if entry.get("ok") else f"  FAILED {entry.get('error') or entry.get('errors')}"
        self.log(f"[{self.elapsed():5.0f}s] {entry['kind']:<7} {entry['row']:<22} rep "
                 f"{entry['rep'] + 1}: {rate or 0:>8,.0f} jobs/s  cpu {cpu}  {who} "
                 f"{[round(w or 0) for w in workers]}  other {entry.get('other_cores')}"
                 f"{extra}{status}")

    # -- profile -------------------------------------------------------------------------------

    def profile(self, rows: Sequence[ConsumeRow]) -> dict[str, Any] | None:
        """The best push row once more, under py-spy (tubeq and one worker) and commandstats."""
        push_rows = [r for r in rows if r.target == "tubeq push"]
        medians = {r.key: median_of(x["jobs_per_s"] for x in self.runs
                                  if x["kind"] == "consume" and x["row"] == r.key and x["ok"])
                   for r in push_rows}
        measured = {k: v for k, v in medians.items() if v}
        if not measured:
            self.notes.append("no push row succeeded, so there is no profile")
            return None
        best_key = max(measured, key=lambda k: measured[k])
        row = next(r for r in push_rows if r.key == best_key)
        # Enough jobs to keep the worker busy for the whole py-spy duration, within the budget.
        wanted = int(measured[best_key] * (self.scale.profile_s + 1.5))
        jobs = max(PROFILE_MIN_JOBS, min(PROFILE_MAX_JOBS, wanted))
        self.log(f"[{self.elapsed():5.0f}s] profile: {row.key}, {jobs:,} jobs")
        entry = self.consume(row, rep=self.scale.repetitions, profile=True, jobs=jobs)
        return entry


def timed_jobs(jobs: int) -> int:
    """The completions the clock runs for (TIMED_SHARE of the pre-filled jobs)."""
    return max(1, math.floor(jobs * TIMED_SHARE))


def _expect(pipe: multiprocessing.connection.Connection, kind: str, timeout: float) -> Any:
    if not pipe.poll(timeout):
        raise TimeoutError(f"a worker did not say {kind!r} within {timeout:.0f} s")
    got, payload = pipe.recv()
    if got != kind:
        raise RuntimeError(f"a worker said {got!r} instead of {kind!r}: {payload}")
    return payload


def _early_message(pipe: multiprocessing.connection.Connection) -> str:
    try:
        return str(pipe.recv()[1])
    except (EOFError, OSError) as exc:
        return f"a worker exited early: {exc!r}"


def _result_of(pipe: multiprocessing.connection.Connection) -> dict[str, Any]:
    try:
        if not pipe.poll(WORKER_STOP_TIMEOUT_S + 5.0):
            return {"error": "the worker did not report after stop"}
        kind, payload = pipe.recv()
    except (EOFError, OSError) as exc:
        return {"error": f"the worker's pipe broke: {exc!r}"}
    if kind != "result":
        return {"error": str(payload)}
    return dict(payload)


def _stop_process(process: multiprocessing.process.BaseProcess) -> None:
    """Our own child, by its PID: wait, then SIGTERM, then SIGKILL."""
    process.join(JOIN_TIMEOUT_S)
    if process.is_alive():
        process.terminate()
        process.join(JOIN_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join(JOIN_TIMEOUT_S)


def _script_stats(stats: dict[str, dict[str, float]], jobs: int) -> dict[str, float]:
    """Lua script calls and Redis µs per job (EVALSHA/FCALL include the commands they run)."""
    calls = sum(stats.get(name, {}).get("calls", 0.0) for name in SCRIPT_RUNNERS)
    usec = sum(stats.get(name, {}).get("usec", 0.0) for name in SCRIPT_RUNNERS)
    return {"calls_per_job": round(calls / jobs, 3), "usec_per_job": round(usec / jobs, 2),
            "usec_per_call": round(usec / calls, 2) if calls else 0.0}


# -- summary -----------------------------------------------------------------------------------

@dataclass
class RowSummary:
    """One row over its repetitions: medians and min-max."""

    key: str
    runs: list[dict[str, Any]]

    @property
    def ok_runs(self) -> list[dict[str, Any]]:
        return [r for r in self.runs if r.get("ok")]

    def rates(self) -> list[float]:
        return [r["jobs_per_s"] for r in self.ok_runs]

    @property
    def median(self) -> float | None:
        return median_of(self.rates())

    def spread(self) -> str:
        rates = self.rates()
        if not rates:
            return "n/a"
        return f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"

    def cpu(self, label: str) -> float | None:
        return median_of((r.get("cpu_pct") or {}).get(label) for r in self.ok_runs)

    def worker_cpu(self, index: int) -> float | None:
        return median_of((r.get("worker_cpu_pct") or [None] * (index + 1))[index]
                       for r in self.ok_runs)

    def us(self, label: str) -> float | None:
        return median_of((r.get("us_per_job") or {}).get(label) for r in self.ok_runs)

    def other(self) -> tuple[float | None, float | None]:
        values = [r.get("other_cores") for r in self.ok_runs]
        present = [v for v in values if v is not None]
        return median_of(present), (max(present) if present else None)

    def fill(self) -> float | None:
        return median_of(r.get("fill_jobs_per_s") for r in self.ok_runs)

    def shared(self) -> bool:
        median, _ = self.other()
        return median is not None and median >= SHARED_BOX_CORES

    def disturbed_reps(self) -> list[int]:
        return [r["rep"] for r in self.ok_runs
                if (r.get("other_cores") or 0.0) >= SHARED_BOX_CORES]


def summarise(results: dict[str, Any],
              rows: Sequence[ConsumeBenchRow]) -> dict[str, RowSummary]:
    measured = [r for r in results["runs"] if r["kind"] in ("cycle", "consume")]
    return {row.key: RowSummary(row.key, [r for r in measured if r["row"] == row.key])
            for row in rows}


def reference(summaries: dict[str, RowSummary]) -> tuple[str | None, float | None]:
    """beanstalkd's best pipelined cycle rate (median) and its row."""
    cycles = [(s.median, key) for key, s in summaries.items()
              if key.startswith("cycle") and s.median]
    if not cycles:
        return None, None
    rate, key = max(cycles)
    return key, rate


# -- the report --------------------------------------------------------------------------------

def _us(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def _other(summary: RowSummary) -> str:
    median, worst = summary.other()
    if median is None:
        return "n/a"
    text = f"{median:.2f} (max {worst:.2f})"
    if summary.shared():
        return text + " **shared**"
    disturbed = summary.disturbed_reps()
    if disturbed:
        return text + f" rep {', '.join(str(r + 1) for r in disturbed)} disturbed"
    return text


def _bottleneck(row: ConsumeRow, s: RowSummary) -> str:
    """Which process ran at (close to) a full core, from the medians."""
    labels: list[tuple[str, float | None]] = []
    if row.server == "beanstalkd":
        labels.append(("beanstalkd", s.cpu("beanstalkd")))
    else:
        labels += [("tubeq", s.cpu("tubeq")), ("redis", s.cpu("redis"))]
    labels += [(f"worker{i + 1}" if row.workers > 1 else "worker", s.worker_cpu(i))
               for i in range(row.workers)]
    busy = [name for name, pct in labels if pct is not None and pct >= SATURATED_PCT]
    other, _ = s.other()
    total = sum(pct or 0.0 for _, pct in labels) + 100.0 * (other or 0.0)
    box = total >= 100.0 * CORES * 0.9
    parts = []
    if busy:
        parts.append(" + ".join(busy) + " saturated")
    if box:
        parts.append(f"box full ({total / 100:.1f} of {CORES} cores)")
    return "; ".join(parts) or "no process saturated"


def all_us_per_job(row: ConsumeRow, s: RowSummary) -> float | None:
    """CPU per job of server, Redis and workers together (medians of each)."""
    parts = [s.us("beanstalkd")] if row.server == "beanstalkd" else [s.us("tubeq"), s.us("redis")]
    parts.append(s.us("workers"))
    return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)


def consume_table(rows: Sequence[ConsumeRow], summaries: dict[str, RowSummary],
                  ref: float | None) -> list[str]:
    header = ["row", "jobs/s median (min-max)", "/ bs cycle", "all jobs/s", "fill jobs/s",
              "CPU % server (tubeq / redis)", "CPU % worker(s)", "server us/job",
              "worker us/job", "all us/job (box ceiling jobs/s)", "Redis scripts/job, us/job",
              "other cores", "who saturates"]
    out = []
    for row in rows:
        s = summaries[row.key]
        if row.server == "beanstalkd":
            server_cpu = fmt_pct(s.cpu("beanstalkd"))
            server_us = _us(s.us("beanstalkd"))
            scripts = "-"
        else:
            server_cpu = f"{fmt_pct(s.cpu('tubeq'))} / {fmt_pct(s.cpu('redis'))}"
            tq, rd = s.us("tubeq"), s.us("redis")
            server_us = (f"{_us(tq)} + {_us(rd)}" if tq is not None and rd is not None
                         else "n/a")
            calls = median_of(r.get("redis_scripts", {}).get("calls_per_job") for r in s.ok_runs)
            usec = median_of(r.get("redis_scripts", {}).get("usec_per_job") for r in s.ok_runs)
            scripts = "n/a" if calls is None or usec is None else f"{calls:.2f}, {usec:.1f}"
        workers = " + ".join(fmt_pct(s.worker_cpu(i)) for i in range(row.workers))
        failed = len(s.runs) - len(s.ok_runs)
        rate = s.spread() + (f" ({failed} failed)" if failed else "")
        fill = s.fill()
        total = all_us_per_job(row, s)
        ceiling = "n/a" if not total else f"{total:.1f} ({CORES * 1e6 / total:,.0f})"
        drained = median_of(r.get("all_jobs_per_s") for r in s.ok_runs)
        out.append([row.key, rate, fmt_x(ratio_of(s.median, ref)),
                    "n/a" if drained is None else f"{drained:,.0f}",
                    "n/a" if fill is None else f"{fill:,.0f}", server_cpu, workers, server_us,
                    _us(s.us("workers")), ceiling, scripts, _other(s), _bottleneck(row, s)])
    return table(header, out, blank_after=False)


def cycle_table(summaries: dict[str, RowSummary]) -> list[str]:
    out = []
    for row in CYCLE_ROWS:
        s = summaries[row.key]
        gens = [median_of((r.get("generator_cpu_pct") or [None] * row.procs)[i]
                        for r in s.ok_runs) for i in range(row.procs)]
        out.append([f"beanstalkd {row.key} ({row.procs} generator process"
                    f"{'es' if row.procs > 1 else ''})", s.spread(), fmt_pct(s.cpu("beanstalkd")),
                    " + ".join(fmt_pct(g) for g in gens), _other(s)])
    return table(["row", "jobs/s median (min-max)", "CPU % beanstalkd", "CPU % generator(s)",
                  "other cores"], out, blank_after=False)


def _profile_lines(profile: dict[str, Any] | None, ref: float | None) -> list[str]:
    if profile is None:
        return ["No profile: no push row succeeded."]
    lines = [f"Row `{profile['row']}`, {profile['jobs']:,} jobs, run once more with py-spy "
             f"attached to the tubeq process and to the worker: {profile.get('jobs_per_s', 0):,.0f}"
             f" jobs/s under py-spy ({fmt_x(ratio_of(profile.get('jobs_per_s'), ref))}; not used "
             "above). "
             f"CPU % in that run: "
             + ", ".join(f"{k} {fmt_pct(v)}" for k, v in (profile.get("cpu_pct") or {}).items())
             + ", worker(s) " + " + ".join(fmt_pct(v) for v in profile.get("worker_cpu_pct") or [])
             + f", other {profile.get('other_cores')} cores."]
    scripts = profile.get("redis_scripts")
    if scripts:
        lines.append("")
        lines.append(f"Redis (INFO commandstats over the run): {scripts['calls_per_job']} script "
                     f"calls per job, {scripts['usec_per_job']} us of Redis per job, "
                     f"{scripts['usec_per_call']} us per call.")
    if profile.get("error"):
        lines += ["", f"That run reported: {profile['error']}"]
    for label, spy in (profile.get("profiles") or {}).items():
        lines += ["", f"**{label}** ({SAMPLING})"]
        if "problem" in spy:
            lines.append(f"py-spy: {spy['problem']}")
            continue
        lines.append(f"{spy['samples']} samples; raw stacks in `{spy['raw']}`.")
        lines.append("")
        rows = [[name, f"{share:.1f}"] for name, share in spy["own"][:TOP_FUNCTIONS]]
        lines += table(["top functions by own time", "% of samples"], rows, blank_after=False)
        lines.append("")
        rows = [[name, f"{share:.1f}"] for name, share in
                spy.get("inclusive_tubeq", [])[:TOP_FUNCTIONS]]
        lines += table(["tubeq functions, including callees", "% of samples"], rows,
                       blank_after=False)
        lines.append("")
        lines += table(["source area of the innermost frame", "% of samples"],
                       [[a, f"{v:.1f}"] for a, v in spy.get("areas", [])], blank_after=False)
    return lines


def render(results: dict[str, Any]) -> str:
    scale = ConsumeScale(**results["meta"]["scale"])
    rows: list[ConsumeBenchRow] = [*CYCLE_ROWS, *consume_rows(scale)]
    summaries = summarise(results, rows)
    ref_key, ref = reference(summaries)
    crows = consume_rows(scale)
    meta = results["meta"]
    elapsed = meta["elapsed_s"]
    lines = [
        "# consume() throughput: tubeq with and without push, and beanstalkd",
        "",
        f"Written by `python -m bench.consume_bench{' --quick' if scale.name == 'quick' else ''}`"
        f" (bench/consume_bench.py) on {meta['started']} (UTC); the run took "
        f"{int(elapsed // 60)} min {int(elapsed % 60)} s. Scale **{scale.name}**: "
        f"{scale.repetitions} interleaved repetition(s); {scale.jobs:,} jobs of {BODY_SIZE} B per "
        f"consume run; cycle rows {scale.cycle_window_s} s after {scale.cycle_warmup_s} s of "
        "warm-up.",
        "",
        "## Machine and versions",
        "",
        *table(["what", "value"], [[k, str(v)] for k, v in meta["machine"].items()],
               blank_after=False),
        "",
        "## Method",
        "",
        "* Every run starts a fresh server on a free 127.0.0.1 port (bench/harness/servers.py) "
        "and stops it by PID: `beanstalkd -l 127.0.0.1 -p PORT` (no binlog), or tubeq "
        "(`python -m tubeq ... --redis URL`) on its own private redis-server (no persistence).",
        "* **Reference**: beanstalkd's pipelined put+reserve+delete rate, "
        "bench/harness/loadgen.py cycle mode (N producer + N consumer connections, 16 commands "
        "in flight each, 100 B; 64 "
        "connections are driven by 2 generator processes). The best of the two rows' medians "
        "is the reference of every ratio.",
        f"* **consume rows**: the tube is first filled with {scale.jobs:,} jobs of 100 B "
        f"(loadgen put mode, {FILL_CONNECTIONS} connections x {FILL_IN_FLIGHT} in flight; "
        "`fill jobs/s`), outside the clock. Then 1 or 2 worker processes (uvloop) each run "
        "`Client(...).consume(tube, concurrency=C)` (its default connections: one per 16 jobs "
        "in flight, at most 4) and "
        "hand every job to a handler that only returns, in a task per job as `Consumer.run` "
        "does, so `async with job` deletes it. The clock starts when the workers start "
        f"(connecting included) and stops at the DELETED of the {timed_jobs(scale.jobs):,}th "
        f"job ({TIMED_SHARE:.0%}), while the tube still holds ready jobs: jobs/s = "
        f"{timed_jobs(scale.jobs):,} / that time. Why not all: when the tube runs dry, a "
        "pipelined reserve blocks for `reserve_timeout` (1 s), and the DELETED replies queued "
        "behind it (replies keep command order, in beanstalkd and in tubeq) arrive only when it "
        "times out; that idle tail would hit the reserve rows, not the push rows. `all jobs/s` "
        "= all jobs / the time to the last DELETED, tail included, for reference. `cN` = "
        "concurrency N in one worker process, `c2xN` = two worker processes of concurrency N "
        "each.",
        "* `beanstalkd` rows use `push=None` (the client sends `push`, gets UNKNOWN_COMMAND and "
        "falls back to pipelined `reserve-with-timeout`), `tubeq reserve` rows force that "
        "fallback with `push=False`, `tubeq push` rows use `push=True`. Each worker reports the "
        "mode its connections used; a mismatch fails the run.",
        "* CPU is % of one core over the timed window, from /proc/PID/stat: the server "
        "(beanstalkd, or the tubeq process / its redis-server), each worker process. `us/job` "
        "= that CPU time / jobs (server: tubeq + redis); `all us/job` adds the workers', and "
        "the box ceiling is what the machine's cores could do at that cost. "
        "`Redis scripts/job, us/job` comes from INFO commandstats (EVALSHA or FCALL) over the "
        "window.",
        "* `other` is what the rest of the machine used, in cores (other tenants): median (max) "
        f"over the repetitions. A row whose median is >= {SHARED_BOX_CORES} is marked "
        f"**shared**; a single repetition at >= {SHARED_BOX_CORES} is named as disturbed. Each "
        f"run first waits up to {scale.quiet_wait_s} s for the machine to use < {QUIET_CORES} "
        f"cores. `who saturates` names the processes at >= {SATURATED_PCT:.0f} % of a core and "
        f"says when the box ({CORES} cores) was full.",
        "* Cells are the **median over repetitions (min-max)**; repetitions are interleaved "
        "(each walks every row, in reverse order every other time).",
        "",
        "## Target of issue 3",
        "",
    ]
    push = [(median, r.key, r.workers) for r in crows
            if r.target == "tubeq push" and (median := summaries[r.key].median)]
    if ref is None or not push:
        lines.append("Not judged: the reference or every push row failed (see notes).")
    else:
        best, best_key, _ = max(push)
        single = [(v, k) for v, k, workers in push if workers == 1]
        met = best >= TARGET_RATIO * ref
        lines += table(
            ["target", "needed", "measured", "", "row"],
            [[f"consume() with push >= {TARGET_RATIO}x beanstalkd's best pipelined cycle "
              f"({ref:,.0f} jobs/s, `{ref_key}`)", f"{TARGET_RATIO * ref:,.0f} jobs/s",
              f"{best:,.0f} jobs/s = {best / ref:.2f}x", "**met**" if met else "**missed**",
              best_key]], blank_after=False)
        best_row = next(r for r in crows if r.key == best_key)
        spent = all_us_per_job(best_row, summaries[best_key])
        if spent:
            lines += ["", f"CPU budget: at {TARGET_RATIO * ref:,.0f} jobs/s the {CORES} cores of "
                      f"this machine allow at most {CORES * 1e6 / (TARGET_RATIO * ref):.1f} us of "
                      "CPU per job for the server, Redis and the worker(s) together (they all run "
                      f"here); `{best_key}` spends {spent:.1f} us per job, which caps it at "
                      f"{CORES * 1e6 / spent:,.0f} jobs/s even with both cores fully used by it "
                      "alone."]
        if single:
            v, k = max(single)
            lines += ["", f"Best single worker process with push: `{k}`, {v:,.0f} jobs/s = "
                      f"{v / ref:.2f}x."]
        reserve = [(median, r.key) for r in crows
                   if r.target == "tubeq reserve" and (median := summaries[r.key].median)]
        if reserve:
            rv, rk = max(reserve)
            lines += ["", f"What push gains over pipelined reserves on tubeq (best rows): "
                      f"{best / rv:.2f}x ({best:,.0f} vs {rv:,.0f} jobs/s, `{rk}`)."]
    lines += [
        "",
        "## beanstalkd's pipelined cycle (the reference)",
        "",
        *cycle_table(summaries),
        "",
        "## consume() worker",
        "",
        *consume_table(crows, summaries, ref),
        "",
        "## Where the time goes (py-spy during the best push row)",
        "",
        *_profile_lines(results.get("profile"), ref),
        "",
        "## Notes",
        "",
    ]
    notes = list(results.get("notes", []))
    for run in results["runs"]:
        if not run.get("ok"):
            notes.append(f"{run['row']} rep {run['rep'] + 1} ({run['kind']}) failed: "
                         f"{run.get('error') or run.get('errors')}")
    lines += [f"* {n}" for n in notes] or ["* none"]
    return "\n".join(lines) + "\n"


def _hand_written(path: Path) -> str:
    """What an existing report has below HAND_MARKER (kept across rewrites)."""
    if not path.exists():
        return ""
    text = path.read_text()
    _, marker, tail = text.partition(HAND_MARKER)
    return marker + tail if marker else ""


def write_report(results: dict[str, Any], output: Path) -> None:
    kept = _hand_written(output)
    text = render(results)
    output.write_text(text + ("\n" + kept if kept else ""))


# -- main --------------------------------------------------------------------------------------

def run(scale: ConsumeScale, output: Path) -> dict[str, Any]:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    bench = ConsumeBench(scale, log)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC)
    crows = consume_rows(scale)
    log(f"consume bench: {scale.name} run, logs in {bench.log_dir.relative_to(REPO_ROOT)}")
    bench.repetitions([*CYCLE_ROWS, *crows])
    profile = bench.profile(crows)
    if bench.gate.busy_starts:
        bench.notes.append(
            f"{bench.gate.busy_starts} runs started while other processes used >= {QUIET_CORES} "
            f"cores (after {BUSY_STREAK_GIVE_UP} such runs in a row the harness stops waiting "
            "for quiet until a quiet sample comes back); see `other cores` per row.")
    results: dict[str, Any] = {
        "meta": {"scale": asdict(scale), "started": started_at.isoformat(timespec="seconds"),
                 "elapsed_s": round(bench.elapsed(), 1), "machine": machine_and_versions()},
        "runs": bench.runs, "profile": profile, "notes": bench.notes,
    }
    raw = OUT_DIR / f"consume-{bench.stamp}.json"
    raw.write_text(json.dumps(results, indent=1))
    write_report(results, output)
    print(render_console(results))
    log(f"consume bench: done in {bench.elapsed() / 60:.1f} min; raw results "
        f"{raw.relative_to(REPO_ROOT)}, report {_shown(output)}")
    return results


def render_console(results: dict[str, Any]) -> str:
    """The report's target and tables, for the terminal."""
    text = render(results)
    start = text.index("## Target of issue 3")
    end = text.index("## Where the time goes")
    return text[start:end].rstrip()


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.consume_bench",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--quick", action="store_true",
                   help="1 repetition, small counts; writes bench/out/RESULTS-consume-quick.md")
    p.add_argument("--output", type=Path, default=None,
                   help="report path (default bench/RESULTS-consume.md; quick: bench/out/)")
    p.add_argument("--render", type=Path, default=None, metavar="RESULTS_JSON",
                   help="only re-render a saved bench/out/consume-*.json")
    args = p.parse_args(argv)
    output: Path = args.output or (QUICK_RESULTS_PATH if args.quick else RESULTS_PATH)
    if args.render is not None:
        write_report(json.loads(args.render.read_text()), output)
        return 0
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        run(QUICK if args.quick else FULL, output)
    except Stop as stop:  # every process it started has been stopped on the way out
        print(f"consume bench: stopped by {stop}", file=sys.stderr)
        return 128 + signal.SIGTERM
    return 0


if __name__ == "__main__":
    sys.exit(main())
