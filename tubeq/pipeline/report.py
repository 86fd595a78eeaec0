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
  server counts in ``job-timeouts``. A ``timed-out`` with a reason gave the job back without its
  TTR running out: ``disconnected`` (reason ``disconnect``: its connection closed) and
  ``reaped`` (the process holding it died) count those, and neither is a failure.
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

Entry points: :func:`build_report` (DataFrames in, DataFrames out), :func:`write_report`
(Parquet tables and ``report.html`` under a directory) and :func:`run_report`, which the
``tubeq-pipeline report`` command calls.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from tubeq.model.events import FIELDS, INT_FIELDS, LATER_FIELDS, SPARK_DDL, EventName
from tubeq.pipeline.layout import is_old_format, local_path, old_format_error
from tubeq.pipeline.page import render_html
from tubeq.pipeline.session import PipelineError, spark_session
from tubeq.pipeline.tables import (
    ALL_TUBES,
    BURIED,
    BURIED_EXPIRED,
    BURIED_MAX_TRIES,
    COUNTED,
    COUNTED_COLUMNS,
    DELAYED,
    DISCONNECTED,
    FINISHED,
    HOUR_MS,
    MEASURES,
    MINUTE_MS,
    PERCENTILES,
    READY,
    REAPED,
    RESERVED,
    STATES,
    SUMMED,
    TABLES,
)

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
    # "<ms>-<seq>" (a bare "<ms>" has seq 0), cut without a split's regex and array.
    sid = F.col("stream_id")
    sid_seq = F.when(F.instr(sid, "-") > 0,
                     F.substring_index(F.substring_index(sid, "-", 2), "-", -1).cast("long"))
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
    processing = (event.isin(_event(EventName.DELETED), _event(FINISHED))
                  & (known_before == _state(RESERVED)))
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


def counted(code: Column) -> list[Column]:
    """The aggregates of ``COUNTED_COLUMNS``, in order, over rows whose event code (from
    :func:`event_code`) is ``code``: how many of a group's events each column counts."""
    return [F.count(F.when(code.isin(*[_EVENT_CODES.index(name) for name in names]), 1))
            .alias(column) for column, names in COUNTED]


def _minute_flows(facts: DataFrame) -> DataFrame:
    """Per tube and minute: each counted event's count, the ``SUMMED`` sums, and each state's
    net change ``d_<state>`` (jobs that entered it minus jobs that left it)."""
    # A job's first event in the archive only adds it: it was in no count before.
    deltas = [(F.count(F.when(F.col("state_after") == _state(state), 1))
               - F.count(F.when(F.col("known_before") == _state(state), 1))).alias(f"d_{state}")
              for state in STATES]
    # SUMMED, in its order: facts has a column of each, null on the events it does not apply to.
    sums = [F.coalesce(F.sum(column), F.lit(0)).cast("long").alias(column) for column in SUMMED]
    return facts.groupBy("tube", "bucket_ms").agg(*counted(F.col("event")), *sums, *deltas)


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
    """Event counts and ``SUMMED`` sums per tube (and bucket of ``grain_ms``), all tubes
    included."""
    counted = [*COUNTED_COLUMNS, *SUMMED]
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
            .select(*keys, *COUNTED_COLUMNS, *SUMMED, *samples, *shares)
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
               .select(*keys, "timed_out", "failed", "buried",
                       (F.col("timed_out") + F.col("failed") + F.col("buried"))
                       .alias("failures"))
               .where(F.col("failures") > 0))
    # One partition either way (a ranking is global; the rows are per tube or tube-hour, few),
    # named, so Spark does not warn of a window with none (a warning Spark Connect prints on
    # the user's terminal).
    order = Window.partitionBy(F.lit(0)).orderBy(F.col("failures").desc(),
                                                  *[F.col(key) for key in keys])
    return (failing.withColumn("rank", F.row_number().over(order))
            .select("rank", *keys, "timed_out", "failed", "buried", "failures")
            .orderBy("rank"))


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


def _instant_argument(text: str) -> int:
    try:
        return parse_instant(text)
    except PipelineError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


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
    since_ms, until_ms = getattr(args, "since", None), getattr(args, "until", None)
    if since_ms is not None and until_ms is not None and since_ms >= until_ms:
        raise PipelineError("--since must come before --until")
    events = read_archive(spark, *archives, since_ms=since_ms, until_ms=until_ms)
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
