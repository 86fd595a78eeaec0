"""The live table: the report's per-minute event counts, kept current as the events happen.

Owns ``tubeq-pipeline live``: a Structured Streaming query straight from the ``tubeq`` source
(``source.py``, no archive in between) that keeps, per tube and per minute of event time
(``time_ms``), the counts of the report's ``by_minute`` table (``tables.COUNTED_COLUMNS``, the
time-outs and buries split by reason with ``report.event_code``, counted by
``report.counted``), with rows for all tubes together as tube ``*``; and the one file it
keeps them in, ``<out>/by_minute_live.json``, for a dashboard or a notebook to read at any
moment.

Why a command of its own and not ``report --follow``: the report reads an archive and derives
each job's life (wait, processing, backlog) with a window over all of a job's events, which a
stream cannot keep; the counts need no job history, only a tumbling minute, so they stream with
state bounded by a watermark. Why one file rewritten whole: a reader wants the last minutes as
one small table (tubes x ``--keep-minutes`` rows), not a folder of appended parts to merge, and
a file replaced by ``os.replace`` is seen whole by a reader that opens it once. Why JSON, not
Parquet like the report's tables: Parquet is read in pieces (footer, then pages), and some
readers open the file again between them: ``pyarrow.parquet.read_table(path)`` failed on 82 of
1,932 reads (a footer of one version, the pages of the next) while a writer replaced a small
file in a loop this way, where ``pandas.read_parquet`` and ``ParquetFile`` did not. A JSON
document is read whole in one open (a browser's ``fetch``, ``json.load``, then
``pandas.DataFrame(doc["rows"])``), and a few thousand rows are small.

Rules:

* State is bounded by a watermark of ``--late`` seconds on event time: a minute's counts are
  final once the newest event seen is ``--late`` seconds past its end, and Spark drops its state
  then; an event later than that is not counted.
* Output mode ``update``: each micro-batch brings the (tube, minute) rows it changed, each with
  its whole count so far, which replace the ones held in the driver (so a batch run twice
  changes nothing). The driver keeps the last ``--keep-minutes`` minutes, counted back from the
  newest minute seen (event time, as the watermark), sums them into the ``*`` rows, and after
  every micro-batch writes the table to a hidden temporary file in ``--out`` and renames it over
  the old one. A reader therefore sees the previous table or the new one, never part of one.
  The document: ``{"batch_id": N, "written_ms": MS, "keep_minutes": N, "columns": COLUMNS,
  "rows": [{"tube": ..., "bucket_ms": ..., "put": ..., ...}, ...]}``, rows by tube then minute.
  A (tube, minute) with no events has no row (as in ``by_minute``); before any event, ``rows``
  is empty (``columns`` still names them).
* Offsets are not kept (a temporary checkpoint): each start rebuilds the table from the stream,
  reading from the start of the minute ``--keep-minutes`` before now, so its minutes are whole.
  A trim of the stream (``onGap=continue``) is logged, not fatal: the archive is the record.
* It stops after ``--seconds`` or ``--batches``, on ^C, or with ``--once`` when it has read what
  the stream holds (Trigger.AvailableNow); the file stays, as last written.
* The table is written where the driver runs: this process, or with ``--remote`` the Spark
  Connect server (``--out`` is then a path there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from tubeq.pipeline.archive import check_source, source_error
from tubeq.pipeline.report import counted, event_code
from tubeq.pipeline.session import PipelineError, naming_log, spark_session
from tubeq.pipeline.source import NAME, register
from tubeq.pipeline.streaming import add_stream_arguments, follow, stream_options
from tubeq.pipeline.tables import ALL_TUBES, COUNTED_COLUMNS, MINUTE_MS

LIVE_TABLE: Final = "by_minute_live.json"
COLUMNS: Final = ("tube", "bucket_ms", *COUNTED_COLUMNS)
DEFAULT_KEEP_MINUTES: Final = 60
# A stream's events are in time order as far as one tubeq process's clock goes; several processes
# serving one namespace write its stream with their own clocks: two minutes leave room for their
# skew.
DEFAULT_LATE_S: Final = 120
DEFAULT_INTERVAL_S: Final = 5.0


def minute_counts(events: DataFrame, late_s: int) -> DataFrame:
    """Per tube and minute of ``time_ms`` (``bucket_ms``, the minute's start): the report's
    ``COUNTED_COLUMNS``, with a watermark of ``late_s`` seconds bounding the state."""
    at = F.timestamp_millis(F.col("time_ms"))
    return (events.select("tube", at.alias("at"),
                          event_code(F.col("event"), F.col("reason")).alias("code"))
            .withWatermark("at", f"{late_s} seconds")
            .groupBy(F.window("at", f"{MINUTE_MS // 1000} seconds"), "tube")
            .agg(*counted(F.col("code")))
            .select("tube", F.unix_millis(F.col("window.start")).alias("bucket_ms"),
                    *COUNTED_COLUMNS))


class LiveTable:
    """The last ``keep_minutes`` minutes of counts, held in the driver and written to ``path``
    whole after every micro-batch (the query's ``foreachBatch``)."""

    def __init__(self, path: Path, keep_minutes: int) -> None:
        self.path = path
        self.keep_minutes = keep_minutes
        self.counts: dict[tuple[str, int], tuple[int, ...]] = {}
        self.newest_ms: int | None = None
        # Set when a write failed: the one line the command prints.
        self.failure: str | None = None

    def update(self, rows: Iterable[Sequence[Any]]) -> None:
        """Take rows of ``tube, bucket_ms, *COUNTED_COLUMNS`` (whole counts, which replace what
        is held) and drop the minutes that fell out of the kept window."""
        for tube, bucket_ms, *counts in rows:
            self.counts[(str(tube), int(bucket_ms))] = tuple(int(count) for count in counts)
            if self.newest_ms is None or bucket_ms > self.newest_ms:
                self.newest_ms = int(bucket_ms)
        if self.newest_ms is not None:
            oldest_kept = self.newest_ms - (self.keep_minutes - 1) * MINUTE_MS
            for key in [key for key in self.counts if key[1] < oldest_kept]:
                del self.counts[key]

    def rows(self) -> list[tuple[Any, ...]]:
        """Every tube's rows and the ``*`` rows (their sums per minute), by tube and minute."""
        every: dict[int, list[int]] = {}
        for (_, bucket_ms), counts in self.counts.items():
            sums = every.setdefault(bucket_ms, [0] * len(COUNTED_COLUMNS))
            for index, count in enumerate(counts):
                sums[index] += count
        rows = [(tube, bucket_ms, *counts) for (tube, bucket_ms), counts in self.counts.items()]
        rows += [(ALL_TUBES, bucket_ms, *sums) for bucket_ms, sums in every.items()]
        return sorted(rows, key=lambda row: (row[0], row[1]))

    def write(self, batch_id: int) -> None:
        """Replace the file with the table as held now (a hidden temporary file, renamed)."""
        document = {"batch_id": batch_id, "written_ms": int(time.time() * 1000),
                    "keep_minutes": self.keep_minutes, "columns": COLUMNS,
                    "rows": [dict(zip(COLUMNS, row, strict=True)) for row in self.rows()]}
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(temporary, "w", encoding="utf-8") as sink:
                json.dump(document, sink, separators=(",", ":"))
            os.replace(temporary, self.path)
        except OSError as exc:
            self.failure = f"cannot write {self.path}: {exc.strerror or exc}"
            raise
        finally:
            temporary.unlink(missing_ok=True)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """``foreachBatch``: take the rows the micro-batch changed, then write the table."""
        self.update(tuple(row) for row in batch.collect())
        self.write(batch_id)


def read_live(path: str | Path) -> dict[str, Any]:
    """The live table's document at ``path`` (the file, or the ``--out`` directory holding it),
    read in one open."""
    path = Path(path)
    if path.is_dir():
        path = path / LIVE_TABLE
    with open(path, encoding="utf-8") as source:
        document: dict[str, Any] = json.load(source)
    return document


def start_live(spark: SparkSession, options: dict[str, str], table: LiveTable, late_s: int,
               interval_s: float, once: bool) -> StreamingQuery:
    """Start the live query into ``table`` (AvailableNow when ``once``, else every
    ``interval_s`` seconds)."""
    register(spark)
    reader = spark.readStream.format(NAME)
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = (minute_counts(reader.load(), late_s).writeStream.outputMode("update")
              .queryName("tubeq-live").foreachBatch(table))
    if once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{interval_s} seconds")
    return writer.start()


def starting_id(now_ms: int, keep_minutes: int) -> str:
    """Where a run starts reading: the start of the minute ``keep_minutes`` before ``now_ms``'s
    (a bare millisecond time, which the source takes as a stream id)."""
    return str((now_ms // MINUTE_MS - keep_minutes) * MINUTE_MS)


def check_out(out: str) -> None:
    """Raise :class:`PipelineError` before Spark starts when ``out`` cannot be the directory the
    table is written in (made if missing)."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise PipelineError(f"--out {out}: not a directory")
    if (folder / LIVE_TABLE).is_dir():
        raise PipelineError(f"--out {out}: {LIVE_TABLE} in it is a directory, not the table")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PipelineError(f"--out {out}: cannot make it: {exc.strerror or exc}") from None


def _at_least(minimum: int, kind: type[int] | type[float] = int) -> Any:
    """An argparse type: a number of ``kind`` no smaller than ``minimum``."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= minimum:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value
    return parse


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds more than 0."""
    value = float(_at_least(0, float)(text))
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``live`` subcommand's own arguments (the dispatcher adds --master/--remote)."""
    add_stream_arguments(parser)
    parser.add_argument("--out", required=True,
                        help=f"the directory of the table ({LIVE_TABLE}; made if missing)")
    parser.add_argument("--keep-minutes", type=_at_least(1), default=DEFAULT_KEEP_MINUTES,
                        metavar="N", help=f"the table holds the last N minutes "
                                          f"(default {DEFAULT_KEEP_MINUTES})")
    parser.add_argument("--late", type=_at_least(0), default=DEFAULT_LATE_S,
                        metavar="SECONDS", help=f"how late an event may arrive and still count "
                                                f"(default {DEFAULT_LATE_S})")
    parser.add_argument("--interval", type=_seconds, default=DEFAULT_INTERVAL_S,
                        help=f"seconds between updates (default {DEFAULT_INTERVAL_S:g})")
    parser.add_argument("--once", action="store_true",
                        help="read what the stream holds now (Trigger.AvailableNow), then stop")
    parser.add_argument("--seconds", type=_seconds, default=None,
                        help="stop after this long")
    parser.add_argument("--batches", type=_at_least(1), default=None,
                        help="stop after this many micro-batches that read events")


def live_options(args: argparse.Namespace, now_ms: int) -> dict[str, str]:
    """The ``tubeq`` source's options for a run starting at ``now_ms``."""
    return {**stream_options(args), "startingId": starting_id(now_ms, args.keep_minutes),
            "onGap": "continue"}  # a view goes on past a trim; the archive is the record


def run_live(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Run ``tubeq-pipeline live`` until it is told to stop; prints what it did; 1 if the query
    failed (its reason on stderr)."""
    remote = getattr(args, "remote", None)
    options = live_options(args, int(time.time() * 1000))
    check_source(options, remote)
    if not remote:
        check_out(args.out)
    jvm_log = getattr(args, "jvm_log", None)
    if spark is None:
        spark = spark_session(getattr(args, "master", None), remote, "tubeq-live",
                              jvm_log=jvm_log)
    table = LiveTable(Path(args.out) / LIVE_TABLE, args.keep_minutes)
    query = start_live(spark, options, table, args.late, args.interval, args.once)
    followed = follow(query, args.seconds, args.batches)
    if followed.error is not None:
        reason = table.failure or source_error(str(followed.error))
        print(naming_log(f"live: failed: {reason}", jvm_log), file=sys.stderr, flush=True)
        return 1
    print(f"live: {followed.events} events in {followed.batches} batches, to {table.path}",
          flush=True)
    return 0
