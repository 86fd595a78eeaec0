"""The archive: tubeq's event stream written to Parquet exactly once, by Spark's own machinery.

Owns ``tubeq-pipeline archive``: a Structured Streaming query from the ``tubeq`` source
(``source.py``) to a Parquet sink partitioned by ``date`` (``YYYY-MM-DD`` of ``time_ms``, UTC)
and ``tube``, with a checkpoint directory. Exactly once is Spark's: the source's offsets (stream
ids) go to the checkpoint's offset log before a batch runs, the Parquet sink records each
batch's files in ``<archive>/_spark_metadata`` when it commits, and a query restarted on the
same checkpoint replays an uncommitted batch with the same offsets. A query killed halfway
leaves at most the files of its unfinished batch, which the metadata log does not list; Spark
(``report.read_archive``, ``spark.read.parquet``) reads only the listed files. Other Parquet
readers should read the listed files too.

Rules: the archive prints what it did (events, batches, gaps) from the query's own progress
reports, so the numbers are Spark's. A gap the source reports fails the run with exit status 1
and the source's message (one line on stderr), unless ``--on-gap continue``, which archives on
and prints each gap. A Redis that does not answer is said before Spark starts.
``--trim`` passes ``trimCommitted=true``: the source trims the stream up to the last batch
Spark committed (the final batch of a run is committed to the source, and trimmed, when the
next run starts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Final

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from tubeq.pipeline.session import PipelineError, naming_log, spark_session
from tubeq.pipeline.source import DEFAULT_REDIS, NAME, SourceError, ping, register

DAY_MS: Final = 86_400_000
DEFAULT_INTERVAL_S: Final = 10.0
POLL_S: Final = 1  # awaitTermination takes whole seconds


@dataclass
class ArchiveTally:
    """What a run archived, from its progress reports."""

    events: int = 0
    batches: int = 0
    gaps: list[dict[str, Any]] = field(default_factory=list)
    seen_batches: set[int] = field(default_factory=set)

    def add(self, progress: dict[str, Any]) -> list[str]:
        """Count one progress report (once per batch id); returns lines worth printing."""
        batch = int(progress["batchId"])
        if batch in self.seen_batches:
            return []
        self.seen_batches.add(batch)
        rows = int(progress.get("numInputRows", 0))
        lines = []
        sources = progress.get("sources") or []
        end = sources[0].get("endOffset") if sources else None
        offset = json.loads(end) if isinstance(end, str) else end
        gapped = isinstance(offset, dict) and bool(offset.get("gap"))
        if rows or gapped:
            self.batches += 1
            self.events += rows
        if gapped:
            assert isinstance(offset, dict)
            gap = offset["gap"]
            self.gaps.append(gap)
            lost = "an unknown number of" if gap.get("lost") is None else gap["lost"]
            lines.append(f"archive: GAP: {lost} events after {gap['after']} were deleted "
                         f"before they were archived (batch {batch})")
        return lines


# The archive's directory layout: date=YYYY-MM-DD/tube=NAME/.
ARCHIVE_PARTITIONS: Final = ("date", "tube")


def archive_frame(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    """The event stream as a streaming DataFrame with the archive's ``date`` column."""
    register(spark)
    reader = spark.readStream.format(NAME)
    for key, value in options.items():
        reader = reader.option(key, value)
    return with_archive_date(reader.load())


def with_archive_date(events: DataFrame) -> DataFrame:
    """``events`` with the archive's ``date`` partition column: the UTC day of ``time_ms``,
    whatever the session's time zone (days since the epoch, as a date)."""
    day = F.date_from_unix_date(F.floor(F.col("time_ms") / DAY_MS).cast("int"))
    return events.withColumn("date", F.date_format(day, "yyyy-MM-dd"))


def write_archive(events: DataFrame, out: str) -> None:
    """Write a batch of events (``SPARK_DDL`` columns) in the archive's layout: what the archive
    query writes, for events that come from elsewhere (generated, or read back and rewritten)."""
    (with_archive_date(events).write.mode("overwrite").partitionBy(*ARCHIVE_PARTITIONS)
     .parquet(out))


def start_archive(spark: SparkSession, options: dict[str, str], out: str, checkpoint: str,
                  once: bool, interval_s: float = DEFAULT_INTERVAL_S) -> StreamingQuery:
    """Start the archive query (AvailableNow when ``once``, else a processing-time trigger)."""
    writer = (archive_frame(spark, options).writeStream.format("parquet")
              .option("path", out).option("checkpointLocation", checkpoint)
              .partitionBy(*ARCHIVE_PARTITIONS).outputMode("append"))
    if once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{interval_s} seconds")
    return writer.queryName("tubeq-archive").start()


def source_options(args: argparse.Namespace) -> dict[str, str]:
    options = {"redis": args.redis, "partitions": str(args.partitions),
               "onGap": args.on_gap}
    if args.key:
        options["key"] = args.key
    else:
        options["prefix"] = args.prefix
    if args.max_events_per_trigger:
        options["maxEventsPerTrigger"] = str(args.max_events_per_trigger)
    if args.trim:
        options["trimCommitted"] = "true"
    if args.skip_malformed:
        options["skipMalformed"] = "true"
    return options


def check_source(options: dict[str, str], remote: str | None) -> None:
    """Raise :class:`PipelineError` when the source's options are bad or its Redis does not
    answer, before a query (and Spark) starts. Not with ``--remote``: there the cluster, not this
    machine, reads Redis."""
    if remote:
        return
    try:
        ping(options)
    except SourceError as exc:
        raise PipelineError(str(exc)) from None


def source_error(text: str) -> str:
    """The source's own message out of a Spark error (which wraps it in a Python traceback)."""
    found = re.findall(r"(?:EventGap|SourceError): (.+)", text)
    if found:
        return str(found[-1]).strip()
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text


def add_archive_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``archive`` subcommand's own arguments (the dispatcher adds --master/--remote)."""
    parser.add_argument("--redis", default=DEFAULT_REDIS,
                        help=f"Redis URL of the event stream (default {DEFAULT_REDIS})")
    stream = parser.add_mutually_exclusive_group()
    stream.add_argument("--prefix", default="tubeq", help="tubeq namespace (default tubeq)")
    stream.add_argument("--key", help="the stream's key, instead of a namespace")
    parser.add_argument("--out", required=True, help="the archive's Parquet directory")
    parser.add_argument("--checkpoint", required=True,
                        help="the query's checkpoint directory (keep it with the archive)")
    parser.add_argument("--once", action="store_true",
                        help="archive what is there now (Trigger.AvailableNow), then stop")
    parser.add_argument("--seconds", type=float, default=None,
                        help="without --once: stop after this many seconds (default: run on)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S,
                        help=f"without --once: seconds between batches "
                             f"(default {DEFAULT_INTERVAL_S:g})")
    parser.add_argument("--trim", action="store_true",
                        help="trim the stream up to what the archive has committed")
    parser.add_argument("--max-events-per-trigger", type=int, default=None, metavar="N",
                        help="at most N events per batch")
    parser.add_argument("--partitions", type=int, default=2,
                        help="parallel reads per batch (default 2)")
    parser.add_argument("--on-gap", choices=("fail", "continue"), default="fail",
                        help="a gap (events trimmed before they were archived) stops the run "
                             "(fail, default) or is printed and skipped (continue)")
    parser.add_argument("--skip-malformed", action="store_true",
                        help="leave out entries that are not events (default: stop on one)")


def run_archive(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Run ``tubeq-pipeline archive``; prints events, batches and gaps; 1 if the query failed
    (its reason on stderr)."""
    options = source_options(args)
    check_source(options, getattr(args, "remote", None))
    jvm_log = getattr(args, "jvm_log", None)
    if spark is None:
        spark = spark_session(getattr(args, "master", None), getattr(args, "remote", None),
                              "tubeq-archive", jvm_log=jvm_log)
    query = start_archive(spark, options, args.out, args.checkpoint, args.once, args.interval)
    tally = ArchiveTally()
    started = time.monotonic()
    try:
        while query.isActive:
            with contextlib.suppress(StreamingQueryException):  # read below, as exception()
                query.awaitTermination(POLL_S)
            for progress in query.recentProgress:
                for line in tally.add(progress):
                    print(line, flush=True)
            if (not args.once and args.seconds is not None
                    and time.monotonic() - started >= args.seconds):
                query.stop()
    except KeyboardInterrupt:
        query.stop()
    for progress in query.recentProgress:
        for line in tally.add(progress):
            print(line, flush=True)
    elapsed = time.monotonic() - started
    error = query.exception()
    print(f"archive: {tally.events} events in {tally.batches} batches, {elapsed:.1f} s, "
          f"to {args.out}" + (f"; {len(tally.gaps)} gap(s)" if tally.gaps else ""), flush=True)
    if error is not None:
        print(naming_log(f"archive: failed: {source_error(str(error))}", jvm_log),
              file=sys.stderr, flush=True)
        return 1
    return 0
