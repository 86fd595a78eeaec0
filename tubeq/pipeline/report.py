"""The analytics report: what the archived lifecycle events say about each tube, over time.

Owns the derivation of a job's life from its events (the state before and after each event, the
queue wait, the processing time, the delay lateness), the result tables built from it, and
``report.html``, the page an operator reads offline. Input is any DataFrame with the
``tubeq.model.events.SPARK_DDL`` columns (the archive, read back, is one); everything is PySpark
DataFrame code, so the same report runs on one laptop or on a cluster.

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
  read off sorted samples by numpy in Spark's Python workers, every grain from one pass: each
  hour's samples give that hour's minutes and the hour itself, for every tube and for all tubes;
  each tube's histogram of distinct values gives the whole archive. The per-job window (a sort
  of every event) runs once; its narrowed output is cached for the tables that read it.
* ``timed_out`` counts TTR time-outs only: ``timed-out`` events with reason ``""``, what the
  server counts in ``job-timeouts``. A ``timed-out`` with a reason (``disconnect``: its
  connection closed; ``reaped``: the process holding it died) gave the job back without its TTR
  running out: it is counted as ``disconnected`` and is never a failure.
* Every table also has rows for all tubes together, with ``tube`` = ``"*"`` (a character no tube
  name may contain).
* Backlog is derived from the event flow only: per minute, the jobs in each state at the end of
  that minute, counting from the start of the archive. Jobs that were already waiting before the
  archive's first event are not in it until an event of theirs is; then they count in the
  state that event leaves them in.

Entry points: :func:`build_report` (DataFrames in, DataFrames out), :func:`write_report`
(Parquet tables and ``report.html`` under a directory) and :func:`run_report`, which the
``tubeq-pipeline report`` command calls.
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from tubeq.model.events import FIELDS, SPARK_DDL, EventName
from tubeq.pipeline.layout import is_old_format, local_path, old_format_error
from tubeq.pipeline.session import PipelineError, spark_session

PERCENTILES: Final = (0.5, 0.95, 0.99)
ALL_TUBES: Final = "*"
MINUTE_MS: Final = 60_000
HOUR_MS: Final = 3_600_000

READY: Final = "ready"
DELAYED: Final = "delayed"
RESERVED: Final = "reserved"
BURIED: Final = "buried"
GONE: Final = "gone"
# The states a backlog counts, in the order the tables and charts show them.
STATES: Final = (READY, DELAYED, RESERVED, BURIED)

# The report's name for a ``timed-out`` event with a reason (disconnect, reaped): a job given
# back because whoever held it went away, not a TTR time-out. Not an event name of the stream.
DISCONNECTED: Final = "timed-out+reason"

# Events counted per tube and bucket: (event, column).
COUNTED: Final = (
    (EventName.PUT, "put"),
    (EventName.PROMOTED, "promoted"),
    (EventName.RESERVED, "reserved"),
    (EventName.RELEASED, "released"),
    (EventName.TIMED_OUT, "timed_out"),  # reason "": the TTR ran out
    (DISCONNECTED, "disconnected"),
    (EventName.TOUCHED, "touched"),
    (EventName.BURIED, "buried"),
    (EventName.KICKED, "kicked"),
    (EventName.DELETED, "deleted"),
)
# The measures, each with p50/p95/p99 and a sample count column: <measure>_p50 ... <measure>_n.
MEASURES: Final = ("wait_ms", "processing_ms", "lateness_ms")

# The result tables, each written as <out>/<name>/ (Parquet).
TABLES: Final = (
    "by_tube",        # tube: counts and percentiles over the whole archive
    "by_minute",      # tube, bucket_ms: the same per minute
    "by_hour",        # tube, bucket_ms: the same per hour
    "tries",          # tube, tries, jobs: how many jobs were reserved that many times
    "backlog",        # tube, bucket_ms: jobs ready/delayed/reserved/buried at the minute's end
    "failing_tubes",  # rank, tube, timed_out, buried, failures (timeouts + buries), most first
    "failing_hours",  # rank, tube, bucket_ms, timed_out, buried, failures, most first
)

# Beyond this many points a chart uses hours instead of minutes (a page stays light).
MAX_CHART_POINTS: Final = 3000
# The rows of a ranking shown in report.html (the Parquet table has them all).
MAX_RANKED_ROWS: Final = 20


# The per-job window sorts every event of the archive, so its rows are kept narrow: events and
# states travel through it as small integer codes (their index in these tuples), not as strings.
_EVENT_CODES: Final[tuple[str, ...]] = (*EventName, DISCONNECTED)
_STATE_CODES: Final = (*STATES, GONE)


def _event(name: str) -> Column:
    return F.lit(_EVENT_CODES.index(name))


def _state(state: str) -> Column:
    return F.lit(_STATE_CODES.index(state))


def _event_code(event: Column, reason: Column) -> Column:
    """The code of the event named by ``event`` (``DISCONNECTED`` for a ``timed-out`` with a
    ``reason``); null for a name this module does not know."""
    by_name = F.create_map(*[F.lit(part) for code, name in enumerate(_EVENT_CODES)
                             for part in (str(name), code)])[event]
    given_back = (event == EventName.TIMED_OUT.value) & (F.coalesce(reason, F.lit("")) != "")
    return F.when(given_back, _event(DISCONNECTED)).otherwise(by_name)


def _new_state(event: Column, delay_ms: Column) -> Column:
    """The code of the state a job is in after ``event`` (a name); null for an event that changes
    nothing."""
    delayed_or_ready = F.when(delay_ms > 0, _state(DELAYED)).otherwise(_state(READY))
    return (
        F.when(event == EventName.PUT.value, delayed_or_ready)
        # A time-out with a retry backoff (put-with backoff-ms) leaves the job delayed.
        .when(event.isin(EventName.RELEASED.value, EventName.TIMED_OUT.value), delayed_or_ready)
        .when(event.isin(EventName.PROMOTED.value, EventName.KICKED.value), _state(READY))
        .when(event.isin(EventName.RESERVED.value, EventName.TOUCHED.value), _state(RESERVED))
        .when(event == EventName.BURIED.value, _state(BURIED))
        .when(event.isin(EventName.DELETED.value, EventName.EXPIRED.value,
                         EventName.DEAD_LETTERED.value), _state(GONE))
    )


def read_archive(spark: SparkSession, *archives: str | Path) -> DataFrame:
    """The events of one archive or several (Parquet directories, partitioned by ``date`` and
    ``tube`` or not): a namespace split into shards (tubeq.store.shards) has one event stream, so
    one archive, per shard, and its jobs' ids are unique across them.

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
    frames = [spark.read.schema(f"{SPARK_DDL}, date STRING").parquet(str(archive))
              .select("stream_id", *FIELDS) for archive in archives]
    return functools.reduce(DataFrame.unionByName, frames)


def annotate(events: DataFrame) -> DataFrame:
    """Each event that changes a job's state, reduced to what the tables need of the job's life.

    Columns: tube; bucket_ms (the event's minute); event and state_after (codes: indexes in
    ``_EVENT_CODES`` and ``_STATE_CODES``); known_before (the code of the state the job's previous
    event left, null for its first event in the archive); job_tries (on the job's first event
    only: the most reservations any of its events counts); measure (the index in ``MEASURES`` of
    what the event measures, null if nothing) and value (that measure, ms).
    """
    event = F.col("event")
    time_ms = F.col("time_ms")
    state_after = F.col("state_after")
    # "<ms>-<seq>" (a bare "<ms>" has seq 0), cut without a split's regex and array.
    sid = F.col("stream_id")
    sid_seq = F.when(F.instr(sid, "-") > 0,
                     F.substring_index(F.substring_index(sid, "-", 2), "-", -1).cast("long"))
    rows = (events
            .select("tube", "id", "due_ms", "tries", "time_ms",
                    F.substring_index(sid, "-", 1).cast("long").alias("sid_ms"),
                    F.coalesce(sid_seq, F.lit(0)).alias("sid_seq"),
                    _event_code(event, F.col("reason")).alias("event"),
                    _new_state(event, F.col("delay_ms")).alias("state_after"))
            .where(state_after.isNotNull()))
    # The job id first: the sort's prefix is then a long that settles nearly every comparison,
    # where the tube (a string shared by a fiftieth of the events) settles none.
    job = Window.partitionBy("id", "tube").orderBy("sid_ms", "sid_seq")
    before = job.rowsBetween(Window.unboundedPreceding, -1)
    whole = job.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    # All in one select, so Spark evaluates them in one window operator over one sort.
    rows = rows.select(
        "tube", "event", "state_after", "time_ms", "due_ms",
        F.lag("state_after").over(job).alias("known_before"),
        F.when(F.row_number().over(job) == 1, F.max("tries").over(whole)).alias("job_tries"),
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
    processing = (event == _event(EventName.DELETED)) & (known_before == _state(RESERVED))
    lateness = event == _event(EventName.PROMOTED)
    value = (F.when(wait, time_ms - F.col("ready_since"))
             .when(processing, time_ms - F.col("reserved_since"))
             .when(lateness, time_ms - F.coalesce(own_due, F.col("delayed_until"))))
    measure = (F.when(wait, F.lit(MEASURES.index("wait_ms")))
               .when(processing, F.lit(MEASURES.index("processing_ms")))
               .when(lateness, F.lit(MEASURES.index("lateness_ms"))))
    return rows.select(
        "tube", _bucket(time_ms, MINUTE_MS).alias("bucket_ms"), "event", "known_before",
        "state_after", "job_tries",
        F.when(value.isNotNull(), measure).alias("measure"), value.alias("value"))


def _bucket(time_ms: Column, size_ms: int) -> Column:
    return F.floor(time_ms / F.lit(size_ms)).cast("long") * F.lit(size_ms)


def _keys(grain_ms: int | None) -> list[str]:
    """The grouping columns of a table per ``grain_ms`` (a bucket size; None: whole archive)."""
    return ["tube"] if grain_ms is None else ["tube", "bucket_ms"]


def _regrain(frame: DataFrame, grain_ms: int | None) -> DataFrame:
    """``frame`` (keyed by per-minute ``bucket_ms``) with its buckets widened to ``grain_ms``,
    or without them for None; rows are not yet summed."""
    if grain_ms is None:
        return frame.drop("bucket_ms")
    if grain_ms == MINUTE_MS:
        return frame
    return frame.withColumn("bucket_ms", _bucket(F.col("bucket_ms"), grain_ms))


def _summed(frame: DataFrame, keys: Sequence[str], summed: Sequence[str]) -> DataFrame:
    return frame.groupBy(*keys).agg(*[F.sum(column).alias(column) for column in summed])


def _with_all_tubes(per_tube: DataFrame, keys: Sequence[str], summed: Sequence[str]) -> DataFrame:
    """``per_tube`` (one row per ``keys``) and the sums of ``summed`` over every tube, as tube
    ``ALL_TUBES``: summed from the per-tube rows, not from the events again.

    Grouping by the literal keeps the aggregate a grouped one: no rows from no rows.
    """
    rest = [key for key in keys if key != "tube"]
    all_tubes = (per_tube.groupBy(F.lit(ALL_TUBES).alias("tube"), *rest)
                 .agg(*[F.sum(column).alias(column) for column in summed]))
    return per_tube.unionByName(all_tubes)


def _minute_flows(facts: DataFrame) -> DataFrame:
    """Per tube and minute: each counted event's count, and each state's net change
    ``d_<state>`` (jobs that entered it minus jobs that left it)."""
    event = F.col("event")
    counts = [F.count(F.when(event == _event(name), 1)).alias(column) for name, column in COUNTED]
    # A job's first event in the archive only adds it: it was in no count before.
    deltas = [(F.count(F.when(F.col("state_after") == _state(state), 1))
               - F.count(F.when(F.col("known_before") == _state(state), 1))).alias(f"d_{state}")
              for state in STATES]
    return facts.groupBy("tube", "bucket_ms").agg(*counts, *deltas)


# ---------------------------------------------------------------------------------------------
# Exact percentiles, every grain from one pass over the samples. Spark hands each group to a
# Python worker as Arrow columns; numpy sorts it and reads the ranks off. The groups are bounded:
# an hour of samples (every tube's minutes and hour, and the same for all tubes together), or one
# tube's histogram of distinct values over the whole archive.
# ---------------------------------------------------------------------------------------------

# What the grouped functions return, one row per tube (or "*"), grain, bucket and measure: grain
# is MINUTE_MS, HOUR_MS or 0 (the whole archive, bucket_ms 0); p<i> is PERCENTILES[i].
_FIGURES: Final = ("tube STRING, grain BIGINT, bucket_ms BIGINT, measure INT, n BIGINT, "
                   + ", ".join(f"p{index} DOUBLE" for index in range(len(PERCENTILES))))
_WHOLE_ARCHIVE: Final = 0
_MINUTES_PER_HOUR: Final = HOUR_MS // MINUTE_MS


def exact_percentiles(key: NDArray[np.int64], value: NDArray[np.int64],
                      weight: NDArray[np.int64]
                      ) -> tuple[NDArray[np.int64], NDArray[np.int64], list[NDArray[np.float64]]]:
    """Per distinct ``key`` (ascending): the samples' count and their ``PERCENTILES``, where each
    ``value`` counts ``weight`` times.

    Linear interpolation between the two nearest ranks, as ``numpy.percentile``'s default: at
    position ``(n - 1) * fraction`` between 0-based ranks ``lo`` and ``hi``,
    ``v[lo] + (v[hi] - v[lo]) * (position - lo)``.
    """
    if len(key) == 0:
        return key, key, [np.zeros(0) for _ in PERCENTILES]
    order = np.lexsort((value, key))
    key, value, weight = key[order], value[order], weight[order]
    running = np.cumsum(weight)
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    earlier = (running - weight)[first]  # the weight of the groups before each group
    counts = np.add.reduceat(weight, first)
    figures = []
    for fraction in PERCENTILES:
        position = (counts - 1) * fraction
        low, high = np.floor(position), np.ceil(position)
        # A group's sample at rank r is its first whose running weight passes r.
        at_low = value[np.searchsorted(running, earlier + low, side="right")]
        at_high = value[np.searchsorted(running, earlier + high, side="right")]
        figures.append(at_low + (at_high - at_low) * (position - low))
    return key[first], counts, figures


def _figures_table(tubes: Any, grain: int, bucket_ms: NDArray[np.int64],
                   measure: NDArray[np.int64], counts: NDArray[np.int64],
                   figures: Sequence[NDArray[np.float64]]) -> Any:
    """An Arrow table of ``_FIGURES`` rows (``tubes``: an Arrow string array)."""
    import pyarrow as pa  # type: ignore[import-untyped]

    columns = {"tube": tubes, "grain": pa.array(np.full(len(counts), grain, np.int64)),
               "bucket_ms": pa.array(bucket_ms, pa.int64()),
               "measure": pa.array(measure, pa.int32()), "n": pa.array(counts, pa.int64())}
    for index, figure in enumerate(figures):
        columns[f"p{index}"] = pa.array(figure, pa.float64())
    return pa.table(columns)


def _minute_and_hour_figures(samples: Any) -> Any:
    """The figures of one hour's samples (an Arrow table: tube, bucket_ms (a minute of that hour),
    measure, value): per tube and minute, tube and hour, and the same for all tubes together."""
    import pyarrow as pa

    tube = samples.column("tube").combine_chunks().dictionary_encode()
    names = pa.concat_arrays([tube.dictionary, pa.array([ALL_TUBES])])
    own = tube.indices.to_numpy().astype(np.int64)
    every = np.full_like(own, len(names) - 1)  # "*": the index after the last tube
    minute_ms = samples.column("bucket_ms").to_numpy()
    hour_ms = int(minute_ms[0]) // HOUR_MS * HOUR_MS
    measure = samples.column("measure").to_numpy().astype(np.int64)
    value = samples.column("value").to_numpy()
    ones = np.ones_like(value)
    tables = []
    for grain, slot in ((MINUTE_MS, (minute_ms - hour_ms) // MINUTE_MS),
                        (HOUR_MS, np.zeros_like(minute_ms))):
        for who in (own, every):
            # One integer key per (tube, minute of the hour, measure).
            key = (who * _MINUTES_PER_HOUR + slot) * len(MEASURES) + measure
            keys, counts, figures = exact_percentiles(key, value, ones)
            bucket = hour_ms + keys // len(MEASURES) % _MINUTES_PER_HOUR * grain
            tables.append(_figures_table(
                names.take(pa.array(keys // len(MEASURES) // _MINUTES_PER_HOUR)), grain, bucket,
                keys % len(MEASURES), counts, figures))
    return pa.concat_tables(tables)


def _whole_archive_figures(histogram: Any) -> Any:
    """The figures of one tube (or "*") over the whole archive, from its histogram (an Arrow
    table: tube, measure, value, n; one row per distinct value)."""
    import pyarrow as pa

    measure = histogram.column("measure").to_numpy().astype(np.int64)
    keys, counts, figures = exact_percentiles(measure, histogram.column("value").to_numpy(),
                                              histogram.column("n").to_numpy())
    tubes = pa.array([histogram.column("tube")[0].as_py()] * len(keys), pa.string())
    return _figures_table(tubes, _WHOLE_ARCHIVE, np.zeros_like(keys), keys, counts, figures)


def _samples(facts: DataFrame) -> DataFrame:
    return (facts.where(F.col("measure").isNotNull())
            .select("tube", "bucket_ms", "measure", "value"))


def _bucket_figures(facts: DataFrame) -> DataFrame:
    """``_FIGURES`` per minute and per hour, every tube and all tubes: one pass, grouped by hour."""
    return (_samples(facts).withColumn("hour_ms", _bucket(F.col("bucket_ms"), HOUR_MS))
            .groupBy("hour_ms").applyInArrow(_minute_and_hour_figures, _FIGURES))


def _archive_figures(facts: DataFrame) -> DataFrame:
    """``_FIGURES`` over the whole archive, per tube and all tubes, from histograms (their size is
    the number of distinct values, whatever the archive's length)."""
    per_tube = _samples(facts).groupBy("tube", "measure", "value").agg(F.count("*").alias("n"))
    every = (per_tube.groupBy(F.lit(ALL_TUBES).alias("tube"), "measure", "value")
             .agg(F.sum("n").alias("n")))
    return (per_tube.unionByName(every).groupBy("tube")
            .applyInArrow(_whole_archive_figures, _FIGURES))


def _percentiles(figures: DataFrame, grain_ms: int | None) -> DataFrame:
    """``<measure>_n`` and ``<measure>_p50`` ... per tube (and bucket) of ``grain_ms``, from
    ``_FIGURES`` rows; a measure with no samples there has no figures (null)."""
    keys = _keys(grain_ms)
    chosen = figures.where(F.col("grain") == F.lit(grain_ms or _WHOLE_ARCHIVE))
    columns = []
    for index, measure in enumerate(MEASURES):
        mine = F.col("measure") == F.lit(index)
        columns.append(F.max(F.when(mine, F.col("n"))).alias(f"{measure}_n"))
        columns.extend(F.max(F.when(mine, F.col(f"p{position}")))
                       .alias(f"{measure}_p{round(fraction * 100)}")
                       for position, fraction in enumerate(PERCENTILES))
    return chosen.groupBy(*keys).agg(*columns)


def _counts(flows: DataFrame, grain_ms: int | None) -> DataFrame:
    """Event counts per tube (and bucket of ``grain_ms``), all tubes included."""
    counted = [column for _, column in COUNTED]
    keys = _keys(grain_ms)
    per_tube = _summed(_regrain(flows.select("tube", "bucket_ms", *counted), grain_ms), keys,
                       counted)
    return _with_all_tubes(per_tube, keys, counted)


def _metrics(flows: DataFrame, figures: DataFrame, grain_ms: int | None) -> DataFrame:
    """Event counts and the measures' sample counts and percentiles per tube (and bucket)."""
    keys = _keys(grain_ms)
    percentiles = _percentiles(figures, grain_ms)
    counts = _counts(flows, grain_ms)
    samples = [F.coalesce(F.col(f"{measure}_n"), F.lit(0)).cast("long").alias(f"{measure}_n")
               for measure in MEASURES]
    shares = [f"{measure}_p{round(fraction * 100)}"
              for measure in MEASURES for fraction in PERCENTILES]
    return (counts.join(percentiles, keys, "left")
            .select(*keys, *[column for _, column in COUNTED], *samples, *shares)
            .orderBy(*keys))


def _tries(facts: DataFrame) -> DataFrame:
    per_tube = (facts.where(F.col("job_tries").isNotNull())
                .groupBy("tube", F.col("job_tries").alias("tries"))
                .agg(F.count("*").alias("jobs")))
    return _with_all_tubes(per_tube, ["tube", "tries"], ["jobs"]).orderBy("tube", "tries")


def _backlog(flows: DataFrame) -> DataFrame:
    """Jobs per state at the end of each minute, every minute from the first to the last."""
    spark = flows.sparkSession
    deltas = [f"d_{state}" for state in STATES]
    per_minute = _with_all_tubes(flows.select("tube", "bucket_ms", *deltas),
                                 ["tube", "bucket_ms"], deltas)
    bounds = flows.agg(F.min("bucket_ms").alias("lo"), F.max("bucket_ms").alias("hi")).first()
    if bounds is None or bounds["lo"] is None:
        return spark.createDataFrame(
            [], "tube STRING, bucket_ms BIGINT, "
            + ", ".join(f"{state} BIGINT" for state in STATES) + ", total BIGINT")
    minutes = spark.range(int(bounds["lo"]) // MINUTE_MS, int(bounds["hi"]) // MINUTE_MS + 1)
    grid = (per_minute.select("tube").distinct()
            .crossJoin(minutes.select((F.col("id") * F.lit(MINUTE_MS)).alias("bucket_ms")))
            .join(per_minute, ["tube", "bucket_ms"], "left").fillna(0))
    running = Window.partitionBy("tube").orderBy("bucket_ms").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    out = grid.select("tube", "bucket_ms", *[
        F.sum(f"d_{state}").over(running).cast("long").alias(state) for state in STATES])
    total = F.lit(0).cast("long")
    for state in STATES:
        total = total + F.col(state)
    return out.withColumn("total", total).orderBy("tube", "bucket_ms")


def _ranked(counts: DataFrame, keys: Sequence[str]) -> DataFrame:
    failing = (counts.where(F.col("tube") != ALL_TUBES)
               .select(*keys, "timed_out", "buried",
                       (F.col("timed_out") + F.col("buried")).alias("failures"))
               .where(F.col("failures") > 0))
    order = Window.orderBy(F.col("failures").desc(), *[F.col(key) for key in keys])
    return (failing.withColumn("rank", F.row_number().over(order))
            .select("rank", *keys, "timed_out", "buried", "failures").orderBy("rank"))


def build_report(events: DataFrame) -> dict[str, DataFrame]:
    """Every result table of the report (``TABLES``) from a DataFrame of lifecycle events.

    Three intermediates are cached (the annotated events, narrowed to what the tables read;
    their per-minute flows; the per-minute and per-hour percentiles), so the per-job window runs
    once whatever is written; call :func:`release` on the result when done with it.
    """
    facts = annotate(events).persist()
    flows = _minute_flows(facts).persist()
    figures = _bucket_figures(facts).persist()
    return {
        "by_tube": _metrics(flows, _archive_figures(facts), None),
        "by_minute": _metrics(flows, figures, MINUTE_MS),
        "by_hour": _metrics(flows, figures, HOUR_MS),
        "tries": _tries(facts),
        "backlog": _backlog(flows),
        "failing_tubes": _ranked(_counts(flows, None), ["tube"]),
        "failing_hours": _ranked(_counts(flows, HOUR_MS), ["tube", "bucket_ms"]),
        "_facts": facts,
        "_flows": flows,
        "_figures": figures,
    }


def release(tables: Mapping[str, DataFrame]) -> None:
    """Drop what :func:`build_report` cached (its entries whose names start with ``_``)."""
    for name, frame in tables.items():
        if name.startswith("_"):
            frame.unpersist()


def write_report(tables: Mapping[str, DataFrame], out_dir: str | Path) -> Path:
    """Write each table as ``<out_dir>/<name>/`` Parquet and the page; returns the page's path.

    The tables are written from their cached inputs once each; the page is built from the
    written Parquet (small: rows per tube and minute), so it shows exactly what the tables hold.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spark: SparkSession | None = None
    for name in TABLES:
        frame = tables[name]
        spark = frame.sparkSession
        frame.coalesce(1).write.mode("overwrite").parquet(str(out / name))
    assert spark is not None
    written = {name: [row.asDict() for row in spark.read.parquet(str(out / name)).collect()]
               for name in TABLES}
    page = out / "report.html"
    page.write_text(render_html(written), encoding="utf-8")
    return page


# ---------------------------------------------------------------------------------------------
# report.html: one file, no network. The tables are rendered here; the charts are drawn in the
# browser from the embedded JSON by the small script below, which marks <body data-rendered="N">
# when its N charts are drawn (what the browser test waits for).
# ---------------------------------------------------------------------------------------------

_CHART_SCRIPT: Final = r"""
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"];
  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function label(ms) { return new Date(ms).toISOString().slice(5, 16).replace("T", " "); }
  function draw(svg, chart) {
    const W = 760, H = 260, L = 60, R = 10, T = 10, B = 40;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    const xs = chart.x;
    let top = 0;
    chart.series.forEach(s => s.values.forEach(v => { if (v !== null && v > top) top = v; }));
    if (top === 0) top = 1;
    const x0 = xs.length ? xs[0] : 0, x1 = xs.length > 1 ? xs[xs.length - 1] : x0 + 1;
    const px = v => L + (W - L - R) * (v - x0) / (x1 - x0);
    const py = v => H - B - (H - T - B) * v / top;
    el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#444", class: "axis"}, svg);
    el("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#444", class: "axis"}, svg);
    for (let i = 0; i <= 4; i++) {
      const v = top * i / 4;
      el("text", {x: L - 4, y: py(v) + 4, "text-anchor": "end", "font-size": 10}, svg)
        .textContent = Number.isInteger(v) ? v : v.toFixed(1);
    }
    [x0, x1].forEach((v, i) => {
      el("text", {x: px(v), y: H - B + 14, "text-anchor": i ? "end" : "start",
                  "font-size": 10}, svg).textContent = label(v);
    });
    chart.series.forEach((s, i) => {
      const points = [];
      s.values.forEach((v, j) => { if (v !== null) points.push(px(xs[j]) + "," + py(v)); });
      el("polyline", {points: points.join(" "), fill: "none", stroke: COLORS[i % 5],
                      "stroke-width": 1.5, class: "series", "data-name": s.name}, svg);
      el("rect", {x: L + 10 + i * 120, y: H - 16, width: 10, height: 10,
                  fill: COLORS[i % 5]}, svg);
      el("text", {x: L + 24 + i * 120, y: H - 7, "font-size": 11}, svg).textContent = s.name;
    });
    svg.setAttribute("data-points", String(xs.length));
  }
  let drawn = 0;
  data.charts.forEach(chart => {
    const svg = document.getElementById(chart.id);
    if (svg) { draw(svg, chart); drawn++; }
  });
  document.body.setAttribute("data-rendered", String(drawn));
})();
"""

_STYLE: Final = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
svg.chart { width: 100%; max-width: 760px; height: auto; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.note { color: #666; font-size: 0.85em; }
"""


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.1f}"
    return str(value)


def _utc(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], table_id: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column)
            text = _utc(value) if column == "bucket_ms" and value is not None else _fmt(value)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table id="{table_id}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _series(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[dict[str, Any]]:
    return [{"name": column, "values": [row.get(column) for row in rows]} for column in columns]


def render_html(tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """The self-contained page from the tables' rows (as dicts); no external resource."""
    def all_tubes(name: str) -> list[Mapping[str, Any]]:
        rows = [row for row in tables[name] if row["tube"] == ALL_TUBES]
        return sorted(rows, key=lambda row: int(row["bucket_ms"]))

    grain, throughput = "minute", all_tubes("by_minute")
    if len(throughput) > MAX_CHART_POINTS:
        grain, throughput = "hour", all_tubes("by_hour")
    backlog = all_tubes("backlog")
    if len(backlog) > MAX_CHART_POINTS:
        step = math.ceil(len(backlog) / MAX_CHART_POINTS)
        backlog = backlog[step - 1::step]
    charts = [
        {"id": "chart-throughput", "x": [row["bucket_ms"] for row in throughput],
         "series": _series(throughput, ["put", "reserved", "deleted"])},
        {"id": "chart-wait", "x": [row["bucket_ms"] for row in throughput],
         "series": _series(throughput, ["wait_ms_p50", "wait_ms_p95", "wait_ms_p99"])},
        {"id": "chart-backlog", "x": [row["bucket_ms"] for row in backlog],
         "series": _series(backlog, [*STATES, "total"])},
    ]
    payload = json.dumps({"charts": charts}).replace("</", "<\\/")
    by_tube = sorted(tables["by_tube"], key=lambda row: (row["tube"] != ALL_TUBES, row["tube"]))
    tries = sorted((row for row in tables["tries"] if row["tube"] == ALL_TUBES),
                   key=lambda row: int(row["tries"]))
    metric_columns = ["tube", *[column for _, column in COUNTED]] + [
        f"{measure}_p{round(fraction * 100)}" for measure in MEASURES for fraction in PERCENTILES]
    failing_tubes = sorted(tables["failing_tubes"], key=lambda row: int(row["rank"]))
    failing_hours = sorted(tables["failing_hours"], key=lambda row: int(row["rank"]))
    total = next((row for row in by_tube if row["tube"] == ALL_TUBES), {})
    span = ""
    if throughput:
        span = (f"{_utc(throughput[0]['bucket_ms'])} to {_utc(throughput[-1]['bucket_ms'])} "
                "UTC, ")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>tubeq report</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>tubeq report</h1>",
        f'<p class="note">{html.escape(span)}{_fmt(total.get("put", 0))} jobs put, '
        f'{_fmt(total.get("deleted", 0))} deleted, {len(by_tube) - 1 if by_tube else 0} tubes. '
        "Times in milliseconds; percentiles are exact. Tube * is all tubes together.</p>",
        f"<h2>Throughput per {grain} (all tubes)</h2>",
        '<svg class="chart" id="chart-throughput" role="img"></svg>',
        f"<h2>Queue wait per {grain}, ms (ready to reserved; all tubes)</h2>",
        '<svg class="chart" id="chart-wait" role="img"></svg>',
        "<h2>Backlog at the end of each minute (all tubes)</h2>",
        '<svg class="chart" id="chart-backlog" role="img"></svg>',
        "<h2>Per tube</h2>",
        _table(by_tube, metric_columns, "table-by-tube"),
        '<p class="note">timed_out: TTR time-outs (the server\'s job-timeouts); disconnected: '
        "jobs given back because their connection closed or their process died, not "
        "failures.</p>",
        "<h2>Tubes that fail most (timeouts + buries)</h2>",
        _table(failing_tubes[:MAX_RANKED_ROWS], ["rank", "tube", "timed_out", "buried",
                                                 "failures"], "table-failing-tubes"),
        "<h2>Hours that fail most</h2>",
        _table(failing_hours[:MAX_RANKED_ROWS], ["rank", "tube", "bucket_ms", "timed_out",
                                                 "buried", "failures"], "table-failing-hours"),
        "<h2>Tries per job (all tubes)</h2>",
        _table(tries, ["tries", "jobs"], "table-tries"),
        f'<script type="application/json" id="report-data">{payload}</script>',
        f"<script>{_CHART_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Command line: `tubeq-pipeline report --archive DIR --out DIR`.
# ---------------------------------------------------------------------------------------------


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``report`` subcommand's own arguments (the dispatcher adds --master/--remote)."""
    parser.add_argument("--archive", required=True, nargs="+", metavar="DIR",
                        help="the archive's Parquet directory; several: one report over all "
                             "(a split namespace's shards, archived one by one)")
    parser.add_argument("--out", required=True, help="where the tables and report.html go")


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
        spark = spark_session(getattr(args, "master", None), getattr(args, "remote", None),
                              jvm_log=getattr(args, "jvm_log", None))
    events = read_archive(spark, *archives)
    if events.isEmpty():
        raise PipelineError(f"no events to report: --archive {' '.join(archives)} holds no "
                            "events")
    tables = build_report(events)
    try:
        page = write_report(tables, args.out)
    finally:
        release(tables)
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
