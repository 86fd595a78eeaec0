"""The archive: tubeq's event stream written to Parquet exactly once, in a folder every reader
gets right.

Owns ``tubeq-pipeline archive``: a Structured Streaming query from the ``tubeq`` source
(``source.py``) whose ``foreachBatch`` writes each micro-batch as Parquet partitioned by
``date`` (``YYYY-MM-DD`` of ``time_ms``, UTC) and ``tube``, and publishes it into the archive
folder as one directory, ``batch=<N>`` (the layout and why: ``layout.py``). Also its folder
commands: ``--check DIR``, ``--clean DIR`` and ``--convert DIR`` (an archive of the old format).

Exactly once, and what a reader sees:

1. Spark writes batch N's offsets (stream ids) to the checkpoint's offset log, then calls
   :class:`BatchPublisher` with the batch's rows.
2. The publisher writes them with Spark into ``CHECKPOINT/staging/batch=N`` (never under the
   archive folder, whose readers do not all skip ``_`` or ``.`` names), keeps only the Parquet
   files there, and renames that directory to ``OUT/batch=N``: the one step that publishes the
   batch, atomic, so a reader sees none of it or all of it.
3. Spark records the batch in the checkpoint's commit log; with ``--trim`` the source then trims
   the stream up to it.

Killed anywhere (kill -9), the folder holds whole batches only. Restarted on the same
checkpoint, Spark replays the unfinished batch with the same id and the same offsets: if it was
published before the kill (between steps 2 and 3), the replay finds ``batch=N`` in place and
keeps it; if not, its staging leftovers are removed and it is written again. So every event is
in exactly one published batch. The checkpoint and the folder belong together: a folder that
holds batches its checkpoint never ran is refused (it was written with another checkpoint).

Rules: the archive prints what it did (events, batches, gaps) from the query's own progress
reports, so the numbers are Spark's. A gap the source reports fails the run with exit status 1
and the source's message (one line on stderr), unless ``--on-gap continue``, which archives on
and prints each gap. A Redis that does not answer, an archive of the old format, a folder of
another checkpoint, and a checkpoint on another file system than the folder are each said in
one line before Spark starts. ``--trim`` passes ``trimCommitted=true``: the source trims the
stream up to the last batch Spark committed (the final batch of a run is committed to the
source, and trimmed, when the next run starts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Final

from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from tubeq.pipeline import layout
from tubeq.pipeline.layout import ARCHIVE_PARTITIONS, Files, LocalFiles
from tubeq.pipeline.session import PipelineError, naming_log, spark_session
from tubeq.pipeline.source import NAME, SourceError, ping, register
from tubeq.pipeline.streaming import add_stream_arguments, stream_options

DAY_MS: Final = 86_400_000
DEFAULT_INTERVAL_S: Final = 10.0
# An ``--once`` run over a stream of at most this many events is short: its JVM compiles with C1
# alone (session.SHORT_RUN_JAVA_OPTIONS).
SHORT_ARCHIVE_EVENTS: Final = 1_000_000
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


# Test-only: the batch id before whose publication the archive stops for good (it prints a line
# and sleeps), so a test can kill it with a batch staged and not published.
STALL_BEFORE_PUBLISHING_ENV: Final = "TUBEQ_ARCHIVE_TEST_STALL_BEFORE_PUBLISHING"
STALL_S: Final = 3600.0


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
    """Write a batch of events (``SPARK_DDL`` columns) as the archive query writes one, for
    events that come from elsewhere (generated, or read back and rewritten): ``out`` becomes an
    archive of one batch, 0, staged beside it (``<out>.staging``) and published."""
    files = files_for(events.sparkSession, out)
    files.remove_tree(out)
    BatchPublisher(out, f"{out.rstrip('/')}.staging", files).publish(
        with_archive_date(events), 0)
    files.remove_tree(f"{out.rstrip('/')}.staging")


class HadoopFiles:
    """The publish steps through the JVM's Hadoop file systems (hdfs://, s3a://, ...): for an
    archive Python cannot see as a local path. Needs a classic session (not ``--remote``)."""

    def __init__(self, spark: SparkSession) -> None:
        jvm: Any = getattr(spark, "_jvm", None)
        if jvm is None:
            raise PipelineError("an archive that is not a local path needs a Spark session "
                                "with a JVM (not --remote: give --out and --checkpoint as "
                                "local paths of the Spark Connect server)")
        self._jvm = jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _located(self, location: str) -> tuple[Any, Any]:
        path = self._jvm.org.apache.hadoop.fs.Path(location)
        return path, path.getFileSystem(self._conf)

    def exists(self, location: str) -> bool:
        path, fs = self._located(location)
        return bool(fs.exists(path))

    def remove_tree(self, location: str) -> None:
        path, fs = self._located(location)
        fs.delete(path, True)

    def make_dirs(self, location: str) -> None:
        path, fs = self._located(location)
        fs.mkdirs(path)

    def tidy(self, stage: str) -> bool:
        path, fs = self._located(stage)
        root = str(fs.makeQualified(path).toString()).rstrip("/")
        files = fs.listFiles(path, True)
        kept = False
        while files.hasNext():
            found = files.next().getPath()
            relative = tuple(str(found.toString())[len(root) + 1:].split("/"))
            if layout.is_layout_file(relative):
                kept = True
            else:
                fs.delete(found, False)
        return kept

    def rename(self, source: str, target: str) -> None:
        path, fs = self._located(source)
        try:
            renamed = fs.rename(path, self._jvm.org.apache.hadoop.fs.Path(target))
        except Py4JJavaError as exc:  # some file systems raise where HDFS returns false
            raise PipelineError(f"cannot rename {source} to {target}: "
                                f"{exc.java_exception.toString()}") from None
        if not renamed:
            raise PipelineError(f"cannot rename {source} to {target}")


def files_for(spark: SparkSession, *locations: str) -> Files:
    """Local file operations when every location is a local path, else Hadoop's."""
    if all(layout.local_path(location) is not None for location in locations):
        return LocalFiles()
    return HadoopFiles(spark)


class BatchPublisher:
    """The ``foreachBatch`` function: stage batch N in the checkpoint, publish it as
    ``OUT/batch=N`` with one rename; a batch already published is kept (module header)."""

    def __init__(self, out: str, staging: str, files: Files) -> None:
        self.out = out.rstrip("/")
        self.staging = staging.rstrip("/")
        self.files = files
        stall = os.environ.get(STALL_BEFORE_PUBLISHING_ENV)
        self.stall_before = int(stall) if stall else None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.publish(batch, batch_id)

    def publish(self, batch: DataFrame, batch_id: int) -> None:
        """Write ``batch`` (events with their ``date``) as batch ``batch_id``, unless published."""
        target = f"{self.out}/{layout.batch_dir_name(batch_id)}"
        if self.files.exists(target):
            return  # published before a kill: the replay has the same offsets, so the same rows
        stage = f"{self.staging}/{layout.batch_dir_name(batch_id)}"
        self.files.remove_tree(stage)  # a killed attempt's leftovers
        batch.write.mode("overwrite").partitionBy(*ARCHIVE_PARTITIONS).parquet(stage)
        if not self.files.tidy(stage):  # no rows (a batch that only records a gap)
            self.files.remove_tree(stage)
            return
        if batch_id == self.stall_before:
            print(f"archive: test stall before publishing batch {batch_id}", flush=True)
            time.sleep(STALL_S)
        self.files.make_dirs(self.out)
        self.files.rename(stage, target)


def start_archive(spark: SparkSession, options: dict[str, str], out: str, checkpoint: str,
                  once: bool, interval_s: float = DEFAULT_INTERVAL_S) -> StreamingQuery:
    """Start the archive query (AvailableNow when ``once``, else a processing-time trigger)."""
    staging = layout.staging_dir(checkpoint)
    publisher = BatchPublisher(out, staging, files_for(spark, out, staging))
    writer = (archive_frame(spark, options).writeStream.foreachBatch(publisher)
              .option("checkpointLocation", checkpoint).outputMode("append"))
    if once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{interval_s} seconds")
    return writer.queryName("tubeq-archive").start()


def source_options(args: argparse.Namespace) -> dict[str, str]:
    options = {**stream_options(args), "partitions": str(args.partitions),
               "onGap": args.on_gap}
    if args.trim:
        options["trimCommitted"] = "true"
    if args.skip_malformed:
        options["skipMalformed"] = "true"
    return options


def check_source(options: dict[str, str], remote: str | None) -> int | None:
    """Raise :class:`PipelineError` when the source's options are bad or its Redis does not
    answer, before a query (and Spark) starts; else return how many events the stream holds. Not
    with ``--remote`` (None): there the cluster, not this machine, reads Redis."""
    if remote:
        return None
    try:
        return ping(options)
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
    add_stream_arguments(parser)
    folder = parser.add_mutually_exclusive_group(required=True)
    folder.add_argument("--out", help="the archive's folder (needs --checkpoint)")
    folder.add_argument("--check", metavar="DIR",
                        help="list the partial or foreign files in archive folder DIR (exit 1 "
                             "if any), then stop")
    folder.add_argument("--clean", metavar="DIR",
                        help="remove the partial or foreign files from archive folder DIR, "
                             "then stop")
    folder.add_argument("--convert", metavar="DIR",
                        help="turn DIR, an archive of the old format (Spark's "
                             "_spark_metadata), into batch directories, then stop")
    parser.add_argument("--checkpoint",
                        help="the query's checkpoint directory: keep it with the archive, on "
                             "the same file system (batches are staged in it)")
    parser.add_argument("--once", action="store_true",
                        help="archive what is there now (Trigger.AvailableNow), then stop")
    parser.add_argument("--seconds", type=float, default=None,
                        help="without --once: stop after this many seconds (default: run on)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S,
                        help=f"without --once: seconds between batches "
                             f"(default {DEFAULT_INTERVAL_S:g})")
    parser.add_argument("--trim", action="store_true",
                        help="trim the stream up to what the archive has committed")
    parser.add_argument("--partitions", type=int, default=2,
                        help="parallel reads per batch (default 2)")
    parser.add_argument("--on-gap", choices=("fail", "continue"), default="fail",
                        help="a gap (events trimmed before they were archived) stops the run "
                             "(fail, default) or is printed and skipped (continue)")
    parser.add_argument("--skip-malformed", action="store_true",
                        help="leave out entries that are not events (default: stop on one)")


def check_folders(out: str, checkpoint: str) -> None:
    """Raise :class:`PipelineError` before Spark starts when ``out`` is an archive of the old
    format, holds batches that ``checkpoint`` never ran, or is on another file system than it
    (local paths only: Spark alone sees the others)."""
    out_path, checkpoint_path = layout.local_path(out), layout.local_path(checkpoint)
    if out_path is None or checkpoint_path is None:
        if (out_path is None) != (checkpoint_path is None):
            raise PipelineError(f"--out {out} and --checkpoint {checkpoint} must be on one file "
                                "system: a batch is staged in the checkpoint and renamed into "
                                "the archive")
        return
    if layout.is_old_format(out_path):
        raise layout.old_format_error(out)
    published = layout.published_batches(out_path)
    offsets = checkpoint_path / "offsets"
    planned = [int(entry.name) for entry in offsets.iterdir()
               if entry.name.isdigit()] if offsets.is_dir() else []
    if published and (not planned or published[-1] > max(planned)):
        raise PipelineError(f"--out {out} holds batches up to {published[-1]} that --checkpoint "
                            f"{checkpoint} never ran: it was written with another checkpoint "
                            "(give that one, or a new --out)")
    if not layout.same_file_system(out_path, checkpoint_path):
        raise PipelineError(f"--out {out} and --checkpoint {checkpoint} must be on one file "
                            "system: a batch is staged in the checkpoint and renamed into the "
                            "archive")


def run_folder_command(args: argparse.Namespace) -> int:
    """``--check``, ``--clean`` or ``--convert``: on a local archive folder, without Spark."""
    flag, location = next((flag, value) for flag, value in (
        ("--check", args.check), ("--clean", args.clean), ("--convert", args.convert))
        if value)
    root = layout.local_path(location)
    if root is None or not root.is_dir():
        raise PipelineError(f"{flag} {location}: no such directory"
                            + ("" if root is not None else " (only local folders)"))
    if flag == "--convert":
        done = layout.convert(root)
        print(f"archive: converted {location}: {done.moved} files into {done.batches} "
              f"batch directories; {len(done.dropped)} partial files dropped", flush=True)
        for dropped in done.dropped:
            print(f"archive: dropped (not in the old log): {dropped}", flush=True)
        return 0
    if layout.is_old_format(root):
        if flag == "--clean":
            raise layout.old_format_error(location)
        findings = layout.inspect_old_format(root)
        _print_findings(findings)
        print(f"archive: --check {location}: an archive of the old format, "
              f"{len(findings)} partial files; convert it: {layout.CONVERT_HINT} {location}",
              flush=True)
        return 1
    findings = layout.inspect(root)
    if flag == "--clean":
        layout.clean(root, findings)
        for finding in findings:
            print(f"archive: removed {finding.kind}: {finding.path}", flush=True)
        print(f"archive: --clean {location}: {len(findings)} removed", flush=True)
        return 0
    _print_findings(findings)
    if findings:
        print(f"archive: --check {location}: {len(findings)} partial or foreign; "
              f"--clean removes them", flush=True)
        return 1
    print(f"archive: --check {location}: {len(layout.published_batches(root))} batches, "
          "no partial or foreign files", flush=True)
    return 0


def _print_findings(findings: list[layout.Finding]) -> None:
    for finding in findings:
        print(f"archive: {finding.kind}: {finding.path} ({finding.why})", flush=True)


def run_archive(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Run ``tubeq-pipeline archive``; prints events, batches and gaps; 1 if the query failed
    (its reason on stderr). With ``--check``/``--clean``/``--convert``: that, without Spark."""
    if args.out is None:
        return run_folder_command(args)
    if not args.checkpoint:
        raise PipelineError("archive --out needs --checkpoint (the query's offsets, and where "
                            "its batches are staged)")
    options = source_options(args)
    held = check_source(options, getattr(args, "remote", None))
    if not getattr(args, "remote", None):
        check_folders(args.out, args.checkpoint)
    jvm_log = getattr(args, "jvm_log", None)
    if spark is None:
        short = args.once and held is not None and held <= SHORT_ARCHIVE_EVENTS
        spark = spark_session(getattr(args, "master", None), getattr(args, "remote", None),
                              "tubeq-archive", jvm_log=jvm_log, short=short)
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
