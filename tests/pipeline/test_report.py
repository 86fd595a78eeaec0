"""The report against a workload whose every figure the test knows from its own record.

The events come from ``tests.pipeline.workload`` (a seeded simulation that records what it did);
every expected figure is computed here in plain Python from that record, never from the events.
Then report.html is opened in a real headless chromium: its charts must be drawn and its tables
filled.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import subprocess
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from tests.pipeline import workload
from tubeq.model.events import FIELDS, LATER_FIELDS, SPARK_DDL
from tubeq.pipeline import cli, report
from tubeq.pipeline.archive import write_archive

MINUTE = 60_000
HOUR = 3_600_000
ALL = "*"
COUNTED = {"put": "put", "promoted": "promoted", "reserved": "reserved",
           "released": "released", "touched": "touched", "kicked": "kicked",
           "deleted": "deleted", "failed": "failed"}
# A time-out is counted by its reason: a TTR running out, or a job given back because its
# connection closed or its process died. A bury is counted whole and by its reason too, and a
# delete by finish both as a delete and as a finish.
TIMED_OUT = {"": "timed_out", "disconnect": "disconnected", "reaped": "reaped"}
BURIED = {"": "buried_deliberate", "max-tries": "buried_max_tries", "expired": "buried_expired"}
COLUMNS = (*COUNTED.values(), *TIMED_OUT.values(), "buried", *BURIED.values(), "finished",
           "result_bytes")


def columns_of(event: str, reason: str) -> tuple[str, ...]:
    """The count columns one recorded step adds to."""
    if event == "timed-out":
        return (TIMED_OUT[reason],)
    if event == "buried":
        return ("buried", BURIED[reason])
    if event == "deleted" and reason == "finished":
        return ("deleted", "finished")
    return (COUNTED[event],)
STATES = ("ready", "delayed", "reserved", "buried")


@pytest.fixture(scope="module")
def record() -> workload.Record:
    return workload.simulate()


@pytest.fixture(scope="module")
def archive(spark: SparkSession, record: workload.Record,
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workload's events as an archive: Parquet partitioned by date (UTC) and tube."""
    path = tmp_path_factory.mktemp("archive")
    frame = spark.createDataFrame(workload.events(record), SPARK_DDL)
    write_archive(frame, str(path))
    return path


@pytest.fixture(scope="module")
def report_dir(spark: SparkSession, archive: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    report.write_report(report.build_report(report.read_archive(spark, archive)), out)
    return out


# ---------------------------------------------------------------------------------------------
# Expected figures, from the record alone.
# ---------------------------------------------------------------------------------------------


def percentile(values: Sequence[int], fraction: float) -> float | None:
    """Linear interpolation between the two nearest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def bucket_of(time_ms: int, size: int | None) -> tuple[int, ...]:
    return () if size is None else (time_ms // size * size,)


def expected_metrics(record: workload.Record, size: int | None) -> dict[tuple[Any, ...], dict]:
    counts: dict[tuple[Any, ...], Counter[str]] = defaultdict(Counter)
    for job in record.jobs:
        for event, at, _, _, _, reason, result_bytes, _, _ in job.steps:
            for column in columns_of(event, reason):
                for tube in (job.tube, ALL):
                    counts[(tube, *bucket_of(at, size))][column] += 1
            if event == "deleted" and reason == "finished":
                for tube in (job.tube, ALL):
                    counts[(tube, *bucket_of(at, size))]["result_bytes"] += result_bytes
    samples: dict[tuple[Any, ...], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for name, measures in (("wait_ms", record.waits), ("processing_ms", record.processing),
                           ("lateness_ms", record.lateness)):
        for measure in measures:
            for tube in (measure.tube, ALL):
                samples[(tube, *bucket_of(measure.time_ms, size))][name].append(measure.value)
    out: dict[tuple[Any, ...], dict] = {}
    for key, counter in counts.items():
        row: dict[str, Any] = {column: counter[column] for column in COLUMNS}
        for name in ("wait_ms", "processing_ms", "lateness_ms"):
            values = samples[key][name]
            row[f"{name}_n"] = len(values)
            for fraction, suffix in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
                row[f"{name}_{suffix}"] = percentile(values, fraction)
        out[key] = row
    assert set(samples) <= set(out)
    return out


def expected_backlog(record: workload.Record) -> dict[tuple[str, int], dict[str, int]]:
    times = [at for job in record.jobs for _, at, *_ in job.steps]
    first, last = min(times) // MINUTE, max(times) // MINUTE
    tubes = {job.tube for job in record.jobs} | {ALL}
    out: dict[tuple[str, int], dict[str, int]] = {}
    for minute in range(first, last + 1):
        end = (minute + 1) * MINUTE  # the state after every event before this instant
        per_tube: dict[str, Counter[str]] = {tube: Counter() for tube in tubes}
        for job in record.jobs:
            for state, since, until in job.states:
                if since < end and (until is None or until >= end):
                    per_tube[job.tube][state] += 1
                    per_tube[ALL][state] += 1
        for tube, counter in per_tube.items():
            row = {state: counter[state] for state in STATES}
            row["total"] = sum(row.values())
            out[(tube, minute * MINUTE)] = row
    return out


def older_events(spark: SparkSession, rows: Sequence[tuple[Any, ...]]) -> DataFrame:
    """Rows of the schema before ``LATER_FIELDS`` (``stream_id`` and the first fields) as an
    archive written then reads back: the later fields null."""
    width = 1 + len(FIELDS) - len(LATER_FIELDS)
    assert all(len(row) == width for row in rows)
    return spark.createDataFrame([(*row, *[None] * len(LATER_FIELDS)) for row in rows],
                                 SPARK_DDL)


def rows_of(out: Path, name: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(out / name).to_pylist()


def assert_rows_equal(actual: dict[tuple[Any, ...], dict], expected: dict[tuple[Any, ...], dict],
                      table: str) -> None:
    assert set(actual) == set(expected), (
        f"{table}: keys only in the report {sorted(set(actual) - set(expected))[:5]}, "
        f"only expected {sorted(set(expected) - set(actual))[:5]}")
    for key, want in expected.items():
        got = actual[key]
        for column, value in want.items():
            if isinstance(value, float):
                assert got[column] == pytest.approx(value, abs=1e-6), (table, key, column)
            else:
                assert got[column] == value, (table, key, column, got[column], value)


# ---------------------------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------------------------


def test_workload_covers_every_transition(record: workload.Record) -> None:
    events = Counter(step[0] for job in record.jobs for step in job.steps)
    assert set(events) == {*COUNTED, "timed-out", "buried"}
    # Finishes (of results of several sizes), and fails before a release and before a bury.
    sizes = {step[6] for job in record.jobs for step in job.steps
             if step[0] == "deleted" and step[5] == "finished"}
    assert len(sizes) > 5 and sum(sizes) > 0
    after_fail = Counter((step[0], step[5]) for job in record.jobs
                         for before, step in itertools.pairwise(job.steps)
                         if before[0] == "failed")
    assert set(after_fail) == {("released", "failed"), ("buried", "max-tries")}, after_fail
    assert max(step[8] for job in record.jobs for step in job.steps) >= 2  # failures counted
    for event, reasons_expected in (("timed-out", TIMED_OUT), ("buried", BURIED)):
        reasons = Counter(step[5] for job in record.jobs for step in job.steps
                          if step[0] == event)
        assert set(reasons) == set(reasons_expected), reasons
        assert all(reasons[reason] > 0 for reason in reasons_expected), reasons
    final = Counter(job.states[-1][0] if job.states[-1][2] is None else "gone"
                    for job in record.jobs)
    assert all(final[state] > 0 for state in (*STATES, "gone")), final
    assert len(record.waits) > 300
    assert min(m.value for m in record.waits) == 0


def test_report_writes_every_table(report_dir: Path) -> None:
    for name in report.TABLES:
        assert list((report_dir / name).glob("*.parquet")), name
    assert (report_dir / "report.html").is_file()


def test_the_per_job_windows_cache_is_plain_and_the_sessions_setting_kept(
        spark: SparkSession, archive: Path) -> None:
    """The report caches its per-job window uncompressed (cheaper to build than Spark's
    default, bench/RESULTS-pipeline.md) and gives the session its own setting back after,
    also when the block fails."""
    key = "spark.sql.inMemoryColumnarStorage.compressed"
    spark.conf.set(key, "true")
    with report.plain_cache(spark):
        assert spark.conf.get(key) == "false"
    assert spark.conf.get(key) == "true"
    with pytest.raises(RuntimeError), report.plain_cache(spark):
        raise RuntimeError("a failed action")
    assert spark.conf.get(key) == "true"
    report.aggregate(report.read_archive(spark, archive))
    assert spark.conf.get(key) == "true"


class _RefusingConf:
    """A session's conf that refuses the cache's setting, as a managed Spark Connect server
    may (CONFIG_NOT_AVAILABLE); every other key passes through."""

    def __init__(self, conf: Any) -> None:
        self._conf = conf

    def get(self, key: str, *default: Any) -> Any:
        return self._conf.get(key, *default)

    def set(self, key: str, value: str) -> None:
        if key == "spark.sql.inMemoryColumnarStorage.compressed":
            raise RuntimeError(f"[CONFIG_NOT_AVAILABLE] Configuration {key} is not available.")
        self._conf.set(key, value)

    def unset(self, key: str) -> None:
        self._conf.unset(key)


def test_a_session_that_refuses_the_caches_setting_still_reports(spark: SparkSession) -> None:
    """plain_cache on a session that refuses the setting keeps the session's own and runs the
    block (a review found the report failing there where it ran before)."""
    class Refusing:
        conf = _RefusingConf(spark.conf)

    ran = False
    with report.plain_cache(Refusing()):  # type: ignore[arg-type]
        ran = True
    assert ran


def test_percentiles_on_sparks_python_workers_are_the_drivers(
        spark: SparkSession, archive: Path, report_dir: Path) -> None:
    """Past ``--driver-samples`` Spark's Python workers compute the percentiles (hour by hour,
    and from each tube's histogram): every table is the same, to the last digit."""
    tables = report.build_report(report.read_archive(spark, archive), driver_samples=0)
    for name in report.TABLES:
        assert tables[name].to_pylist() == rows_of(report_dir, name), name


def test_tables_written_by_spark_are_those_written_here(spark: SparkSession, report_dir: Path,
                                                       tmp_path: Path) -> None:
    """With ``--remote`` (or an ``--out`` only Spark can write to) Spark writes the tables:
    the same rows, of the same types, and the same page."""
    import pyarrow.parquet as pq

    tables = {name: pq.read_table(report_dir / name) for name in report.TABLES}
    page = report.write_report(tables, tmp_path, spark)
    for name in report.TABLES:
        written = pq.read_table(tmp_path / name)
        assert written.schema == tables[name].schema, name
        assert written.to_pylist() == tables[name].to_pylist(), name
    assert page.read_text() == (report_dir / "report.html").read_text()


@pytest.mark.parametrize(("table", "size"), [("by_tube", None), ("by_minute", MINUTE),
                                             ("by_hour", HOUR)])
def test_counts_and_percentiles(report_dir: Path, record: workload.Record, table: str,
                                size: int | None) -> None:
    actual = {(row["tube"], *(() if size is None else (row["bucket_ms"],))): row
              for row in rows_of(report_dir, table)}
    assert_rows_equal(actual, expected_metrics(record, size), table)


def test_hours_and_minutes_split_where_the_clock_does(report_dir: Path) -> None:
    hours = {row["bucket_ms"] for row in rows_of(report_dir, "by_hour")}
    minutes = {row["bucket_ms"] for row in rows_of(report_dir, "by_minute")}
    assert len(hours) >= 3 and all(hour % HOUR == 0 for hour in hours)
    assert len(minutes) > 100 and all(minute % MINUTE == 0 for minute in minutes)


def test_tries_per_job(report_dir: Path, record: workload.Record) -> None:
    expected: Counter[tuple[str, int]] = Counter()
    for job in record.jobs:
        expected[(job.tube, job.tries)] += 1
        expected[(ALL, job.tries)] += 1
    actual = {(row["tube"], row["tries"]): row["jobs"] for row in rows_of(report_dir, "tries")}
    assert actual == dict(expected)
    assert {tries for _, tries in actual} >= {0, 1, 2, 3}


def test_backlog_every_minute(report_dir: Path, record: workload.Record) -> None:
    actual = {(row["tube"], row["bucket_ms"]): row for row in rows_of(report_dir, "backlog")}
    expected = expected_backlog(record)
    assert_rows_equal(actual, expected, "backlog")  # type: ignore[arg-type]
    final = max(minute for _, minute in expected)
    assert all(actual[(ALL, final)][state] > 0 for state in STATES)


def test_failing_tubes_and_hours(report_dir: Path, record: workload.Record) -> None:
    for table, size in (("failing_tubes", None), ("failing_hours", HOUR)):
        metrics = expected_metrics(record, size)
        failing = sorted(
            ((row["timed_out"] + row["failed"] + row["buried"], key, row)
             for key, row in metrics.items()
             if key[0] != ALL and row["timed_out"] + row["failed"] + row["buried"] > 0),
            key=lambda item: (-item[0], item[1]))
        rows = sorted(rows_of(report_dir, table), key=lambda row: row["rank"])
        assert [row["rank"] for row in rows] == list(range(1, len(failing) + 1))
        for row, (failures, key, want) in zip(rows, failing, strict=True):
            assert (row["tube"], *(() if size is None else (row["bucket_ms"],))) == key
            assert (row["timed_out"], row["failed"], row["buried"], row["failures"]) == (
                want["timed_out"], want["failed"], want["buried"], failures)


def test_only_ttr_time_outs_count_as_time_outs_and_failures(spark: SparkSession) -> None:
    """`timed-out` with reason "" is a TTR time-out (the server's job-timeouts); reason
    `disconnect` (its connection closed), `shutdown` (a stopping tubeq closed it) or `reaped`
    (its process died) is a job given back, counted as `disconnected` or `reaped` and never a
    failure."""
    rows = [
        ("1000-0", "put", 1, "t", 0, 0, 1000, 0, 0, 1000, "p", ""),
        ("1001-0", "reserved", 1, "t", 0, 0, 1000, 0, 1, 1001, "p", ""),
        ("2001-0", "timed-out", 1, "t", 0, 0, 1000, 0, 1, 2001, "p", ""),
        ("2002-0", "reserved", 1, "t", 0, 0, 1000, 0, 2, 2002, "p", ""),
        ("2003-0", "timed-out", 1, "t", 0, 0, 1000, 0, 2, 2003, "p", "disconnect"),
        ("2004-0", "reserved", 1, "t", 0, 0, 1000, 0, 3, 2004, "p", ""),
        ("2005-0", "timed-out", 1, "t", 0, 0, 1000, 0, 3, 2005, "p", "reaped"),
        ("3000-0", "put", 2, "u", 0, 0, 1000, 0, 0, 3000, "p", ""),
        ("3001-0", "reserved", 2, "u", 0, 0, 1000, 0, 1, 3001, "p", ""),
        ("3002-0", "timed-out", 2, "u", 0, 0, 1000, 0, 1, 3002, "p", "disconnect"),
        # A stopping tubeq closed the holder's connection: given back, no try counted.
        ("3003-0", "reserved", 2, "u", 0, 0, 1000, 0, 2, 3003, "p", ""),
        ("3004-0", "timed-out", 2, "u", 0, 0, 1000, 0, 1, 3004, "p", "shutdown"),
    ]
    tables = report.build_report(older_events(spark, rows))
    by_tube = {row["tube"]: row for row in tables["by_tube"].to_pylist()}
    failing = tables["failing_tubes"].to_pylist()
    backlog = {row["tube"]: row["ready"] for row in tables["backlog"].to_pylist()}
    assert {tube: (row["timed_out"], row["disconnected"], row["reaped"])
            for tube, row in by_tube.items()} == {
        "t": (1, 1, 1), "u": (0, 2, 0), ALL: (1, 3, 1)}
    assert failing == [{"rank": 1, "tube": "t", "timed_out": 1, "failed": 0, "buried": 0,
                        "failures": 1}]
    assert backlog == {"t": 1, "u": 1, ALL: 2}  # every one of them went back to ready


def test_events_before_the_archive_began(spark: SparkSession) -> None:
    """A job whose put was trimmed: its first event implies its state; nothing goes negative."""
    rows = [
        ("1000-0", "reserved", 7, "t", 0, 0, 1000, 0, 1, 1000, "p", ""),
        ("2000-0", "deleted", 7, "t", 0, 0, 1000, 0, 1, 2000, "p", ""),
        ("3000-0", "deleted", 8, "t", 0, 0, 1000, 0, 0, 3000, "p", ""),
        ("4000-0", "promoted", 9, "t", 0, 0, 1000, 0, 0, 4000, "p", ""),
    ]
    tables = report.build_report(older_events(spark, rows))
    by_tube = {row["tube"]: row for row in tables["by_tube"].to_pylist()}
    backlog = [row for row in tables["backlog"].to_pylist() if row["tube"] == "t"]
    assert by_tube["t"]["wait_ms_n"] == 0  # the ready time is unknown
    assert by_tube["t"]["processing_ms_p50"] == 1000.0
    assert by_tube["t"]["lateness_ms_n"] == 0  # the due time is unknown
    # Job 7 counts as reserved from its reserve on, until its delete; job 8 never counts; job 9
    # counts as ready from its promotion.
    assert backlog == [{"tube": "t", "bucket_ms": 0, "ready": 1, "delayed": 0, "reserved": 0,
                        "buried": 0, "total": 1}]


def test_a_jobs_events_go_by_stream_id_ms_then_seq_as_numbers(spark: SparkSession) -> None:
    """Within one millisecond the stream id's sequence orders a job's events as a number (seq
    10 after seq 9, where their text sorts the other way), and a bare ``<ms>`` is seq 0."""
    rows = [
        ("1000-10", "deleted", 7, "t", 0, 0, 1000, 0, 1, 1300, "p", ""),
        ("1000-9", "reserved", 7, "t", 0, 0, 1000, 0, 1, 1100, "p", ""),
        ("999", "put", 7, "t", 0, 0, 1000, 0, 0, 1000, "p", ""),
    ]
    t = {row["tube"]: row for row in report.build_report(
        older_events(spark, rows))["by_tube"].to_pylist()}["t"]
    assert (t["wait_ms_n"], t["wait_ms_p50"]) == (1, 100.0)
    assert (t["processing_ms_n"], t["processing_ms_p50"]) == (1, 200.0)


def test_a_backoff_time_out_leaves_the_job_delayed(spark: SparkSession) -> None:
    """Issue 10's events: a time-out with a retry backoff (delay_ms set) makes the job delayed,
    not ready, so its next wait runs from its promotion; deduplicated and reprioritized change
    no state."""
    rows = [
        ("1000-0", "put", 7, "t", 0, 0, 60000, 0, 0, 1000, "p", ""),
        ("2000-0", "reserved", 7, "t", 0, 0, 60000, 0, 1, 2000, "p", ""),
        ("3000-0", "deduplicated", 7, "t", 0, 0, 60000, 0, 1, 3000, "p", ""),
        ("5000-0", "timed-out", 7, "t", 0, 3000, 60000, 8000, 1, 5000, "p", ""),
        ("6000-0", "reprioritized", 7, "t", 5, 0, 60000, 0, 1, 6000, "p", ""),
        ("8500-0", "promoted", 7, "t", 5, 0, 60000, 8000, 1, 8500, "p", ""),
        ("9000-0", "reserved", 7, "t", 5, 0, 60000, 0, 2, 9000, "p", ""),
        ("9500-0", "deleted", 7, "t", 5, 0, 60000, 0, 2, 9500, "p", ""),
    ]
    tables = report.build_report(older_events(spark, rows))
    by_tube = {row["tube"]: row for row in tables["by_tube"].to_pylist()}
    t = by_tube["t"]
    assert t["wait_ms_n"] == 2
    assert (t["wait_ms_p50"], t["wait_ms_p99"]) == (750.0, 995.0)  # 1000 and 500, not 4000
    assert (t["lateness_ms_n"], t["lateness_ms_p50"]) == (1, 500.0)
    assert t["processing_ms_p50"] == 500.0


def test_finished_and_failed_jobs_per_tube(spark: SparkSession) -> None:
    """The ends (issue 32): a finish is a `deleted` with reason `finished` (counted as deleted
    and as finished, its size summed, its processing time measured); a fail is a `failed`
    before the job's own move (counted apart, leaving the job reserved until then), and ranks
    its tube among the failing ones. A finish an older tubeq wrote has no size: 0 bytes."""
    def row(sid: str, event: str, job: int, tube: str, tries: int, reason: str = "",
            size: int | None = 0, error: str | None = "", failures: int | None = 0
            ) -> tuple[Any, ...]:
        at = int(sid.split("-")[0])
        return (sid, event, job, tube, 0, 0, 30000, 0, tries, at, "p", reason, size, error,
                failures)

    rows = [
        row("1000-0", "put", 1, "t", 0),
        row("1100-0", "reserved", 1, "t", 1),
        row("1400-0", "failed", 1, "t", 1, size=4, error="boom", failures=1),
        row("1400-1", "released", 1, "t", 1, "failed"),
        row("1500-0", "reserved", 1, "t", 2),
        row("1800-0", "deleted", 1, "t", 2, "finished", size=9),       # finished: 300 ms
        row("2000-0", "put", 2, "t", 0),
        row("2100-0", "reserved", 2, "t", 1),
        row("2150-0", "deleted", 2, "t", 1),                             # a plain delete: 50 ms
        row("3000-0", "put", 3, "u", 0),
        row("3100-0", "reserved", 3, "u", 1),
        row("3200-0", "failed", 3, "u", 1, size=300, error="E" * 256, failures=1),
        row("3200-1", "buried", 3, "u", 1, "max-tries"),
        row("4000-0", "put", 4, "u", 0, size=None, error=None, failures=None),
        row("4001-0", "reserved", 4, "u", 1, size=None, error=None, failures=None),
        row("4021-0", "deleted", 4, "u", 1, "finished", size=None, error=None, failures=None),
    ]
    tables = report.build_report(spark.createDataFrame(rows, SPARK_DDL))
    by_tube = {row["tube"]: row for row in tables["by_tube"].to_pylist()}
    failing = tables["failing_tubes"].to_pylist()
    backlog = {row["tube"]: (row["reserved"], row["buried"])
               for row in tables["backlog"].to_pylist()}
    columns = ("finished", "failed", "deleted", "result_bytes", "released", "buried_max_tries")
    assert {tube: tuple(row[c] for c in columns) for tube, row in by_tube.items()} == {
        "t": (1, 1, 2, 9, 1, 0), "u": (1, 1, 1, 0, 0, 1), ALL: (2, 2, 3, 9, 1, 1)}
    assert (by_tube["t"]["processing_ms_n"], by_tube["t"]["processing_ms_p50"]) == (2, 175.0)
    assert by_tube["u"]["processing_ms_n"] == 1
    assert by_tube["t"]["wait_ms_n"] == 3  # the fail's release made job 1 ready: 100 ms
    assert failing == [
        {"rank": 1, "tube": "u", "timed_out": 0, "failed": 1, "buried": 1, "failures": 2},
        {"rank": 2, "tube": "t", "timed_out": 0, "failed": 1, "buried": 0, "failures": 1}]
    assert backlog == {"t": (0, 0), "u": (0, 1), ALL: (0, 1)}


@pytest.mark.parametrize(("master", "remote", "expected"), [
    (None, None, report.LOCAL_DRIVER_SAMPLES),            # the command's default, local[*]
    ("local[2]", None, report.LOCAL_DRIVER_SAMPLES),
    ("spark://10.0.0.5:7077", None, report.DRIVER_SAMPLES),
    ("local[*]", "sc://h:15002", report.DRIVER_SAMPLES),  # Connect: the server's driver
])
def test_the_driver_computes_more_percentiles_on_a_local_master(
        master: str | None, remote: str | None, expected: int) -> None:
    assert report.default_driver_samples(master, remote) == expected
    assert report.LOCAL_DRIVER_SAMPLES > report.DRIVER_SAMPLES


def test_a_report_sizes_its_local_archives_by_their_parquet_files(tmp_path: Path) -> None:
    """What decides a short run (a JVM with C1 alone): the bytes of the Parquet files Spark
    reads, not those under ``_`` or ``.`` folders; an archive not on this machine: unknown."""
    (tmp_path / "a" / "date=2026-01-01").mkdir(parents=True)
    (tmp_path / "a" / "date=2026-01-01" / "part-0.parquet").write_bytes(b"x" * 100)
    (tmp_path / "a" / "_staging").mkdir()
    (tmp_path / "a" / "_staging" / "part-1.parquet").write_bytes(b"x" * 1000)
    (tmp_path / "a" / "notes.txt").write_bytes(b"x" * 1000)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "part-0.parquet").write_bytes(b"x" * 10)
    assert report._parquet_bytes([str(tmp_path / "a"), str(tmp_path / "b")]) == 110
    assert report._parquet_bytes([str(tmp_path / "a"), "s3a://bucket/archive"]) is None


def test_empty_archive(spark: SparkSession, tmp_path: Path) -> None:
    empty: DataFrame = spark.createDataFrame([], SPARK_DDL)
    tables = report.build_report(empty)
    page = report.write_report(tables, tmp_path)
    assert "<body data-rendered" not in page.read_text()  # set by the script in a browser only
    assert rows_of(tmp_path, "by_tube") == []


# ---------------------------------------------------------------------------------------------
# report.html in a real browser.
# ---------------------------------------------------------------------------------------------

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--virtual-time-budget=5000")


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("no chromium on PATH: `apt-get install -y chromium chromium-driver` "
                    "(make system-deps does it)")
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=90, check=True)


def page_data(page: Path) -> dict[str, Any]:
    """The JSON the page embeds for its charts."""
    import json

    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                      page.read_text(), re.S)
    assert found is not None
    return json.loads(found.group(1).replace("<\\/", "</"))


def svg_of(dom: str, chart: str) -> str:
    found = re.search(rf'<svg[^>]*id="{chart}"[^>]*>(.*?)</svg>', dom, re.S)
    assert found is not None, chart
    return found.group(1)


def test_report_html_renders_in_chromium(report_dir: Path, record: workload.Record,
                                         tmp_path: Path) -> None:
    page = report_dir / "report.html"
    text = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), "no external resource"
    dom = chromium(tmp_path, "--window-size=1500,1000", "--dump-dom", page.as_uri()).stdout
    # The three charts of all tubes, then three per tube.
    assert f'data-rendered="{3 + 3 * len(workload.TUBES)}"' in dom, dom[-2000:]
    width = re.search(r'data-width="(\d+)"', dom)
    assert width is not None and int(width.group(1)) <= 1500, "the page fits 1,500 px"
    charts = [("chart-throughput", 3), ("chart-wait", 3), ("chart-backlog", 5)]
    charts += [(f"chart-tube-{i}-{kind}", n) for i in range(len(workload.TUBES))
               for kind, n in (("throughput", 3), ("wait", 3), ("backlog", 5))]
    data = {chart["id"]: chart for chart in page_data(page)["charts"]}
    for chart, series in charts:
        svg = svg_of(dom, chart)
        lines = re.findall(r'<path[^>]*class="series"[^>]*>', svg)
        assert len(lines) == series, chart
        # Each line has a point per figure of its series; a gap is a bucket with no figure.
        for tag, values in zip(lines, data[chart]["series"], strict=True):
            path = re.search(r' d="([^"]*)"', tag)
            assert path is not None
            assert len(re.findall(r"[ML]", path.group(1))) == sum(
                v is not None for v in values["values"]), chart
        if not chart.startswith("chart-tube"):
            assert all(len(values["values"]) > 100 for values in data[chart]["series"]), chart
        # Time ticks at a round step, labelled HH:MM; y ticks at 1, 2 or 5 times 10^k.
        clocks = re.findall(r'class="tick-x"[^>]*>(\d\d):(\d\d)<', svg)
        assert len(clocks) >= 2, chart
        minutes = [int(h) * 60 + int(m) for h, m in clocks]
        steps = {(b - a) % (24 * 60) for a, b in itertools.pairwise(minutes)}
        assert len(steps) == 1 and steps <= {1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720}, (
            chart, clocks)
        assert all(m % min(steps) == 0 for m in minutes), (chart, clocks)
        ys = [float(v.replace(",", "")) for v in re.findall(r'class="tick-y"[^>]*>([\d.,]+)<',
                                                              svg)]
        step = ys[1] - ys[0]
        assert ys[0] == 0 and all(b - a == pytest.approx(step)
                                  for a, b in itertools.pairwise(ys))
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert round(mantissa, 6) in (1, 2, 5), (chart, ys)

    # Every minute from the first to the last is on the axis; one without events is a zero,
    # and the counts are the record's own.
    expected = expected_metrics(record, MINUTE)
    throughput = data["chart-throughput"]
    minutes_seen = sorted(minute for tube, minute in expected if tube == ALL)
    assert throughput["x"] == list(range(minutes_seen[0], minutes_seen[-1] + 1, MINUTE))
    puts = dict(zip(throughput["x"], throughput["series"][0]["values"], strict=True))
    assert throughput["series"][0]["name"] == "put"
    assert puts == {minute: expected[(ALL, minute)]["put"] if (ALL, minute) in expected else 0
                    for minute in throughput["x"]}
    silent = [minute for minute in throughput["x"] if (ALL, minute) not in expected]
    assert len(silent) > 10 and all(puts[minute] == 0 for minute in silent)  # no event: zero
    # Per tube, the busiest first (puts + reserves + deletes), each with the same axis.
    busy = expected_metrics(record, None)
    order = sorted(workload.TUBES, key=lambda tube: (
        -sum(busy[(tube,)][c] for c in ("put", "reserved", "deleted")), tube))
    assert re.findall(r'<h3 class="tube">(.*?)</h3>', dom) == order
    for index, tube in enumerate(order):
        chart = data[f"chart-tube-{index}-throughput"]
        assert chart["x"] == throughput["x"]
        deleted = dict(zip(chart["x"], chart["series"][2]["values"], strict=True))
        assert deleted == {minute: expected[(tube, minute)]["deleted"]
                           if (tube, minute) in expected else 0 for minute in chart["x"]}

    # The per-tube tables: every tube and *, columns grouped, buries and time-outs by reason.
    counts = re.search(r'<table id="table-counts">(.*?)</table>', dom, re.S)
    assert counts is not None
    assert counts.group(1).count("<tr>") == 2 + len(workload.TUBES) + 1  # 2 header rows
    for group in ("jobs", "time-outs", "buries", "ends"):
        assert f'class="group">{group}</th>' in counts.group(1), group
    for column in ("timed_out", "disconnected", "reaped", "buried", "buried_deliberate",
                   "buried_max_tries", "buried_expired", "finished", "failed", "result_bytes"):
        assert f'data-column="{column}"' in counts.group(1), column
    times = re.search(r'<table id="table-times">(.*?)</table>', dom, re.S)
    assert times is not None and "queue wait, ms" in times.group(1)
    for table in ("table-failing-tubes", "table-failing-hours", "table-tries"):
        assert re.search(rf'<table id="{table}">.*?<td>', dom, re.S), table

    shot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1500,2400", page.as_uri())
    data_png = shot.read_bytes()
    assert data_png[:8] == b"\x89PNG\r\n\x1a\n" and len(data_png) > 20_000
    keep = os.environ.get("TUBEQ_REPORT_SCREENSHOT")
    if keep:  # how docs/report.png is refreshed
        shutil.copyfile(shot, keep)


DAY = 86_400_000


def test_since_and_until_read_only_the_days_they_need(
        spark: SparkSession, record: workload.Record, report_dir: Path, tmp_path: Path) -> None:
    """Two copies of the workload two days apart, in one archive, and unreadable files in the
    days around the second: --until the day after the first copy reads it alone, and the
    report of the second copy's day (--since, --until) is the workload's own report two days
    later; neither opens a file of a day it does not need."""
    events = workload.events(record)
    at = {name: FIELDS.index(name) + 1 for name in ("id", "time_ms", "due_ms")}
    later = []
    for event in events:
        row = list(event)
        ms, seq = str(row[0]).split("-")
        row[0] = f"{int(ms) + 2 * DAY}-{seq}"
        row[at["id"]] = int(row[at["id"]]) + 1_000_000
        row[at["time_ms"]] = int(row[at["time_ms"]]) + 2 * DAY
        if int(row[at["due_ms"]]):
            row[at["due_ms"]] = int(row[at["due_ms"]]) + 2 * DAY
        later.append(tuple(row))
    path = tmp_path / "two-copies"
    write_archive(spark.createDataFrame(events + later, SPARK_DDL), str(path))
    split = (max(int(e[at["time_ms"]]) for e in events) // DAY + 1) * DAY
    # The first copy ends the day before split, the second lies within the day after it.
    assert split + DAY <= min(int(e[at["time_ms"]]) for e in later)
    assert max(int(e[at["time_ms"]]) for e in later) < split + 2 * DAY

    # A file no reader can read, in a day neither window needs: only a read that opens it fails.
    batch = next(path.glob("batch=*"))  # the archive's one batch (tubeq.pipeline.layout)
    for day in (split, split + 3 * DAY):  # between the copies, and after the second
        folder = batch / f"date={report_day(day)}" / "tube=orders"
        folder.mkdir(parents=True)
        (folder / "part-unreadable.parquet").write_bytes(b"not Parquet")
    with pytest.raises(Exception, match=r"FAILED_READ_FILE|not a Parquet file"):
        report.read_archive(spark, path).count()
    assert report.read_archive(spark, path, until_ms=split).count() == len(events)
    assert report.read_archive(spark, path, since_ms=split + DAY,
                               until_ms=split + 2 * DAY).count() == len(later)
    out = tmp_path / "since"
    assert cli.main(["report", "--archive", str(path), "--out", str(out), "--since",
                     report_day(split + DAY), "--until", report_day(split + 2 * DAY)],
                    spark=spark) == 0
    for name in report.TABLES:
        shifted = [shift_buckets(row, 2 * DAY) for row in rows_of(report_dir, name)]
        assert sorted(map(repr, rows_of(out, name))) == sorted(map(repr, shifted)), name


def report_day(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d")


def shift_buckets(row: dict[str, Any], by_ms: int) -> dict[str, Any]:
    return {key: value + by_ms if key == "bucket_ms" else value for key, value in row.items()}


def test_report_command(spark: SparkSession, archive: Path, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    args = argparse.Namespace(archive=str(archive), out=str(tmp_path / "out"))
    assert report.run_report(args, spark) == 0
    assert capsys.readouterr().out.strip() == (
        f"report: {len(report.TABLES)} tables and {tmp_path / 'out' / 'report.html'}")
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == sorted(
        [*report.TABLES, "report.html"])


def test_a_report_over_several_archives_is_the_report_of_their_union(
        spark: SparkSession, record: workload.Record, report_dir: Path, tmp_path: Path) -> None:
    """A namespace split into shards is archived one shard stream at a time (each tube's
    events in one of them): `report --archive A B` equals the report of one archive of all."""
    events = workload.events(record)
    tube_at = FIELDS.index("tube") + 1  # rows are (stream_id, *FIELDS)
    tubes = sorted({str(event[tube_at]) for event in events})
    parts = []
    for index, half in enumerate((tubes[::2], tubes[1::2])):
        path = tmp_path / f"shard{index}"
        mine = [event for event in events if event[tube_at] in half]
        write_archive(spark.createDataFrame(mine, SPARK_DDL), str(path))
        parts.append(str(path))
    out = tmp_path / "out"
    assert cli.main(["report", "--archive", *parts, "--out", str(out)], spark=spark) == 0
    for name in report.TABLES:
        assert sorted(map(repr, rows_of(out, name))) == sorted(map(repr, rows_of(report_dir,
                                                                                  name))), name


# ---------------------------------------------------------------------------------------------
# A real tubeq: the events its Lua scripts write, reported.
# ---------------------------------------------------------------------------------------------


def answer_in_tube(address: tuple[str, int], tube: str) -> dict[str, int]:
    """A worker that answers, on the wire (greenstalk knows no finish or fail): job a finished
    with a 9-byte result; job b failed twice (back to ready each time), then finished with 2
    bytes. Returns the tube's stats-tube counters as this connection sees them."""
    import socket

    with socket.create_connection(address, timeout=10) as conn, conn.makefile("rb") as replies:

        def ask(command: bytes) -> bytes:
            conn.sendall(command)
            return replies.readline()

        def take() -> int:
            reserved = ask(b"reserve-with-timeout 5\r\n").split()
            assert reserved[0] == b"RESERVED", reserved
            replies.readline()  # the body
            return int(reserved[1])

        assert ask(f"use {tube}\r\nwatch {tube}\r\n".encode()) == f"USING {tube}\r\n".encode()
        assert replies.readline() == b"WATCHING 2\r\n"
        assert ask(b"ignore default\r\n") == b"WATCHING 1\r\n"
        assert ask(b"put 0 0 30 1\r\na\r\n").startswith(b"INSERTED ")
        assert ask(b"finish %d 9\r\nforty-two\r\n" % take()) == b"FINISHED\r\n"
        assert ask(b"put 0 0 30 1\r\nb\r\n").startswith(b"INSERTED ")
        for error in (b"boom", b"boom again"):
            assert ask(b"fail %d %d\r\n%s\r\n" % (take(), len(error), error)) == b"FAILED\r\n"
        assert ask(b"finish %d 2\r\nok\r\n" % take()) == b"FINISHED\r\n"
        head = ask(f"stats-tube {tube}\r\n".encode()).split()
        assert head[0] == b"OK", head
        document = replies.read(int(head[1]) + 2).decode()
    counts = dict(line.split(": ", 1) for line in document.splitlines() if ": " in line)
    return {key: int(counts[key]) for key in ("total-finished", "total-failed")}


def test_report_of_a_real_tubeq_run(spark: SparkSession, tubeq_cluster: Any,
                                    tmp_path: Path) -> None:
    """A real tubeq's events, archived by `tubeq-pipeline archive`, then reported: counts, tries
    and the final backlog exactly; waits and processing within what the test itself slept and
    measured around each command; the jobs finished and failed, and the results' bytes, of a
    second tube where a worker answers (finish, fail: issue 32) as its stats-tube counts them."""
    import time

    import greenstalk
    import redis

    from tests.support.servers import unique_prefix
    from tubeq.store.keys import Keys

    prefix = unique_prefix("report")
    # A shared Redis (--redis) gets events only when asked for.
    server = tubeq_cluster.start(prefix, label="tubeq-report", flags=("--events", "on"))
    try:
        tube = "live"
        started = time.monotonic()
        with greenstalk.Client(server.address, use=tube, watch=tube) as client, \
                greenstalk.Client(server.address, use=tube, watch=tube) as holder:
            for i in range(6):
                client.put(f"now-{i}", ttr=30)
            client.put("late-0", delay=1, ttr=30)
            client.put("short-ttr", ttr=1, priority=0)
            # A second connection holds short-ttr until its TTR runs out (on the first one, the
            # next reserve would answer DEADLINE_SOON).
            assert holder.reserve(timeout=5).body == "short-ttr"
            first = client.reserve(timeout=5)
            time.sleep(0.2)
            client.delete(first)                     # processing >= 200 ms
            second = client.reserve(timeout=5)
            client.release(second, priority=10)      # released ready, now the most urgent
            assert client.reserve(timeout=5).id == second.id
            client.bury(second)
            assert client.kick(1) == 1               # kicked back to ready
            assert client.reserve(timeout=5).id == second.id
            client.bury(second)                      # stays buried
            time.sleep(1.6)                          # late-0 comes due; short-ttr times out
            assert client.reserve(timeout=5).body == "short-ttr"   # pri 0, back after its TTR
            assert client.reserve(timeout=5).body == "now-2"
            ends = answer_in_tube(server.address, "ends")
            stats = dict(client.stats_tube(tube))
            server_timeouts = int(client.stats()["job-timeouts"])
            elapsed_ms = (time.monotonic() - started) * 1000
            keys = Keys(prefix)
            with redis.Redis.from_url(server.extra["redis_url"]) as store:
                recorded = [sid.decode() for sid, _ in store.xrange(keys.events)]
    finally:
        server.stop()
    archived = tmp_path / "archive"
    assert cli.main(["archive", "--redis", server.extra["redis_url"], "--prefix", prefix,
                     "--out", str(archived), "--checkpoint", str(tmp_path / "checkpoint"),
                     "--once"], spark=spark) == 0
    events = report.read_archive(spark, archived)
    # Stopping the server closed the two connections: the jobs they held came back, each with
    # its own event, after the stats above were read.
    after = events.where(~events.stream_id.isin(recorded)).collect()
    assert sorted((row.event, row.reason, row.tube) for row in after) == [
        ("timed-out", "disconnect", tube)] * 2
    during = events.where(events.stream_id.isin(recorded))
    assert during.count() == len(recorded) > 0
    tables = report.build_report(during)
    tubes = {row["tube"]: row for row in tables["by_tube"].to_pylist()}
    by_tube, answered = tubes[tube], tubes["ends"]
    tries = {row["tries"]: row["jobs"] for row in tables["tries"].to_pylist()
             if row["tube"] == tube}
    backlog = max((row for row in tables["backlog"].to_pylist()
                   if row["tube"] == tube), key=lambda row: row["bucket_ms"])
    assert (by_tube["put"], by_tube["reserved"], by_tube["deleted"]) == (8, 7, 1)
    assert (by_tube["released"], by_tube["buried"], by_tube["kicked"]) == (1, 2, 1)
    assert (by_tube["buried_deliberate"], by_tube["buried_max_tries"],
            by_tube["buried_expired"]) == (2, 0, 0)
    assert (by_tube["timed_out"], by_tube["promoted"]) == (1, 1)
    assert by_tube["processing_ms_n"] == 1
    assert 200 <= by_tube["processing_ms_p50"] <= elapsed_ms
    assert by_tube["wait_ms_n"] == 7
    assert by_tube["wait_ms_p50"] >= 0 and by_tube["wait_ms_p99"] <= elapsed_ms
    assert by_tube["lateness_ms_n"] == 1 and 0 <= by_tube["lateness_ms_p50"] < 1000
    # short-ttr 2 tries, now-0 1, the released one 3, now-2 1; now-3..5 and late-0 none.
    assert tries == {0: 4, 1: 2, 2: 1, 3: 1}
    # The whole archive: the two jobs given back at the stop are disconnects, not time-outs.
    tables = report.build_report(events)
    every = {row["tube"]: row for row in tables["by_tube"].to_pylist()}[tube]
    assert (every["timed_out"], every["disconnected"]) == (server_timeouts, 2) == (1, 2)
    assert by_tube["disconnected"] == 0
    assert (backlog["ready"], backlog["delayed"], backlog["reserved"], backlog["buried"]) == (
        stats["current-jobs-ready"], stats["current-jobs-delayed"],
        stats["current-jobs-reserved"], stats["current-jobs-buried"]) == (4, 0, 2, 1)
    # The ends: two jobs finished (9 and 2 bytes), one of them after two fails.
    assert (answered["finished"], answered["failed"], answered["result_bytes"]) == (
        ends["total-finished"], ends["total-failed"], 11) == (2, 2, 11)
    assert (answered["put"], answered["reserved"], answered["released"],
            answered["deleted"]) == (2, 4, 2, 2)
    assert answered["processing_ms_n"] == 2
