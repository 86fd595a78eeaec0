"""Live per-tube rates: ``tubeq-pipeline tail``, a streaming query straight over the event stream.

Owns the rates query: events per tube and per event name in short tumbling windows of event
time (``time_ms``), read by the ``tubeq`` source from the live stream without archiving, and
printed to the console as each micro-batch updates them (or kept in a memory table, for tests
and notebooks). It stops by itself after ``--seconds`` or ``--batches``, or on ^C.

Rules: the windows are of event time with a watermark of ``--late`` seconds, so the state a long
tail keeps stays bounded (windows older than the watermark are final and dropped); output mode
``update`` prints only the windows a batch changed, as one table per micro-batch sorted by
window, tube and event (a stable order to read and to diff), and a batch that changed none (one
that only moved the watermark) prints nothing. The table is printed where the driver runs: with
``--remote``, on the Spark Connect server. By default it starts at the stream's end
(``latest``): a tail shows what happens from now on; ``--from-start`` reads the whole stream.
Offsets are not kept (a temporary checkpoint): a tail is a view, the archive is the record.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from tubeq.pipeline.archive import check_source, source_error
from tubeq.pipeline.session import naming_log, spark_session
from tubeq.pipeline.source import NAME, register
from tubeq.pipeline.streaming import add_stream_arguments, follow, stream_options

DEFAULT_WINDOW_S: Final = 10
DEFAULT_LATE_S: Final = 60
DEFAULT_INTERVAL_S: Final = 2.0
# The printed table's columns, and the ones its rows are sorted by.
RATE_COLUMNS: Final = ("window_start", "tube", "event", "events", "per_second")
RATE_ORDER: Final = ("window_start", "tube", "event")
_RIGHT_ALIGNED: Final = frozenset({"events", "per_second"})


def rates(events: DataFrame, window_s: int, late_s: int) -> DataFrame:
    """Events per (window, tube, event) with each window's rate in events per second."""
    at = F.timestamp_millis(F.col("time_ms"))
    return (events.withColumn("at", at)
            .withWatermark("at", f"{late_s} seconds")
            .groupBy(F.window("at", f"{window_s} seconds"), "tube", "event")
            .agg(F.count(F.lit(1)).alias("events"))
            .select(F.col("window.start").alias("window_start"), "tube", "event", "events",
                    (F.col("events") / F.lit(float(window_s))).alias("per_second")))


def format_rates(batch_id: int, rows: Sequence[Sequence[object]]) -> str | None:
    """The rows a micro-batch updated (``RATE_COLUMNS``, already in ``RATE_ORDER``) as a text
    table under a ``batch N`` line; None when there are none (no empty table is printed)."""
    if not rows:
        return None
    cells = [list(RATE_COLUMNS)] + [[_cell(value) for value in row] for row in rows]
    widths = [max(len(line[column]) for line in cells) for column in range(len(RATE_COLUMNS))]
    right = [column in _RIGHT_ALIGNED for column in RATE_COLUMNS]
    lines = ["  ".join(cell.rjust(width) if to_right else cell.ljust(width)
                       for cell, width, to_right in zip(line, widths, right, strict=True))
             .rstrip() for line in cells]
    return "\n".join([f"batch {batch_id}", *lines])


def _cell(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def print_rates(batch: DataFrame, batch_id: int) -> None:
    """``foreachBatch`` of the console tail: print what ``batch`` updated, sorted, if anything."""
    rows = (batch.orderBy(*RATE_ORDER)
            .select(F.date_format("window_start", "yyyy-MM-dd HH:mm:ss").alias("window_start"),
                    *RATE_COLUMNS[1:])
            .collect())
    text = format_rates(batch_id, [tuple(row) for row in rows])
    if text is not None:
        print(text, flush=True)


def start_tail(spark: SparkSession, options: dict[str, str], window_s: int, late_s: int,
               sink: str, query_name: str, interval_s: float) -> StreamingQuery:
    """Start the rates query into ``sink``: ``console`` (sorted tables on stdout, see
    :func:`print_rates`) or ``memory`` (a table named ``query_name``)."""
    register(spark)
    reader = spark.readStream.format(NAME)
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = (rates(reader.load(), window_s, late_s).writeStream.outputMode("update")
              .queryName(query_name).trigger(processingTime=f"{interval_s} seconds"))
    writer = writer.foreachBatch(print_rates) if sink == "console" else writer.format(sink)
    return writer.start()


def add_tail_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``tail`` subcommand's own arguments (the dispatcher adds --master/--remote)."""
    add_stream_arguments(parser)
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW_S,
                        help=f"window length in seconds (default {DEFAULT_WINDOW_S})")
    parser.add_argument("--late", type=int, default=DEFAULT_LATE_S,
                        help=f"how late (s) an event may arrive and still count "
                             f"(default {DEFAULT_LATE_S})")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S,
                        help=f"seconds between updates (default {DEFAULT_INTERVAL_S:g})")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--batches", type=int, default=None,
                        help="stop after this many micro-batches that read events")
    parser.add_argument("--from-start", action="store_true",
                        help="read the whole stream (default: from its end)")
    parser.add_argument("--sink", choices=("console", "memory"), default="console",
                        help="console (default) or a memory table named by --query-name")
    parser.add_argument("--query-name", default="tubeq_tail",
                        help="the query's name (the memory table's name)")


def run_tail(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Run ``tubeq-pipeline tail`` until --seconds or --batches; 1 if the query failed (its
    reason on stderr)."""
    options = {**stream_options(args), "startingId": "earliest" if args.from_start else "latest",
               "onGap": "continue"}  # a view goes on past a trim; the archive is the record
    check_source(options, getattr(args, "remote", None))
    jvm_log = getattr(args, "jvm_log", None)
    if spark is None:
        spark = spark_session(getattr(args, "master", None), getattr(args, "remote", None),
                              "tubeq-tail", jvm_log=jvm_log)
    query = start_tail(spark, options, args.window, args.late, args.sink, args.query_name,
                       args.interval)
    error = follow(query, args.seconds, args.batches).error
    if error is not None:
        print(naming_log(f"tail: failed: {source_error(str(error))}", jvm_log),
              file=sys.stderr, flush=True)
        return 1
    return 0
