"""Where a small ``archive --once`` spends its time: the session's start, the query's start and
its run in a fresh JVM, with Spark's own account of each micro-batch.

    .venv/bin/python -m bench.probes.archive_phases [--events 1000] [--partitions 2]
        [--java-options ""]

``--events`` events (bench.pipeline_bench's lifecycle, 4 per job) are written to a private
redis-server's stream (started here, on loopback, stopped by its PID), then this process runs
what ``tubeq-pipeline archive --once`` runs (``archive.start_archive`` on the product's session)
and prints, for each phase, its wall and the CPU seconds of this process's tree (the driver, the
JVM, Spark's Python workers and the source's Python processes, sampled from /proc), then each
micro-batch's ``durationMs`` from its progress report (queryPlanning, addBatch: the read and the
Parquet write, walCommit, commitOffsets, ...). The folder is read back and must hold every
event. ``--java-options``: extra options of the JVM (e.g. ``-XX:TieredStopAtLevel=1``; the
command itself adds that one for a short run). The seeding and the CPU sampling are the pipeline
scenario's (bench.pipeline_bench, bench.pipeline_report_bench), as in report_phases.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bench.harness.machine import cpu_model
from bench.pipeline_bench import seed
from bench.pipeline_report_bench import tree_cpu
from tubeq.redisio.process import RedisProcess


def cpu_seconds() -> float:
    seen: dict[int, float] = {}
    tree_cpu(os.getpid(), seen)
    return sum(seen.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=2, help="the source's partitions")
    parser.add_argument("--java-options", default="")
    args = parser.parse_args(argv)
    os.environ["SPARK_SUBMIT_OPTS"] = args.java_options
    with tempfile.TemporaryDirectory(prefix="tubeq-archive-phases-") as scratch:
        work = Path(scratch)
        (work / "redis").mkdir()
        server = RedisProcess(work / "redis")
        server.start()
        try:
            seed(server.url, "probe", args.events)
            from tubeq.pipeline import archive
            from tubeq.pipeline.session import spark_session

            phases: list[tuple[str, float, float]] = []
            at, cpu = time.monotonic(), cpu_seconds()

            def done(name: str) -> None:
                nonlocal at, cpu
                phases.append((name, time.monotonic() - at, cpu_seconds() - cpu))
                at, cpu = time.monotonic(), cpu_seconds()

            spark = spark_session("local[2]", app_name="tubeq-archive-phases",
                                  jvm_log=work / "jvm.log")
            done("session start")
            options = {"redis": server.url, "prefix": "probe",
                       "partitions": str(args.partitions), "onGap": "fail"}
            query = archive.start_archive(spark, options, str(work / "out"),
                                          str(work / "checkpoint"), once=True)
            done("query start (source, plan)")
            query.awaitTermination()
            done("query run (AvailableNow)")
            progress = query.recentProgress
            spark.stop()
        finally:
            server.stop()
        import pyarrow.dataset as ds

        held = ds.dataset(str(work / "out"), format="parquet").count_rows()
    print(f"CPU: {cpu_model()}; {args.events} events, {held} archived; partitions "
          f"{args.partitions}; JVM options {args.java_options or '(none)'}; load "
          f"{os.getloadavg()[0]:.1f}")
    for name, seconds, cpu_s in phases:
        print(f"    {name:28s} {seconds:6.2f} s {cpu_s:6.1f} CPU-s")
    for batch in progress:
        print(f"    batch {batch['batchId']}: {batch['numInputRows']} events, durationMs "
              f"{json.dumps(batch['durationMs'], sort_keys=True)}")
    return 0 if held == args.events // 4 * 4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
