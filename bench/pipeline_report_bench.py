"""Pipeline benchmark, report and writer side: two figures.

    .venv/bin/python -m bench.pipeline_report_bench [--events 10000000] [--rows 200000]

* **Report time on a generated archive**: ``--events`` lifecycle events (4 per job: 60 % put,
  reserved, touched, deleted; 20 % delayed put, promoted, reserved, deleted; 10 % put, reserved,
  timed-out, reserved; 10 % put, reserved, buried, kicked) over 50 tubes and 24 hours, written by
  Spark as Parquet partitioned by date and tube, like the archive. Then
  ``tubeq-pipeline --master local[2] report`` runs as its own process, and its wall time (Spark
  start, reading, every table, report.html) is the figure; the target is 30 s on this 2-core
  machine (issue 33). ``--reports N`` runs it N times on the same archive; each run's
  load average before it and the CPU seconds of its process tree (the driver, the JVM and the
  Python workers, sampled from /proc) are recorded too, since on a shared 2-core machine the
  wall time alone says more about the neighbours than about the code.
* **Write rate of df.write.format("tubeq")**: ``--rows`` rows of 100-byte bodies in 2 partitions
  into a fresh private tubeq (bench/harness/servers.py: its own redis-server, free loopback port),
  and the same into a fresh beanstalkd for reference; the clock covers the write only (the session
  is warm). Each write's jobs are counted on the server afterwards.

Appends a dated section to bench/RESULTS-pipeline.md (``--no-record`` prints it only). Rules:
loopback only; every server started here is stopped by its PID; the report subprocess is bounded
by a timeout and killed by its PID if it overruns.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness.paths import BENCH_DIR, REPO_ROOT
from bench.harness.servers import Beanstalkd, Tubeq

RESULTS = BENCH_DIR / "RESULTS-pipeline.md"
REPORT_TIMEOUT_S = 600
DAY_MS = 86_400_000


def spark_session(master: str = "local[2]") -> object:
    """The pipeline's own local session builder (loopback, this interpreter's workers)."""
    from tubeq.pipeline.session import spark_session as pipeline_session

    return pipeline_session(master, app_name="tubeq-bench-pipeline")


def generate_archive(spark: object, events: int, path: Path) -> float:
    """Write ``events`` events (4 per job) as the archive's Parquet; returns seconds taken."""
    from pyspark.sql import SparkSession

    from tubeq.pipeline.archive import write_archive

    assert isinstance(spark, SparkSession)
    jobs = events // 4
    started = time.monotonic()
    base = 1_795_900_000_000
    spacing = DAY_MS / jobs
    spark.range(1, jobs + 1).selectExpr(
        "id", "concat('tube-', cast(id % 50 AS STRING)) AS tube",
        f"{base} + cast(id * {spacing} AS BIGINT) AS t0", "id % 10 AS kind",
        "cast(rand(9) * 5000 AS BIGINT) AS wait", "cast(rand(10) * 20000 AS BIGINT) AS work",
        "cast(rand(11) * 300 AS BIGINT) AS late",
    ).createOrReplaceTempView("jobs")
    frame = spark.sql("""
        SELECT e.event, id, pos, tube, 100 AS pri, e.delay_ms, 60000 AS ttr_ms, e.due_ms,
               e.tries, e.time_ms, 'bench-1' AS by, '' AS reason
        FROM jobs LATERAL VIEW posexplode(
          CASE
            WHEN kind < 6 THEN array(
              named_struct('event', 'put', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 0L,
                           'time_ms', t0),
              named_struct('event', 'reserved', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 1L,
                           'time_ms', t0 + wait),
              named_struct('event', 'touched', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 1L,
                           'time_ms', t0 + wait + 100),
              named_struct('event', 'deleted', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 1L,
                           'time_ms', t0 + wait + 100 + work))
            WHEN kind < 8 THEN array(
              named_struct('event', 'put', 'delay_ms', 60000L, 'due_ms', t0 + 60000,
                           'tries', 0L, 'time_ms', t0),
              named_struct('event', 'promoted', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 0L,
                           'time_ms', t0 + 60000 + late),
              named_struct('event', 'reserved', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 1L,
                           'time_ms', t0 + 60000 + late + wait),
              named_struct('event', 'deleted', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 1L,
                           'time_ms', t0 + 60000 + late + wait + work))
            WHEN kind = 8 THEN array(
              named_struct('event', 'put', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 0L,
                           'time_ms', t0),
              named_struct('event', 'reserved', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 1L,
                           'time_ms', t0 + wait),
              named_struct('event', 'timed-out', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 1L,
                           'time_ms', t0 + wait + 60000),
              named_struct('event', 'reserved', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 2L,
                           'time_ms', t0 + wait + 60000 + wait))
            ELSE array(
              named_struct('event', 'put', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 0L,
                           'time_ms', t0),
              named_struct('event', 'reserved', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 1L,
                           'time_ms', t0 + wait),
              named_struct('event', 'buried', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 1L,
                           'time_ms', t0 + wait + work),
              named_struct('event', 'kicked', 'delay_ms', 0L, 'due_ms', 0L, 'tries', 1L,
                           'time_ms', t0 + wait + work + 600000))
          END) x AS pos, e
    """).selectExpr(
        # A unique, ordered stream id per event: its time, and a sequence from the job id.
        "concat(cast(time_ms AS STRING), '-', cast(id * 4 + pos AS STRING)) AS stream_id",
        "event", "id", "tube", "pri", "delay_ms", "ttr_ms", "due_ms", "tries", "time_ms", "by",
        "reason",
    )
    write_archive(frame, str(path))
    return time.monotonic() - started


CPU_SAMPLE_S = 0.25


def tree_cpu(root: int, seen: dict[int, float]) -> None:
    """Record in ``seen`` the CPU seconds so far of ``root`` and each of its descendants (Linux
    /proc; nothing elsewhere). The JVM is not reaped by the report's process, so its CPU never
    reaches that process's rusage: it has to be read while it runs."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, ... utime and stime (stat fields 14 and 15).
        parents[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grown = {root}, True
    while grown:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grown = bool(more)
    for pid in tree & cpu.keys():
        seen[pid] = max(seen.get(pid, 0.0), cpu[pid])


# The installed command, run as a user runs it (its JVM's output goes to a log file).
TUBEQ_PIPELINE = Path(sys.executable).with_name("tubeq-pipeline")


def run_report(archive: Path, out: Path, code_dir: Path | None = None) -> tuple[float, float]:
    """Wall seconds of ``tubeq-pipeline --master local[2] report`` in its own process, and the
    CPU seconds of its process tree (the driver, the JVM, the Python workers); with
    ``code_dir``, the ``tubeq`` package under it runs (another revision's)."""
    return run_command([str(TUBEQ_PIPELINE), "--master", "local[2]", "report", "--archive",
                        str(archive), "--out", str(out)], code_dir)


def run_command(command: list[str], code_dir: Path | None = None) -> tuple[float, float]:
    """Wall seconds of ``command`` in its own process, and the CPU seconds of its process tree,
    sampled every ``CPU_SAMPLE_S`` (a process's last fraction of a sample is missed). With
    ``code_dir`` the process and Spark's Python workers import ``tubeq`` from there: it is their
    PYTHONPATH and their working directory (a worker runs ``python -m``, whose working directory
    comes first on its path)."""
    seen: dict[int, float] = {}
    env = None if code_dir is None else {**os.environ, "PYTHONPATH": str(code_dir)}
    with tempfile.TemporaryFile() as log:
        started = time.monotonic()
        proc = subprocess.Popen(command, cwd=code_dir or REPO_ROOT, stdout=log,
                                stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None:
                if time.monotonic() - started > REPORT_TIMEOUT_S:
                    raise subprocess.TimeoutExpired(command, REPORT_TIMEOUT_S)
                tree_cpu(proc.pid, seen)
                time.sleep(CPU_SAMPLE_S)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        elapsed = time.monotonic() - started
        if proc.returncode != 0:
            log.seek(0)
            output = log.read().decode(errors="replace")
            raise RuntimeError(f"{' '.join(command[:4])} failed ({proc.returncode}):\n"
                               f"{output[-3000:]}")
    return elapsed, sum(seen.values())


def current_jobs(host: str, port: int, tube: str) -> int:
    import greenstalk

    with greenstalk.Client((host, port)) as client:
        return int(client.stats_tube(tube)["total-jobs"])


def write_rate(spark: object, rows: int, log_dir: Path) -> list[tuple[str, float, int, str]]:
    from pyspark.sql import SparkSession

    from tubeq.pipeline.schedule import schedule

    assert isinstance(spark, SparkSession)
    frame = spark.range(rows).selectExpr(
        "concat('order-', cast(id AS STRING), repeat('x', 100 - 6 - length(cast(id AS STRING))))"
        " AS body").repartition(2).cache()
    frame.count()
    out = []
    # Warm-up: the first Python data source write of a session starts its Python workers
    # (seconds); that is not the write rate.
    warm = Beanstalkd(log_dir / "warm-up")
    warm.start()
    try:
        schedule(frame.limit(1000), f"127.0.0.1:{warm.port}", tube="warm-up")
    finally:
        warm.stop()
    for name, server in (("tubeq", Tubeq(log_dir)), ("beanstalkd", Beanstalkd(log_dir))):
        server.start()
        try:
            tube = f"bench-write-{name}"
            started = time.monotonic()
            result = schedule(frame, f"127.0.0.1:{server.port}", tube=tube)
            elapsed = time.monotonic() - started
            held = current_jobs("127.0.0.1", server.port, tube)
            out.append((name, elapsed, held, result.counts.summary()))
        finally:
            server.stop()
    frame.unpersist()
    return out


def cpu_model() -> str:
    try:
        done = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    for line in done.stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--reports", type=int, default=1,
                        help="run the report this many times on the one archive")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tubeq-pipeline-bench-"))
    try:
        spark = spark_session()
        generated = generate_archive(spark, args.events, work / "archive")
        writes = write_rate(spark, args.rows, work / "logs")
        spark.stop()  # type: ignore[attr-defined]
        size = sum(p.stat().st_size for p in (work / "archive").rglob("*.parquet"))
        reports = []
        for _ in range(args.reports):
            load_before = os.getloadavg()[0]
            reports.append((load_before, *run_report(work / "archive", work / "out")))
        load = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## Report and writer ({when})",
        "",
        f"`python -m bench.pipeline_report_bench --events {args.events} --rows {args.rows}"
        f"{f' --reports {args.reports}' if args.reports != 1 else ''}`; "
        f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average after the run "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| archive generated (Spark, Parquet by date and tube) | {args.events:,} events, "
        f"{size / 2**20:.0f} MiB, {generated:.1f} s |",
    ]
    for load_before, report_s, cpu_s in reports:
        lines.append(f"| report, wall, own process with Spark start (`local[2]`, exact "
                     f"percentiles) | **{report_s:.1f} s** (target <= 30 s; {cpu_s:.0f} CPU-s; "
                     f"load {load_before:.1f} before it) |")
    for name, elapsed, held, summary in writes:
        lines.append(f'| df.write.format("tubeq") into a fresh {name}, {args.rows:,} rows of '
                     f"100 B, 2 tasks | **{args.rows / elapsed:,.0f} jobs/s** ({elapsed:.1f} s; "
                     f"{held:,} jobs on the server; {summary}) |")
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_record:
        header = "" if RESULTS.exists() else "# Pipeline benchmark results\n\n"
        with RESULTS.open("a", encoding="utf-8") as out:
            out.write(("\n" if RESULTS.exists() else header) + section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
