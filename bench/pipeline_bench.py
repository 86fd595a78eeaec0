"""``make bench``'s pipeline section: archive rate, report time, write rate.

    .venv/bin/python -m bench.pipeline_bench [--quick] [--output PATH]

``make bench`` runs it after ``bench.run`` (which measures events on/off throughput: not here);
``make bench-pipeline`` runs it alone. Three figures, each with the CPU model beside it:

* **Archive rate**: ``--archive-events`` events in the ``tubeq.model.events`` schema, 4 per job,
  written to a private Redis stream with pipelined XADD (the entries the Lua scripts write), then
  ``tubeq-pipeline archive --once`` (``archive.run_archive``) on a warm ``local[2]`` session;
  events per second over the run (planning, reading Redis, Parquet by date and tube, commit).
  The archive is read back and counted, so a figure is never of a run that lost events.
* **Report time** on a ``--report-events`` archive (10M by default; target 30 s) and **write
  rate** of ``df.write.format("tubeq")`` into a fresh tubeq (and beanstalkd for reference):
  measured by :mod:`bench.pipeline_report_bench`, whose archive generator, report run (its own
  process, wall including Spark start) and write timing are called here, not copied.
* **The fixed cost** (issue 33: the pipeline costs what its data costs): ``tubeq-pipeline
  report`` of a 1,000-event archive (the generator's) and ``tubeq-pipeline archive --once`` of
  1,000 events in a private Redis stream, each the installed command in its own process on
  ``local[2]``, wall including Spark's start (target 10 s each), ``SMALL_RUNS`` times, one after
  the other in turn; the median, the range and the CPU seconds of the process tree. Each
  archive run's folder is read back (pyarrow) and must hold every event. The commands use a
  cache directory of the bench's own: a first report before them writes Spark's class archive
  (tubeq.pipeline.class_archive), as the first run after an install does, and is shown apart;
  the measured runs map it, as every later run of a user's does.

The full run appends a dated section to ``bench/RESULTS-pipeline.md`` (the hand-written sections
above it stay); ``--quick`` (small sizes, a few minutes) writes ``bench/out/RESULTS-pipeline.md``
instead, so a development run never lands in the results. Rules: loopback only; the Redis and the
servers started here are stopped by their PIDs; nothing else is touched.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench import pipeline_report_bench as report_bench
from bench.harness.paths import OUT_DIR, REPO_ROOT
from bench.harness.servers import snapshot_revision, snapshot_tubeq
from tubeq.model.events import FIELDS, LATER_DEFAULTS
from tubeq.redisio.process import RedisProcess
from tubeq.store.keys import Keys

RESULTS = report_bench.RESULTS
QUICK_RESULTS = OUT_DIR / "RESULTS-pipeline.md"
XADD_BATCH = 10_000
WARM_UP_EVENTS = 2_000
TUBES = 50
# The fixed cost's rows: this many events, each command run this many times, and the targets.
SMALL_EVENTS = 1_000
SMALL_RUNS = 3
SMALL_TARGET_S = 10.0
REPORT_TARGET_S = 30.0


@dataclass(frozen=True)
class Sizes:
    archive_events: int
    report_events: int
    write_rows: int


FULL = Sizes(archive_events=1_000_000, report_events=10_000_000, write_rows=200_000)
QUICK = Sizes(archive_events=40_000, report_events=200_000, write_rows=20_000)


def lifecycle(jobs: int, base_ms: int) -> Iterator[dict[str, Any]]:
    """4 events per job (put, reserved, touched or released, deleted), fields in FIELDS order."""
    for job in range(1, jobs + 1):
        tube = f"tube-{job % TUBES}"
        t0 = base_ms + job * 7
        steps = (("put", 0, 0), ("reserved", 1, 40),
                 ("released" if job % 10 == 0 else "touched", 1, 90), ("deleted", 1, 300))
        for event, tries, offset in steps:
            values = {"event": event, "id": job, "tube": tube, "pri": 1024, "delay_ms": 0,
                      "ttr_ms": 60_000, "due_ms": 0, "tries": tries, "time_ms": t0 + offset,
                      "by": "bench-1", "reason": "", **LATER_DEFAULTS}
            yield {name: values[name] for name in FIELDS}


def seed(url: str, prefix: str, events: int) -> float:
    """XADD ``events`` events (pipelined, batches of XADD_BATCH) to ``prefix``'s stream; seconds."""
    key = Keys(prefix).events
    client = redis.Redis.from_url(url)
    started = time.monotonic()
    try:
        pipe = client.pipeline(transaction=False)
        pending = 0
        for entry in lifecycle(events // 4, base_ms=1_795_900_000_000):
            pipe.xadd(key, entry)
            pending += 1
            if pending == XADD_BATCH:
                pipe.execute()
                pending = 0
        if pending:
            pipe.execute()
        held = int(client.xlen(key))
    finally:
        client.close()
    if held != events // 4 * 4:
        raise RuntimeError(f"seeded {held} events, expected {events // 4 * 4}")
    return time.monotonic() - started


def archive_once(spark: Any, url: str, prefix: str, work: Path) -> tuple[float, str]:
    """``tubeq-pipeline archive --once`` through the dispatcher; (seconds, its summary line)."""
    from tubeq.pipeline import cli

    argv = ["archive", "--redis", url, "--prefix", prefix, "--out", str(work / "archive"),
            "--checkpoint", str(work / "checkpoint"), "--once"]
    printed = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(printed):
        status = cli.main(argv, spark=spark)
    elapsed = time.monotonic() - started
    summary = next((line for line in printed.getvalue().splitlines()
                    if line.startswith("archive: ")), "")
    if status != 0:
        raise RuntimeError(f"archive failed ({status}): {printed.getvalue()[-2000:]}")
    return elapsed, summary


def archive_rate(spark: Any, events: int, work: Path) -> dict[str, Any]:
    """Seed a private Redis, archive a small stream (warm-up), then time the big one."""
    redis_dir = work / "redis"
    redis_dir.mkdir(parents=True)
    server = RedisProcess(redis_dir)
    server.start()
    try:
        warm = f"warm-{secrets.token_hex(3)}"
        seed(server.url, warm, WARM_UP_EVENTS)
        archive_once(spark, server.url, warm, work / "warm")
        prefix = f"bench-{secrets.token_hex(3)}"
        seeded_s = seed(server.url, prefix, events)
        elapsed, summary = archive_once(spark, server.url, prefix, work / "big")
    finally:
        server.stop()
    archived = spark.read.parquet(str(work / "big" / "archive")).count()
    if archived != events // 4 * 4:
        raise RuntimeError(f"archived {archived} events of {events // 4 * 4}: {summary}")
    return {"events": archived, "seed_s": seeded_s, "archive_s": elapsed, "summary": summary}


Runs = list[tuple[float, float]]  # (wall seconds, CPU seconds of the process tree) per run


def small_archive(url: str, work: Path, code_dir: Path | None = None) -> tuple[float, float]:
    """``tubeq-pipeline archive --once`` of ``SMALL_EVENTS`` fresh events, in its own process
    (the ``tubeq`` under ``code_dir`` if given); the folder it wrote must hold each of them."""
    import pyarrow.dataset as ds

    prefix = f"small-{secrets.token_hex(3)}"
    seed(url, prefix, SMALL_EVENTS)
    figures = report_bench.run_command(
        [str(report_bench.TUBEQ_PIPELINE), "--master", "local[2]", "archive", "--redis", url,
         "--prefix", prefix, "--out", str(work / "archive"), "--checkpoint",
         str(work / "checkpoint"), "--once"], code_dir)
    held = ds.dataset(str(work / "archive"), format="parquet").count_rows()
    if held != SMALL_EVENTS:
        raise RuntimeError(f"archive --once wrote {held} events of {SMALL_EVENTS}")
    return figures


@contextlib.contextmanager
def private_cache(folder: Path) -> Iterator[None]:
    """The commands started inside use ``folder`` as their cache directory (XDG_CACHE_HOME):
    Spark's class archive (tubeq.pipeline.class_archive) is made by the first run of the bench,
    whatever the user's cache holds."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved


def fixed_cost(archive: Path, work: Path) -> tuple[Runs, Runs, Runs]:
    """The small report's and the small archive's runs, taken in turn, after a first report
    and a first archive (returned first) that write Spark's class archives (one a command),
    as the first runs after an install do; the runs after them map the archives."""
    server = RedisProcess(work / "redis")
    (work / "redis").mkdir(parents=True)
    server.start()
    reports: Runs = []
    archives: Runs = []
    try:
        with private_cache(work / "cache"):
            first = [report_bench.run_report(archive, work / "report-first"),
                     small_archive(server.url, work / "archive-first")]
            for run in range(SMALL_RUNS):
                reports.append(report_bench.run_report(archive, work / f"report-{run}"))
                archives.append(small_archive(server.url, work / f"archive-{run}"))
    finally:
        server.stop()
    return first, reports, archives


def _runs(runs: Runs, target_s: float, quick: bool) -> str:
    walls = sorted(wall for wall, _ in runs)
    cpus = sorted(cpu for _, cpu in runs)
    median = walls[len(walls) // 2]
    verdict = "" if quick else (
        f"; target <= {target_s:.0f} s: {'met' if median <= target_s else 'missed'}")
    return (f"**{median:.1f} s** median of {len(runs)} ({walls[0]:.1f}-{walls[-1]:.1f} s"
            f"{verdict}); {cpus[len(cpus) // 2]:.0f} CPU-s of its process tree")


def java_version() -> str:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = (done.stderr or done.stdout).splitlines()
    return lines[0].strip() if lines else "unknown"


def commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "tubeq", "bench"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=10,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() + (" + uncommitted changes" if dirty else "")


def render(sizes: Sizes, quick: bool, archive: dict[str, Any], report: tuple[float, float],
           generated: tuple[int, float, float],
           writes: list[tuple[str, float, int, str]], small: tuple[Runs, Runs, Runs]) -> str:
    import pyspark

    report_s, report_cpu_s = report
    cpu = report_bench.cpu_model()
    load = os.getloadavg()
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    events, size_bytes, generated_s = generated
    # "archive: N events in B batches, S s, to DIR": the temp dir says nothing once it is gone.
    run_summary = archive["summary"].removeprefix("archive: ").split(", to ")[0]
    mode = ", --quick: sizes too small to judge by" if quick else ""
    lines = [
        f"## make bench: pipeline section ({when}{mode})",
        "",
        f"`python -m bench.pipeline_bench{' --quick' if quick else ''}` on {commit()}; "
        f"{os.cpu_count()} cores, {java_version()}, PySpark {pyspark.__version__}, Python "
        f"{platform.python_version()}, `local[2]`; load average after the run "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.",
        "",
        "| figure | value | CPU |",
        "| --- | --- | --- |",
        f"| archive rate: `tubeq-pipeline archive --once`, {archive['events']:,} events in a "
        f"private Redis stream (seeded by pipelined XADD in {archive['seed_s']:.1f} s), warm "
        f"session | **{archive['events'] / archive['archive_s']:,.0f} events/s** "
        f"({archive['archive_s']:.1f} s; {run_summary}) "
        f"| {cpu} |",
        f"| report, wall, own process with Spark start, on a generated archive of {events:,} "
        f"events ({size_bytes / 2**20:.0f} MiB, generated in {generated_s:.1f} s) | "
        f"**{report_s:.1f} s**" + ("" if quick else
                                   f" (target <= {REPORT_TARGET_S:.0f} s: "
                                   f"{'met' if report_s <= REPORT_TARGET_S else 'missed'})")
        + f"; {report_cpu_s:.0f} CPU-s of its process tree"
        + f" | {cpu} |",
        f"| the first report and the first archive --once after an install: each writes its "
        f"command's Spark class archive at its end (once per Java and Spark), not counted "
        f"below | {small[0][0][0]:.1f} s ({small[0][0][1]:.0f} CPU-s) and "
        f"{small[0][1][0]:.1f} s ({small[0][1][1]:.0f} CPU-s) | {cpu} |",
        f"| report of a {SMALL_EVENTS:,}-event archive (the same generator): `tubeq-pipeline "
        f"report`, wall, own process with Spark start | {_runs(small[1], SMALL_TARGET_S, quick)}"
        f" | {cpu} |",
        f"| archive of {SMALL_EVENTS:,} events in a private Redis stream: `tubeq-pipeline "
        f"archive --once`, wall, own process with Spark start | "
        f"{_runs(small[2], SMALL_TARGET_S, quick)} | {cpu} |",
    ]
    for name, elapsed, held, summary in writes:
        lines.append(f'| df.write.format("tubeq") into a fresh {name}, {sizes.write_rows:,} '
                     f"rows of 100 B, 2 tasks | **{sizes.write_rows / elapsed:,.0f} jobs/s** "
                     f"({elapsed:.1f} s; {held:,} jobs on the server; {summary}) | {cpu} |")
    lines += ["", "Events on/off throughput: bench/RESULTS.md (`bench.run`)."]
    return "\n".join(lines) + "\n"


def run(sizes: Sizes, quick: bool, output: Path) -> str:
    from tubeq.pipeline.session import spark_session

    work = Path(tempfile.mkdtemp(prefix="tubeq-pipeline-bench-"))
    try:
        spark = spark_session("local[2]", app_name="tubeq-bench-pipeline")
        print(f"archive rate: {sizes.archive_events:,} events", flush=True)
        archive = archive_rate(spark, sizes.archive_events, work / "archive-rate")
        print(f"write rate: {sizes.write_rows:,} rows", flush=True)
        writes = report_bench.write_rate(spark, sizes.write_rows, work / "logs")
        print(f"report: generating {sizes.report_events:,} events", flush=True)
        generated_s = report_bench.generate_archive(spark, sizes.report_events,
                                                    work / "report-archive")
        report_bench.generate_archive(spark, SMALL_EVENTS, work / "small-archive")
        spark.stop()
        size = sum(p.stat().st_size for p in (work / "report-archive").rglob("*.parquet"))
        print(f"fixed cost: report and archive --once of {SMALL_EVENTS:,} events, "
              f"{SMALL_RUNS} times each", flush=True)
        small = fixed_cost(work / "small-archive", work / "small")
        print("report: running", flush=True)
        with private_cache(work / "small" / "cache"):  # the class archive the first run made
            report = report_bench.run_report(work / "report-archive", work / "report-out")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    section = render(sizes, quick, archive, report, (sizes.report_events, size, generated_s),
                     writes, small)
    output.parent.mkdir(parents=True, exist_ok=True)
    existed = output.exists()
    with output.open("a", encoding="utf-8") as out:
        out.write(("\n" if existed else "# Pipeline benchmark results\n\n") + section)
    return section


Timed = tuple[float, float, float]  # (load average before, wall seconds, CPU seconds)


def _timed(run: Callable[..., tuple[float, float]], *args: Any) -> Timed:
    load = os.getloadavg()[0]
    return (load, *run(*args))


def ab_run(base: str, reps: int, quick: bool, output: Path) -> str:
    """``--base REV``: the three rows of issue 33 (report of ``SMALL_EVENTS`` events, archive
    --once of ``SMALL_EVENTS`` events, report of ``report_events``) for the ``tubeq`` of
    ``base`` and of this working tree, each in its own process on snapshots of the code
    (bench.harness.servers), interleaved: every repetition runs each row for both sides, the
    side that goes first alternating. Appends a section to ``output``."""
    sizes = QUICK if quick else FULL
    base = subprocess.run(["git", "rev-parse", "--short", base], cwd=REPO_ROOT, check=True,
                          capture_output=True, text=True, timeout=10).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="tubeq-pipeline-ab-"))
    sides = {"base": snapshot_revision(base, work / "base"),
             "this": snapshot_tubeq(work / "this")}
    rows = ("first small report", "first small archive", "small report", "small archive",
            "report")
    timed: dict[tuple[str, str], list[Timed]] = {(row, side): [] for row in rows for side in sides}
    try:
        spark = report_bench.spark_session()
        print(f"generating {sizes.report_events:,} and {SMALL_EVENTS:,} events", flush=True)
        report_bench.generate_archive(spark, sizes.report_events, work / "big-archive")
        report_bench.generate_archive(spark, SMALL_EVENTS, work / "small-archive")
        spark.stop()  # type: ignore[attr-defined]
        server = RedisProcess(work / "redis")
        (work / "redis").mkdir()
        server.start()
        try:
            with private_cache(work / "cache"):
                # The first run after an install writes Spark's class archive (a side whose
                # tubeq has none runs as always): shown apart, not in the repetitions.
                for side, code in sides.items():
                    print(f"first run: {side}", flush=True)
                    timed["first small report", side].append(_timed(
                        report_bench.run_report, work / "small-archive",
                        work / f"{side}-first", code))
                    timed["first small archive", side].append(_timed(
                        small_archive, server.url, work / f"{side}-first-archive", code))
                    shutil.rmtree(work / f"{side}-first", ignore_errors=True)
                    shutil.rmtree(work / f"{side}-first-archive", ignore_errors=True)
                _repetitions(reps, sides, work, server.url, timed)
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _render_ab(base, reps, sizes, quick, timed, output)


def _repetitions(reps: int, sides: dict[str, Path], work: Path, redis_url: str,
                 timed: dict[tuple[str, str], list[Timed]]) -> None:
    """Every repetition runs each row for both sides, the side that goes first alternating."""
    for rep in range(reps):
        order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
        for side in order:
            code, out = sides[side], work / f"{side}-{rep}"
            print(f"rep {rep}: {side}", flush=True)
            timed["small report", side].append(_timed(
                report_bench.run_report, work / "small-archive", out / "small-report", code))
            timed["small archive", side].append(_timed(
                small_archive, redis_url, out / "archive", code))
            timed["report", side].append(_timed(
                report_bench.run_report, work / "big-archive", out / "report", code))
            shutil.rmtree(out, ignore_errors=True)


def _render_ab(base: str, reps: int, sizes: Sizes, quick: bool,
               timed: dict[tuple[str, str], list[Timed]], output: Path) -> str:
    names = {"first small report": (f"the first report of a {SMALL_EVENTS:,}-event archive "
                                    "(writes Spark's class archive, once)", SMALL_TARGET_S),
             "first small archive": (f"the first archive --once of {SMALL_EVENTS:,} events "
                                     "(writes Spark's class archive, once)", SMALL_TARGET_S),
             "small report": (f"report of a {SMALL_EVENTS:,}-event archive", SMALL_TARGET_S),
             "small archive": (f"archive --once of {SMALL_EVENTS:,} events", SMALL_TARGET_S),
             "report": (f"report of a {sizes.report_events:,}-event archive", REPORT_TARGET_S)}
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()
    lines = [f"## make bench: pipeline A/B, {base} against {commit()} ({when}"
             f"{', --quick' if quick else ''})", "",
             f"`python -m bench.pipeline_bench --base {base} --reps {reps}"
             f"{' --quick' if quick else ''}`; CPU {report_bench.cpu_model()}, "
             f"{os.cpu_count()} cores, {java_version()}; each figure its own process on "
             "`local[2]`, wall with Spark's start, CPU-s of the process tree, the 1-min load "
             f"average before it; load average after the run {load[0]:.2f} / {load[1]:.2f} / "
             f"{load[2]:.2f}.", "",
             "| figure (target) | side | runs: wall s (CPU-s, load before) | median wall |",
             "| --- | --- | --- | --- |"]
    for row, (name, target) in names.items():
        for side in ("base", "this"):
            runs = timed[row, side]
            median = sorted(wall for _, wall, _ in runs)[len(runs) // 2]
            cells = ", ".join(f"{wall:.1f} ({cpu:.0f}, {load_before:.1f})"
                              for load_before, wall, cpu in runs)
            label = base if side == "base" else "this tree"
            lines.append(f"| {name} (<= {target:.0f} s) | {label} | {cells} | **{median:.1f} s** |")
    section = "\n".join(lines) + "\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("a", encoding="utf-8") as out:
        out.write("\n" + section)
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline_bench",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true",
                        help=f"small sizes ({QUICK.archive_events:,} events archived, "
                             f"{QUICK.report_events:,} reported, {QUICK.write_rows:,} rows "
                             f"written); results to {QUICK_RESULTS.relative_to(REPO_ROOT)}")
    parser.add_argument("--output", type=Path, default=None,
                        help="where the section is appended (default: bench/RESULTS-pipeline.md,"
                             " or bench/out/ with --quick)")
    parser.add_argument("--base", metavar="REV", default=None,
                        help="instead of the section: the fixed cost's rows and the report's, "
                             "tubeq of REV against this tree's, interleaved (an A/B)")
    parser.add_argument("--reps", type=int, default=3, help="--base's repetitions (3)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    output = args.output or (QUICK_RESULTS if args.quick else RESULTS)
    if args.base is not None:
        print(ab_run(args.base, args.reps, args.quick, output), end="")
    else:
        print(run(sizes, args.quick, output), end="")
    print(f"appended to {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
