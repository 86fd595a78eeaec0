"""Where a small report's time goes: each phase of ``tubeq-pipeline report`` in a fresh JVM, then
the same report again in the now warm session.

    .venv/bin/python -m bench.probes.report_phases [--events 1000] [--warm 2] [--java-options ""]
        [--conf spark.sql.adaptive.enabled=false ...]

The archive (``--events`` events of bench.pipeline_report_bench's generator) is written by a
child process, so this process's JVM is fresh when the first report starts. Each run prints the
seconds and the Spark jobs (the session's status tracker) of: reading and building the tables
(``build_report`` runs one job itself, the backlog's bounds), writing each table, and the
read-back that report.html is built from; the first run also the session's start. The CPU
seconds of this process's tree are sampled around each run (the JVM and Spark's Python workers
are its children). ``--java-options``: extra options of the JVM (e.g. ``-XX:TieredStopAtLevel=1``);
``--conf KEY=VALUE``: a SQL setting of the session, set after its start (repeatable).
No network beyond loopback; bounded by ``--warm``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness.machine import cpu_model
from bench.pipeline_report_bench import tree_cpu

GENERATE_TIMEOUT_S = 300


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
    """Seconds and Spark jobs of each named phase of one run."""

    def __init__(self, spark: Any) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.rows: list[tuple[str, float, int]] = []
        self._mark()

    def _mark(self) -> None:
        self.at, self.jobs = time.monotonic(), len(self.tracker.getJobIdsForGroup(None))

    def done(self, name: str) -> None:
        jobs = len(self.tracker.getJobIdsForGroup(None))
        self.rows.append((name, time.monotonic() - self.at, jobs - self.jobs))
        self._mark()


def one_report(spark: Any, archive: Path, out: Path) -> list[tuple[str, float, int]]:
    from tubeq.pipeline import report
    from tubeq.pipeline.tables import TABLES

    phases = Phases(spark)
    tables = report.build_report(report.read_archive(spark, str(archive)))
    phases.done("read and build")
    for name in TABLES:
        tables[name].coalesce(1).write.mode("overwrite").parquet(str(out / name))
        phases.done(f"write {name}")
    for name in TABLES:
        spark.read.parquet(str(out / name)).collect()
    phases.done("read back")
    report.release(tables)
    return phases.rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--warm", type=int, default=2, help="runs after the first")
    parser.add_argument("--java-options", default="")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    os.environ["SPARK_SUBMIT_OPTS"] = args.java_options
    with tempfile.TemporaryDirectory(prefix="tubeq-report-phases-") as scratch:
        archive = Path(scratch) / "archive"
        generate_in_child(args.events, archive)
        from tubeq.pipeline.session import spark_session

        cpu, started = cpu_seconds(), time.monotonic()
        spark = spark_session("local[2]", app_name="tubeq-report-phases")
        start = (time.monotonic() - started, cpu_seconds() - cpu)
        for setting in args.conf:
            key, _, value = setting.partition("=")
            spark.conf.set(key, value)
        print(f"CPU: {cpu_model()}; {args.events} events; JVM options "
              f"{args.java_options or '(none)'}; settings {args.conf or '(none)'}; session start "
              f"{start[0]:.1f} s, {start[1]:.1f} CPU-s")
        for run in range(1 + args.warm):
            cpu, started = cpu_seconds(), time.monotonic()
            rows = one_report(spark, archive, Path(scratch) / f"report-{run}")
            wall, used = time.monotonic() - started, cpu_seconds() - cpu
            print(f"run {run} ({'fresh JVM' if run == 0 else 'warm'}): {wall:.1f} s, "
                  f"{used:.1f} CPU-s, {sum(jobs for _, _, jobs in rows)} Spark jobs")
            for name, seconds, jobs in rows:
                print(f"    {name:24s} {seconds:6.2f} s  {jobs:3d} jobs")
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
