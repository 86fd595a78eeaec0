"""Where a report's time goes: each phase of ``tubeq-pipeline report`` in a fresh JVM, then the
same report again in the now warm session, with Spark's own account of its jobs.

    .venv/bin/python -m bench.probes.report_phases [--events 1000 | --archive DIR] [--warm 2]
        [--java-options ""] [--conf KEY=VALUE ...] [--driver-samples N] [--stages]

The archive (``--events`` events of bench.pipeline_report_bench's generator) is written by a
child process, so this process's JVM is fresh when the first report starts (``--archive``: an
existing one). Each run prints the wall and CPU seconds (this process's tree: the driver, the JVM
and Spark's Python workers, sampled from /proc) of its phases: ``aggregate`` (Spark: the per-job
window, the flows and tries, the percentiles), the roll-up of the tables in this process, and the
writing of the tables and report.html; the first run also the session's start. Then, from
Spark's event log (written to a temporary folder, read when the session has stopped), each Spark
action (SQL execution) of every run: its call site, wall seconds, jobs, stages, tasks, the tasks'
run and CPU seconds, and the seconds the driver spent before it since the previous one ended
(planning, code generation, Python). ``--java-options``: extra options of the JVM (e.g.
``-XX:TieredStopAtLevel=1``); ``--conf KEY=VALUE``: a SQL setting, set after the start
(repeatable). No network beyond loopback; bounded by ``--warm``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.machine import cpu_model
from bench.pipeline_report_bench import tree_cpu

GENERATE_TIMEOUT_S = 600


def generate_in_child(events: int, path: Path) -> None:
    """The archive, written by a child process (its JVM is not this one)."""
    code = ("import sys; from pathlib import Path; from bench import pipeline_report_bench as b; "
            "b.generate_archive(b.spark_session(), int(sys.argv[1]), Path(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", code, str(events), str(path)], check=True,
                   capture_output=True, timeout=GENERATE_TIMEOUT_S)


def cpu_seconds() -> float:
    seen: dict[int, float] = {}
    tree_cpu(os.getpid(), seen)
    return sum(seen.values())


class Phases:
    """Wall and CPU seconds of each named phase of one run."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []
        self._mark()

    def _mark(self) -> None:
        self.at, self.cpu = time.monotonic(), cpu_seconds()

    def done(self, name: str) -> None:
        self.rows.append((name, time.monotonic() - self.at, cpu_seconds() - self.cpu))
        self._mark()


def one_report(spark: Any, archive: Path, out: Path,
               driver_samples: int) -> list[tuple[str, float, float]]:
    from tubeq.pipeline import report
    from tubeq.pipeline.rollup import report_tables

    phases = Phases()
    computed = report.aggregate(report.read_archive(spark, str(archive)), driver_samples)
    phases.done("aggregate (Spark)")
    tables = report_tables(computed.flows, computed.figures, computed.tries)
    phases.done("roll up the tables")
    report.write_report(tables, out)
    phases.done("write tables and page")
    return phases.rows


@dataclass
class Action:
    """One SQL execution of the event log, and the jobs it ran."""

    label: str
    start_ms: int
    end_ms: int = 0
    jobs: list[int] = field(default_factory=list)


def read_event_log(folder: Path) -> tuple[int, list[Action], dict[int, Any], dict[int, Any]]:
    """The application's start, its actions in order, its jobs and its stages (by id)."""
    lines = [line for path in sorted(folder.rglob("*")) if path.is_file()
             and not path.name.startswith(".") for line in path.read_text().splitlines()]
    start = 0
    actions: dict[int, Action] = {}
    jobs: dict[int, dict[str, Any]] = {}
    stages: dict[int, dict[str, Any]] = {}
    for line in lines:
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerApplicationStart":
            start = event["Timestamp"]
        elif kind.endswith("SQLExecutionStart"):
            label = event.get("description", "").split(" at ")[0] + " at " + (
                event.get("description", "").rsplit("/", 1)[-1])
            actions[event["executionId"]] = Action(label, event["time"])
        elif kind.endswith("SQLExecutionEnd"):
            actions[event["executionId"]].end_ms = event["time"]
        elif kind == "SparkListenerJobStart":
            execution = event.get("Properties", {}).get("spark.sql.execution.id")
            jobs[event["Job ID"]] = {"start": event["Submission Time"],
                                     "stages": event["Stage IDs"], "execution": execution}
            if execution is not None and int(execution) in actions:
                actions[int(execution)].jobs.append(event["Job ID"])
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            metrics = {a["Name"]: a.get("Value") for a in info.get("Accumulables", [])}
            stages[info["Stage ID"]] = {
                "tasks": info["Number of Tasks"],
                "run_s": int(metrics.get("internal.metrics.executorRunTime") or 0) / 1000,
                "cpu_s": int(metrics.get("internal.metrics.executorCpuTime") or 0) / 1e9,
                "metrics": metrics}
    return start, [actions[key] for key in sorted(actions)], jobs, stages


def print_actions(folder: Path, stages_too: bool = False) -> None:
    start, actions, jobs, stages = read_event_log(folder)
    outside = [job for job, info in jobs.items() if info["execution"] is None]
    print(f"Spark's event log: {len(actions)} actions, {len(jobs)} jobs ({len(outside)} outside "
          f"any action: file listing), {len(stages)} stages run")
    print(f"    {'action (call site)':44s} {'at':>7s} {'before':>6s} {'wall':>6s} jobs stages "
          f"tasks {'run':>6s} {'CPU':>6s}")
    previous = start
    for action in actions:
        ran = [stage for job in action.jobs for stage in jobs[job]["stages"] if stage in stages]
        print(f"    {action.label[:44]:44s} {(action.start_ms - start) / 1000:7.2f} "
              f"{(action.start_ms - previous) / 1000:6.2f} "
              f"{(action.end_ms - action.start_ms) / 1000:6.2f} {len(action.jobs):4d} "
              f"{len(ran):6d} {sum(stages[s]['tasks'] for s in ran):5d} "
              f"{sum(stages[s]['run_s'] for s in ran):6.2f} "
              f"{sum(stages[s]['cpu_s'] for s in ran):6.2f}")
        previous = action.end_ms or action.start_ms
        if stages_too:
            for stage in ran:
                print_stage(stage, stages[stage])


# The SQL operators' timings (ms) and the stage's I/O, as the event log names them.
STAGE_METRICS = (("shuffle.write.bytesWritten", "shuffle out MB", 1e6),
                 ("shuffle.read.remoteBytesRead", "", 0),
                 ("shuffle.read.localBytesRead", "shuffle in MB", 1e6),
                 ("memoryBytesSpilled", "spilled MB", 1e6),
                 ("shuffle.write.writeTime", "shuffle write s", 1e9),
                 ("jvmGCTime", "GC s", 1e3))


def print_stage(stage: int, info: dict[str, Any]) -> None:
    """One stage's tasks, run and CPU seconds, shuffle bytes, spill, GC, and the timings its
    SQL operators report (``duration`` of each code-generated stage, sort and aggregation
    times), so a breakdown can say which operator the CPU went to."""
    metrics = info["metrics"]
    parts = []
    for key, label, scale in STAGE_METRICS:
        value = metrics.get(f"internal.metrics.{key}")
        if label and value:
            parts.append(f"{label} {int(value) / scale:.1f}")
    timings = sorted((name, value) for name, value in metrics.items()
                     if not name.startswith("internal.") and value is not None
                     and name != "shuffle write time"  # ns, and shown above
                     and any(word in name for word in ("time", "duration"))
                     and str(value).isdigit() and int(value) > 0)
    print(f"        stage {stage}: {info['tasks']} tasks, run {info['run_s']:.2f} s, CPU "
          f"{info['cpu_s']:.2f} s; {', '.join(parts)}")
    for name, value in timings:
        print(f"            {name}: {int(value) / 1000:.2f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--archive", type=Path, help="an existing archive instead")
    parser.add_argument("--warm", type=int, default=2, help="runs after the first")
    parser.add_argument("--java-options", default="")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--stages", action="store_true",
                        help="each action's stages too: tasks, CPU, shuffle bytes, spill, GC "
                             "and the SQL operators' timings")
    parser.add_argument("--driver-samples", type=int, default=None,
                        help="the report's --driver-samples (default: the report's)")
    args = parser.parse_args(argv)
    os.environ["SPARK_SUBMIT_OPTS"] = args.java_options
    with tempfile.TemporaryDirectory(prefix="tubeq-report-phases-") as scratch:
        archive = args.archive or Path(scratch) / "archive"
        if args.archive is None:
            generate_in_child(args.events, archive)
        log = Path(scratch) / "events"
        log.mkdir()
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{log} "
            "--conf spark.eventLog.compress=false --conf spark.eventLog.rolling.enabled=false "
            "pyspark-shell")
        from tubeq.pipeline.report import default_driver_samples
        from tubeq.pipeline.session import spark_session

        driver_samples = (default_driver_samples("local[2]", None) if args.driver_samples is None
                          else args.driver_samples)
        cpu, started = cpu_seconds(), time.monotonic()
        spark = spark_session("local[2]", app_name="tubeq-report-phases",
                              jvm_log=Path(scratch) / "jvm.log")
        start = (time.monotonic() - started, cpu_seconds() - cpu)
        for setting in args.conf:
            key, _, value = setting.partition("=")
            spark.conf.set(key, value)
        print(f"CPU: {cpu_model()}; archive {args.archive or f'{args.events} events'}; JVM "
              f"options {args.java_options or '(none)'}; settings {args.conf or '(none)'}; "
              f"--driver-samples {driver_samples}; load {os.getloadavg()[0]:.1f}; session start "
              f"{start[0]:.1f} s, {start[1]:.1f} CPU-s")
        totals: dict[str, list[float]] = defaultdict(list)
        for run in range(1 + args.warm):
            rows = one_report(spark, archive, Path(scratch) / f"report-{run}", driver_samples)
            wall, used = sum(row[1] for row in rows), sum(row[2] for row in rows)
            totals["wall"].append(wall)
            print(f"run {run} ({'fresh JVM' if run == 0 else 'warm'}): {wall:.1f} s, "
                  f"{used:.1f} CPU-s; load {os.getloadavg()[0]:.1f}")
            for name, seconds, cpu_s in rows:
                print(f"    {name:28s} {seconds:6.2f} s {cpu_s:6.1f} CPU-s")
        spark.stop()
        print_actions(log, args.stages)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
