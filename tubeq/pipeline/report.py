"""The analytics report: what the archived lifecycle events say about each tube, over time.

Owns the derivation of a job's life from its events (the state before and after each event, the
queue wait, the processing time, the delay lateness), the aggregates over it that the result
tables are rolled up from, and ``report.html``, the page an operator reads offline. Input is any
DataFrame with the ``tubeq.model.events.SPARK_DDL`` columns (the archive, read back, is one).
What grows with the events is PySpark DataFrame code, so the same report runs on one laptop or
on a cluster: the per-job window, the flows per tube and minute, the tries per tube and the
percentiles' samples. What Spark hands back is small whatever the archive's length (rows per
tube and minute), and the seven tables are rolled up from it in this process (``rollup.py``),
then written and drawn from the same rows: two Spark actions for a small archive, three for a
large one, where a plan per table made a fresh report of 1,000 events 68 Spark jobs
(bench/RESULTS-pipeline.md, issue 33).

Rules:

* A job's events are ordered by their stream id (``<ms>-<seq>``: the order Redis recorded them),
  not by ``time_ms``; a job is ``(tube, id)``.
* The state machine is data (``_NEW_STATE``): each event names the state the job is in after it.
  The state before an event is the previous event's state after; a job whose earlier events are
  not in the archive (trimmed before it was archived, or put before recording began) has no
  known state before its first archived event: that event only adds it to the state it leaves
  it in (a ``deleted`` first changes no count), and measures nothing that needs an earlier time.
* Queue wait is measured at ``reserved``: its time minus the time the job last became ready (its
  put for an immediate job, otherwise the promotion, kick, release or time-out that made it ready).
  Processing time is measured at ``deleted`` of a reserved job: its time minus the job's last
  ``reserved``. Delay lateness is measured at ``promoted``: its time minus the due time (the
  event's own ``due_ms`` if set, else the ``due_ms`` of the put or release that delayed the job).
  Each lands in the minute and hour of the event it is measured at.
* Percentiles are **exact** (linear interpolation between the two nearest ranks, as
  ``numpy.percentile``'s default and Spark's ``percentile``), not ``percentile_approx``: the
  report's figures are the figures, and a test can recompute them to the last digit. They are
  read off sorted samples by numpy (``rollup.py``), every grain from one pass: each hour's
  samples give that hour's minutes and the hour itself, for every tube and for all tubes; each
  tube's samples (on Spark, its histogram of distinct values) give the whole archive. Up to
  ``--driver-samples`` samples are collected and read off in this process (each grain from
  one sort of them all), more by Spark's Python workers, hour by hour and tube by tube: the
  same figures. The per-job window (a sort of every event) runs once; its narrowed output is
  cached, as plain columns, while the aggregates read it.
* ``timed_out`` counts TTR time-outs only: ``timed-out`` events with reason ``""``, what the
  server counts in ``job-timeouts``. A ``timed-out`` with a reason gave the job back without its
  TTR running out: ``disconnected`` (reason ``disconnect``: its connection closed; and reason
  ``shutdown``: a stopping tubeq closed it, the job given back with no try counted) and
  ``reaped`` (the process holding it died) count those, and neither is a failure. A job a
  consumer handed back (``hand-back``) is a ``released`` event, counted there.
* ``buried`` counts every bury, and ``buried_deliberate`` (a client's bury),
  ``buried_max_tries`` and ``buried_expired`` (a job policy's, by the event's reason) split it.
* The ends (issue 32): ``finished`` counts the ``deleted`` events with reason ``finished`` (a
  finish is a delete that answered: ``deleted`` counts it too, and processing time is measured
  at it as at any delete of a reserved job), and ``result_bytes`` sums their ``size``. ``failed``
  counts the ``failed`` events, one per ``fail``, which leave the job reserved: the ``released``,
  ``buried`` or ``expired`` after it moves the job and is counted as such. The server's
  stats-tube ``total-finished`` and ``total-failed`` count the same. An archive written before
  ``size`` existed reads it null: 0 bytes.
* A tube's or an hour's failures, which the rankings sort by, are its TTR time-outs, fails and
  buries (``timed_out + failed + buried``): a fail that was a job's last try counts twice (its
  ``failed`` and its ``buried``), as a time-out that was does.
* Every table also has rows for all tubes together, with ``tube`` = ``"*"`` (a character no tube
  name may contain).
* Backlog is derived from the event flow only: per minute, the jobs in each state at the end of
  that minute, counting from the start of the archive. Jobs that were already waiting before the
  archive's first event are not in it until an event of theirs is; then they count in the
  state that event leaves them in.

Entry points: :func:`aggregate` (Spark's part), :func:`build_report` (a DataFrame of events in,
the tables out, as Arrow tables), :func:`write_report` (Parquet tables and ``report.html`` under
a directory: written by this process, or by Spark where its driver writes, with ``--remote``)
and :func:`run_report`, which the ``tubeq-pipeline report`` command calls.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from tubeq.model.events import FIELDS, INT_FIELDS, LATER_FIELDS, SPARK_DDL, EventName
from tubeq.pipeline.layout import is_old_format, local_path, old_format_error
from tubeq.pipeline.page import render_html
from tubeq.pipeline.rollup import (
    FIGURES_DDL,
    figures_of,
    minute_and_hour_figures,
    report_tables,
    whole_archive_figures,
)
from tubeq.pipeline.session import PipelineError, spark_session
from tubeq.pipeline.tables import (
    ALL_TUBES,
    BURIED,
    BURIED_EXPIRED,
    BURIED_MAX_TRIES,
    COUNTED,
    DELAYED,
    DISCONNECTED,
    FINISHED,
    HOUR_MS,
    MEASURES,
    MINUTE_MS,
    READY,
    REAPED,
    RESERVED,
    STATES,
    SUMMED,
    TABLES,
)

log = logging.getLogger("tubeq.pipeline.report")

GONE: Final = "gone"

# The per-job window sorts every event of the archive, so its rows are kept narrow: events and
# states travel through it as small integer codes (their index in these tuples), not as strings.
_EVENT_CODES: Final[tuple[str, ...]] = (*EventName, DISCONNECTED, REAPED, BURIED_MAX_TRIES,
                                         BURIED_EXPIRED, FINISHED)
_STATE_CODES: Final = (*STATES, GONE)


def _event(name: str) -> Column:
    return F.lit(_EVENT_CODES.index(name))


def _state(state: str) -> Column:
    return F.lit(_STATE_CODES.index(state))


def event_code(event: Column, reason: Column) -> Column:
    """The code of the event named by ``event``, told apart by ``reason`` where the report counts
    reasons apart (a ``timed-out`` or ``buried`` that tubeq did on its own, a ``deleted`` by
    finish); null for a name this module does not know. Public for the live table
    (``live.py``), which counts the same way."""
    by_name = F.create_map(*[F.lit(part) for code, name in enumerate(_EVENT_CODES)
                             for part in (str(name), code)])[event]
    why = F.coalesce(reason, F.lit(""))
    timed_out = event == EventName.TIMED_OUT.value
    buried = event == EventName.BURIED.value
    return (F.when(timed_out & (why == "reaped"), _event(REAPED))
            .when(timed_out & (why != ""), _event(DISCONNECTED))
            .when(buried & (why == "max-tries"), _event(BURIED_MAX_TRIES))
            .when(buried & (why == "expired"), _event(BURIED_EXPIRED))
            .when(_finished(event, reason), _event(FINISHED))
            .otherwise(by_name))


def _finished(event: Column, reason: Column) -> Column:
    """Whether the event (by name and reason) is a finish's ``deleted``."""
    return (event == EventName.DELETED.value) & (F.coalesce(reason, F.lit("")) == "finished")


def _new_state(event: Column, delay_ms: Column) -> Column:
    """The code of the state a job is in after ``event`` (a name); null for an event that changes
    nothing."""
    delayed_or_ready = F.when(delay_ms > 0, _state(DELAYED)).otherwise(_state(READY))
    return (
        F.when(event == EventName.PUT.value, delayed_or_ready)
        # A time-out with a retry backoff (put-with backoff-ms) leaves the job delayed.
        .when(event.isin(EventName.RELEASED.value, EventName.TIMED_OUT.value), delayed_or_ready)
        .when(event.isin(EventName.PROMOTED.value, EventName.KICKED.value), _state(READY))
        # A fail leaves the job reserved for the instant until its move, the next event.
        .when(event.isin(EventName.RESERVED.value, EventName.TOUCHED.value,
                         EventName.FAILED.value), _state(RESERVED))
        .when(event == EventName.BURIED.value, _state(BURIED))
        .when(event.isin(EventName.DELETED.value, EventName.EXPIRED.value,
                         EventName.DEAD_LETTERED.value), _state(GONE))
    )


def read_archive(spark: SparkSession, *archives: str | Path, since_ms: int | None = None,
                 until_ms: int | None = None) -> DataFrame:
    """The events of one archive or several (Parquet directories, partitioned by ``date`` and
    ``tube`` or not): a namespace split into shards (tubeq.store.shards) has one event stream, so
    one archive, per shard, and its jobs' ids are unique across them. With ``since_ms`` and
    ``until_ms``: the events in ``[since_ms, until_ms)`` only, and of a partitioned archive only
    the ``date`` partitions that can hold them are read.

    The schema is given rather than inferred, so a tube named ``007`` stays a string. A local
    archive of the old format (``_spark_metadata``) is a :class:`PipelineError` that says how to
    convert it (``layout.py``): the other readers would read its partial files.
    """
    if not archives:
        raise ValueError("read_archive needs at least one archive directory")
    for archive in archives:
        path = local_path(archive)
        if path is not None and is_old_format(path):
            raise old_format_error(str(archive))
    # One read per directory, then a union: Spark's partition discovery refuses several roots
    # of date=/tube= directories in one read (CONFLICTING_DIRECTORY_STRUCTURES).
    frames = [_within(spark.read.schema(f"{SPARK_DDL}, date STRING").parquet(str(archive)),
                      since_ms, until_ms).select("stream_id", *FIELDS) for archive in archives]
    return functools.reduce(DataFrame.unionByName, frames)


def _within(frame: DataFrame, since_ms: int | None, until_ms: int | None) -> DataFrame:
    """``frame``'s events in ``[since_ms, until_ms)``. The ``date`` conditions involve the
    partition column alone, so Spark prunes the partitions outside them (an archive not
    partitioned by date has it null: every file is read, then filtered by ``time_ms``)."""
    date, time_ms = F.col("date"), F.col("time_ms")
    if since_ms is not None:
        frame = frame.where(date.isNull() | (date >= F.lit(_day(since_ms))))
        frame = frame.where(time_ms >= F.lit(since_ms))
    if until_ms is not None:
        frame = frame.where(date.isNull() | (date <= F.lit(_day(until_ms - 1))))
        frame = frame.where(time_ms < F.lit(until_ms))
    return frame


def _day(ms: int) -> str:
    """The archive's ``date`` partition value (UTC day) of instant ``ms``."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d")


def parse_instant(text: str) -> int:
    """``--since``/``--until``'s value: an ISO date or date and time (UTC unless it names its
    offset), in ms since the epoch."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise PipelineError(f"not a date or time: {text!r} (give e.g. 2026-11-29 or "
                            "2026-11-29T10:00, UTC)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def annotate(events: DataFrame) -> DataFrame:
    """Each event that changes a job's state, reduced to what the tables need of the job's life.

    Columns: tube; bucket_ms (the event's minute); event and state_after (codes: indexes in
    ``_EVENT_CODES`` and ``_STATE_CODES``); known_before (the code of the state the job's previous
    event left, null for its first event in the archive); job_tries (on the job's first event
    only: the most reservations any of its events counts); measure (the index in ``MEASURES`` of
    what the event measures, null if nothing) and value (that measure, ms); result_bytes (a
    finish's result size, 0 where the archive has none; null on every other event).
    """
    events = with_later_fields(events)
    event = F.col("event")
    time_ms = F.col("time_ms")
    state_after = F.col("state_after")
    # "<ms>-<seq>" (a bare "<ms>" has seq 0), cut without a split's regex and array; the seq is
    # what follows the dash (one cut, not two: ~0.7 of a 10M-event window's ~12 CPU-s).
    sid = F.col("stream_id")
    sid_seq = F.when(F.instr(sid, "-") > 0, F.substring_index(sid, "-", -1).cast("long"))
    rows = (events
            .select("tube", "id", "due_ms", "tries", "time_ms",
                    F.substring_index(sid, "-", 1).cast("long").alias("sid_ms"),
                    F.coalesce(sid_seq, F.lit(0)).alias("sid_seq"),
                    event_code(event, F.col("reason")).alias("event"),
                    _new_state(event, F.col("delay_ms")).alias("state_after"),
                    F.when(_finished(event, F.col("reason")),
                           F.coalesce(F.col("size"), F.lit(0))).alias("result_bytes"))
            .where(state_after.isNotNull()))
    # The job id first: the sort's prefix is then a long that settles nearly every comparison,
    # where the tube (a string shared by a fiftieth of the events) settles none.
    job = Window.partitionBy("id", "tube").orderBy("sid_ms", "sid_seq")
    before = job.rowsBetween(Window.unboundedPreceding, -1)
    whole = job.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    # All in one select, so Spark evaluates them in one window operator over one sort.
    rows = rows.select(
        "tube", "event", "state_after", "time_ms", "due_ms", "result_bytes",
        F.lag("state_after").over(job).alias("known_before"),
        F.max("tries").over(whole).alias("most_tries"),
        F.last(F.when(state_after == _state(READY), time_ms), ignorenulls=True)
        .over(before).alias("ready_since"),
        F.last(F.when(event == _event(EventName.RESERVED), time_ms), ignorenulls=True)
        .over(before).alias("reserved_since"),
        F.last(F.when((state_after == _state(DELAYED)) & (F.col("due_ms") > 0),
                      F.col("due_ms")), ignorenulls=True).over(before).alias("delayed_until"))
    known_before = F.col("known_before")
    own_due = F.when(F.col("due_ms") > 0, F.col("due_ms"))
    # An event measures one thing at most: the three conditions exclude each other by event.
    wait = (event == _event(EventName.RESERVED)) & (known_before == _state(READY))
    processing = (event.isin(_event(EventName.DELETED), _event(FINISHED))
                  & (known_before == _state(RESERVED)))
    lateness = event == _event(EventName.PROMOTED)
    value = (F.when(wait, time_ms - F.col("ready_since"))
             .when(processing, time_ms - F.col("reserved_since"))
             .when(lateness, time_ms - F.coalesce(own_due, F.col("delayed_until"))))
    measure = (F.when(wait, F.lit(MEASURES.index("wait_ms")))
               .when(processing, F.lit(MEASURES.index("processing_ms")))
               .when(lateness, F.lit(MEASURES.index("lateness_ms"))))
    # The job's first event is the one with no state before it (state_after is never null):
    # no row_number, whose frame would be a fourth pass over every job.
    return rows.select(
        "tube", _bucket(time_ms, MINUTE_MS).alias("bucket_ms"), "event", "known_before",
        "state_after", F.when(known_before.isNull(), F.col("most_tries")).alias("job_tries"),
        F.when(value.isNotNull(), measure).alias("measure"), value.alias("value"),
        "result_bytes")


def with_later_fields(events: DataFrame) -> DataFrame:
    """``events`` with the ``LATER_FIELDS`` it lacks added as nulls: a DataFrame of the schema
    before them (an old archive read without ``read_archive``'s schema) reports as one with them
    null."""
    for name in LATER_FIELDS:
        if name not in events.columns:
            kind = "bigint" if name in INT_FIELDS else "string"
            events = events.withColumn(name, F.lit(None).cast(kind))
    return events


def _bucket(time_ms: Column, size_ms: int) -> Column:
    return F.floor(time_ms / F.lit(size_ms)).cast("long") * F.lit(size_ms)


def counted(code: Column) -> list[Column]:
    """The aggregates of ``COUNTED_COLUMNS``, in order, over rows whose event code (from
    :func:`event_code`) is ``code``: how many of a group's events each column counts."""
    return [F.count(F.when(code.isin(*[_EVENT_CODES.index(name) for name in names]), 1))
            .alias(column) for column, names in COUNTED]


def _minute_flows(facts: DataFrame) -> DataFrame:
    """Per tube and minute: each counted event's count, the ``SUMMED`` sums, each state's net
    change ``d_<state>`` (jobs that entered it minus jobs that left it) and the samples there
    (events that measure something)."""
    # A job's first event in the archive only adds it: it was in no count before.
    deltas = [(F.count(F.when(F.col("state_after") == _state(state), 1))
               - F.count(F.when(F.col("known_before") == _state(state), 1))).alias(f"d_{state}")
              for state in STATES]
    # SUMMED, in its order: facts has a column of each, null on the events it does not apply to.
    sums = [F.coalesce(F.sum(column), F.lit(0)).cast("long").alias(column) for column in SUMMED]
    return facts.groupBy("tube", "bucket_ms").agg(*counted(F.col("event")), *sums, *deltas,
                                                  F.count("measure").alias("samples"))


# ---------------------------------------------------------------------------------------------
# What Spark computes: the aggregates over the events, which grow with the archive. The tables
# are rolled up from them in this process (rollup.py).
# ---------------------------------------------------------------------------------------------

# The most samples (events that measure a wait, a processing time or a lateness) whose
# percentiles this process computes from the samples themselves, collected; past it Spark's Python
# workers do, hour by hour and from each tube's histogram. Both run rollup's functions on the same
# samples, so the figures are the same either way (tests/pipeline/test_report.py); the driver
# saves a small report two shuffles and the start of the Python workers, and a million samples
# are ~30 MB of Arrow. On a cluster (or with --remote) that is the bound: the driver is one
# machine among many.
DRIVER_SAMPLES: Final = 1_000_000
# On a local master the Python workers run on this machine's cores too, and computing there costs
# two shuffles and a Python worker per task: a 10M-event report (5.25M samples) took 84.7 s
# (24 task CPU-s, the Python workers besides) for that step, against 6.5 s to collect the samples
# and ~10-14 s of numpy here, ~1 GB of this process's memory at the peak (AMD EPYC, 2 cores,
# loaded; bench/RESULTS-pipeline.md); the numpy is ~1 s since it sorts packed pairs
# (rollup.sample_percentiles).
LOCAL_DRIVER_SAMPLES: Final = 10_000_000
# A report of local archives whose Parquet files hold at most this many bytes is short: its JVM
# compiles with C1 alone (session.SHORT_RUN_JAVA_OPTIONS). The generated archives of
# bench.pipeline_report_bench hold ~19 bytes an event: 1,000,000 events are 19 MB.
SHORT_REPORT_BYTES: Final = 32 * 2**20


# The per-job window's output is cached for the two reads of it, the flows and the samples. The
# cache's column compression (Spark's default) chooses an encoding per column and batch, which
# cost more CPU than the cache saves in memory here: a 10M-event report's cache (~600 MB plain,
# held for seconds) took ~4 CPU-s more to build compressed (AMD EPYC, 2 cores;
# bench/RESULTS-pipeline.md).
_CACHE_COMPRESSED: Final = "spark.sql.inMemoryColumnarStorage.compressed"


@dataclass(frozen=True)
class Aggregates:
    """What Spark computed over the events (Arrow tables of rollup's schemas): the flows per tube
    and minute, every percentile figure, and the jobs per number of tries per tube."""

    flows: Any
    figures: Any
    tries: Any


def _samples(facts: DataFrame) -> DataFrame:
    return (facts.where(F.col("measure").isNotNull())
            .select("tube", "bucket_ms", "measure", "value"))


def _bucket_figures(facts: DataFrame) -> DataFrame:
    """``FIGURES_DDL`` rows per minute and per hour, every tube and all tubes: one pass, grouped
    by hour."""
    return (_samples(facts).withColumn("hour_ms", _bucket(F.col("bucket_ms"), HOUR_MS))
            .groupBy("hour_ms").applyInArrow(minute_and_hour_figures, FIGURES_DDL))


def _archive_figures(facts: DataFrame) -> DataFrame:
    """``FIGURES_DDL`` rows over the whole archive, per tube and all tubes, from histograms
    (their size is the number of distinct values, whatever the archive's length)."""
    per_tube = _samples(facts).groupBy("tube", "measure", "value").agg(F.count("*").alias("n"))
    every = (per_tube.groupBy(F.lit(ALL_TUBES).alias("tube"), "measure", "value")
             .agg(F.sum("n").alias("n")))
    return (per_tube.unionByName(every).groupBy("tube")
            .applyInArrow(whole_archive_figures, FIGURES_DDL))


def _tries(facts: DataFrame) -> DataFrame:
    """Jobs per tube and number of reservations (on each job's first event)."""
    return (facts.where(F.col("job_tries").isNotNull())
            .groupBy("tube", F.col("job_tries").alias("tries"))
            .agg(F.count("*").alias("jobs")))


def aggregate(events: DataFrame, driver_samples: int = DRIVER_SAMPLES) -> Aggregates:
    """Spark's part of the report: the per-job window over ``events`` (cached while it is read),
    then in one action the flows per tube and minute with the tries per tube, and in a second
    the percentile figures (from the collected samples when there are at most
    ``driver_samples``, else on Spark's Python workers)."""
    with plain_cache(events.sparkSession):
        facts = annotate(events).persist()
        try:
            return _aggregated(facts, driver_samples)
        finally:
            facts.unpersist()


@contextlib.contextmanager
def plain_cache(spark: SparkSession) -> Iterator[None]:
    """Inside the block, what is cached (built by the first action that reads it) is kept as
    plain columns, not compressed (``_CACHE_COMPRESSED``); the session's own setting is given
    back after, however the block ends. A session that refuses the setting (a managed Spark
    Connect server may allow only some: ``CONFIG_NOT_AVAILABLE``) keeps its own: the report
    then costs what it did before, and runs."""
    before = spark.conf.get(_CACHE_COMPRESSED)
    try:
        spark.conf.set(_CACHE_COMPRESSED, "false")
    except Exception as refused:  # (pyspark's errors differ by session kind)
        log.info("the report's cache stays as the session has it: %s", refused)
        yield
        return
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_CACHE_COMPRESSED)
        else:
            spark.conf.set(_CACHE_COMPRESSED, before)


def _aggregated(facts: DataFrame, driver_samples: int) -> Aggregates:
    """:func:`aggregate`'s two actions over the cached per-job window."""
    # One action for two results of different columns: each row says which it belongs to.
    both = (_minute_flows(facts).withColumn("part", F.lit(0))
            .unionByName(_tries(facts).withColumn("part", F.lit(1)),
                         allowMissingColumns=True)
            .toArrow())
    part = both.column("part")
    flows = both.filter(pc.equal(part, 0))
    tries = both.filter(pc.equal(part, 1))
    samples = pc.sum(flows.column("samples")).as_py() or 0
    if samples <= driver_samples:
        figures = figures_of(_samples(facts).toArrow())
    else:
        figures = _bucket_figures(facts).unionByName(_archive_figures(facts)).toArrow()
    return Aggregates(flows, figures, tries)


def build_report(events: DataFrame, driver_samples: int = DRIVER_SAMPLES) -> dict[str, Any]:
    """Every result table of the report (``TABLES``: Arrow tables of ``rollup.SCHEMAS``) from a
    DataFrame of lifecycle events."""
    computed = aggregate(events, driver_samples)
    return report_tables(computed.flows, computed.figures, computed.tries)


def write_report(tables: Mapping[str, Any], out_dir: str | Path,
                 spark: SparkSession | None = None) -> Path:
    """Write each table as ``<out_dir>/<name>/`` Parquet (replacing what was there) and the
    page, ``<out_dir>/report.html``, built from the same rows; returns the page's path.

    Without ``spark`` this process writes the tables (pyarrow, one file each); with it Spark
    does, where its driver writes: the Spark Connect server's file system with ``--remote``, or
    a location only the JVM's file systems know (hdfs://, s3a://).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        if spark is None:
            _write_parquet(tables[name], out / name)
        else:
            (spark.createDataFrame(tables[name]).coalesce(1).write.mode("overwrite")
             .parquet(f"{str(out_dir).rstrip('/')}/{name}"))
    page = out / "report.html"
    page.write_text(render_html({name: tables[name].to_pylist() for name in TABLES}),
                    encoding="utf-8")
    return page


def _write_parquet(table: Any, folder: Path) -> None:
    """``folder`` holding ``table`` alone, as one Parquet file (Spark's name for it)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    pq.write_table(table, folder / "part-00000.parquet")


# ---------------------------------------------------------------------------------------------
# Command line: `tubeq-pipeline report --archive DIR --out DIR`.
# ---------------------------------------------------------------------------------------------


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``report`` subcommand's own arguments (the dispatcher adds --master/--remote)."""
    parser.add_argument("--archive", required=True, nargs="+", metavar="DIR",
                        help="the archive's Parquet directory; several: one report over all "
                             "(a split namespace's shards, archived one by one)")
    parser.add_argument("--out", required=True, help="where the tables and report.html go")
    parser.add_argument("--since", type=_instant_argument, metavar="WHEN",
                        help="only events from WHEN on (ISO date or date and time, UTC): of a "
                             "partitioned archive only the days needed are read")
    parser.add_argument("--until", type=_instant_argument, metavar="WHEN",
                        help="only events before WHEN (ISO date or date and time, UTC)")
    parser.add_argument("--driver-samples", type=_count_argument, default=None, metavar="N",
                        help="compute the percentiles in this process when the archive has at "
                             "most N samples (waits, processing times, latenesses), else on "
                             "Spark's Python workers; 0: always there (default "
                             f"{LOCAL_DRIVER_SAMPLES:,} on a local master, else "
                             f"{DRIVER_SAMPLES:,})")


def _instant_argument(text: str) -> int:
    try:
        return parse_instant(text)
    except PipelineError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def default_driver_samples(master: str | None, remote: str | None) -> int:
    """``--driver-samples`` when it is not given: ``LOCAL_DRIVER_SAMPLES`` for a local master
    (the command's default one included), ``DRIVER_SAMPLES`` on a cluster or with ``remote``."""
    if remote is None and (master is None or master.startswith("local")):
        return LOCAL_DRIVER_SAMPLES
    return DRIVER_SAMPLES


def _count_argument(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}")
    return number


def _parquet_bytes(archives: Sequence[str]) -> int | None:
    """The bytes of the Parquet files the archives hold, when all are local (else None)."""
    total = 0
    for archive in archives:
        path = local_path(archive)
        if path is None:
            return None
        for folder, subfolders, files in os.walk(path):
            subfolders[:] = [name for name in subfolders if not name.startswith(("_", "."))]
            total += sum(os.path.getsize(os.path.join(folder, name)) for name in files
                         if name.endswith(".parquet") and not name.startswith(("_", ".")))
    return total


def _holds_parquet(path: Path) -> bool:
    """Whether ``path`` is a Parquet file or a directory with one below it, in the places Spark
    reads (not under ``_`` or ``.`` directories such as ``_spark_metadata``)."""
    if path.is_file():
        return True
    for _, subfolders, files in os.walk(path):
        subfolders[:] = [name for name in subfolders if not name.startswith(("_", "."))]
        if any(name.endswith(".parquet") and not name.startswith(("_", "."))
               for name in files):
            return True
    return False


def check_archives(archives: Sequence[str]) -> None:
    """Raise :class:`PipelineError` before Spark starts for a local ``--archive`` that does not
    exist, when every archive is local and none holds a Parquet file (an empty archive has
    nothing to report, and a report of nothing would replace a real one), and for a local
    archive of the old format (it says how to convert it)."""
    local = [(archive, local_path(archive)) for archive in archives]
    for archive, path in local:
        if path is not None and not path.exists():
            raise PipelineError(f"--archive {archive}: no such directory")
    if all(path is not None and not _holds_parquet(path) for _, path in local):
        raise PipelineError(f"no events to report: --archive {' '.join(archives)} holds no "
                            "Parquet file")
    for archive, path in local:
        if path is not None and is_old_format(path):
            raise old_format_error(archive)


def run_report(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Run ``tubeq-pipeline report``: read the archive, write the tables and the page; an
    archive that is missing or holds no event is a :class:`PipelineError`, and no report."""
    archives = [args.archive] if isinstance(args.archive, str) else args.archive
    check_archives(archives)
    if spark is None:
        held = _parquet_bytes(archives)
        spark = spark_session(getattr(args, "master", None), getattr(args, "remote", None),
                              jvm_log=getattr(args, "jvm_log", None),
                              short=held is not None and held <= SHORT_REPORT_BYTES)
    since_ms, until_ms = getattr(args, "since", None), getattr(args, "until", None)
    if since_ms is not None and until_ms is not None and since_ms >= until_ms:
        raise PipelineError("--since must come before --until")
    events = read_archive(spark, *archives, since_ms=since_ms, until_ms=until_ms)
    driver_samples = getattr(args, "driver_samples", None)
    if driver_samples is None:
        driver_samples = default_driver_samples(getattr(args, "master", None),
                                                getattr(args, "remote", None))
    computed = aggregate(events, driver_samples)
    # Only a report without a job's event can be of an empty archive: asked then alone.
    if computed.flows.num_rows == 0 and events.isEmpty():
        raise PipelineError(f"no events to report: --archive {' '.join(archives)} holds no "
                            "events")
    tables = report_tables(computed.flows, computed.figures, computed.tries)
    # The tables go where this process can write them, or else where Spark's driver writes.
    remote = bool(getattr(args, "remote", None))
    page = write_report(tables, args.out,
                        spark if remote or local_path(args.out) is None else None)
    print(f"report: {len(TABLES)} tables and {page}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tubeq.pipeline.report``: the ``report`` command on its own."""
    parser = argparse.ArgumentParser(prog="tubeq-pipeline report")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--remote", help="a Spark Connect URL (sc://HOST:PORT) instead")
    add_report_arguments(parser)
    return run_report(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
