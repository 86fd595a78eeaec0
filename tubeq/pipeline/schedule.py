"""``tubeq-pipeline schedule`` and :func:`schedule`: a dataset's rows become jobs, and the write's
counts come back to the caller.

Owns the driver side of writing jobs from Spark: registering the ``tubeq`` format on the session
(``tubeq.pipeline.source``, whose writer is ``tubeq.pipeline.writer``), running the write,
collecting the counts the tasks committed (through a file the write's commit fills in, since the
commit runs in a Spark Python worker), turning a failed write into :class:`WriteFailed` with the
one line that matters, and the command line (``--input`` a .parquet, .csv or .json dataset).
What a row must hold, the checks and the at-least-once rule are ``writer.py``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pyspark.sql import DataFrame, SparkSession

from tubeq.pipeline.session import PipelineError, spark_session
from tubeq.pipeline.source import NAME, register
from tubeq.pipeline.writer import WriteCounts


@dataclass
class WriteResult:
    counts: WriteCounts
    aborted: bool


class WriteFailed(RuntimeError):
    """The write failed (a task failed more often than Spark retries it); ``counts`` holds what
    the successful tasks reported, when Spark got as far as aborting the write."""

    def __init__(self, message: str, counts: WriteCounts | None) -> None:
        super().__init__(message)
        self.counts = counts


def schedule(frame: DataFrame, address: str, **options: str | int) -> WriteResult:
    """Write ``frame``'s rows as jobs to ``address`` and return the write's counts.

    Registers the ``tubeq`` format (reads and writes) on the frame's session. The counts come
    back through a temporary file that the write's commit (which runs in a Spark Python worker,
    not in this process) fills in.
    """
    spark = frame.sparkSession
    register(spark)
    with tempfile.TemporaryDirectory(prefix="tubeq-write-") as tmp:
        report = os.path.join(tmp, "counts.json")
        writer = frame.write.format(NAME).mode("append").option("address", address)
        for key, value in options.items():
            writer = writer.option(key, str(value))
        try:
            writer.option("report_file", report).save()
        except Exception as exc:
            counts = None
            if os.path.exists(report):
                data = json.loads(Path(report).read_text(encoding="utf-8"))
                data.pop("aborted")
                counts = WriteCounts(**data)
            raise WriteFailed(f"the write to {address} failed: {_reason(exc)}", counts) from exc
        data = json.loads(Path(report).read_text(encoding="utf-8"))
    aborted = bool(data.pop("aborted"))
    return WriteResult(WriteCounts(**data), aborted)


def _reason(exc: BaseException) -> str:
    """The Python error inside a Spark error (its last ``SomethingError: text`` line), else its
    first line: Spark wraps a worker's traceback in a JVM one, and only that line is news."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if _CAUSE.match(line)]
    if causes:
        return causes[-1]
    return lines[0] if lines else repr(exc)


_CAUSE: Final = re.compile(r"^[A-Za-z_.]*(Error|Exception|Failure): ")


# ---------------------------------------------------------------------------------------------
# Command line: `tubeq-pipeline schedule --input FILE --address HOST:PORT [--tube T] ...`.
# ---------------------------------------------------------------------------------------------


def add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``schedule`` subcommand's own arguments (the dispatcher adds --master/--remote)."""
    parser.add_argument("--input", required=True,
                        help="a .parquet (file or directory), .csv (RFC 4180, with a header) "
                             "or .json (one object per line) dataset: columns body, and optionally "
                             "tube, priority, delay or due, ttr")
    parser.add_argument("--address", required=True, help="the tubeq or beanstalkd, HOST:PORT")
    parser.add_argument("--tube", help="the tube of rows without a tube column")
    parser.add_argument("--priority", type=int, help="priority of rows without one")
    parser.add_argument("--delay", type=int, help="delay (s) of rows without delay or due")
    parser.add_argument("--ttr", type=int, help="ttr (s) of rows without one")


def input_format(path: str) -> str:
    """The Spark reader format for dataset ``path`` by its extension (parquet, csv or json);
    raises :class:`PipelineError` for any other, before a session is started."""
    suffix = Path(path.rstrip("/")).suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix == ".csv":
        return "csv"
    if suffix in (".json", ".jsonl", ".ndjson"):
        return "json"
    raise PipelineError(f"--input {path}: expected a .parquet, .csv or .json file")


# CSV as RFC 4180 writes it (pandas.to_csv, Python's csv module, spreadsheets): a field holding a
# comma, a quote or a line break is quoted, and a quote inside it is doubled. Spark's own default
# escape is a backslash, which reads '"{""order"": 15}"' as '"{""order"": 15}"', quotes and all;
# multiLine lets a quoted field span lines (a body with a newline).
CSV_OPTIONS: Final = {"header": "true", "inferSchema": "true", "quote": '"', "escape": '"',
                      "multiLine": "true"}


def read_input(spark: SparkSession, path: str) -> DataFrame:
    """A dataset by its extension: .parquet, .csv (RFC 4180, with a header, types inferred) or
    .json (lines)."""
    kind = input_format(path)
    if kind == "csv":
        return spark.read.options(**CSV_OPTIONS).csv(path)
    return spark.read.format(kind).load(path)


def run_schedule(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Run ``tubeq-pipeline schedule``; prints the counts; exit status 1 if the write aborted."""
    input_format(args.input)  # a bad --input is said before Spark starts
    if spark is None:
        spark = spark_session(getattr(args, "master", None), getattr(args, "remote", None),
                              jvm_log=getattr(args, "jvm_log", None))
    options = {name: getattr(args, name) for name in ("tube", "priority", "delay", "ttr")
               if getattr(args, name, None) is not None}
    try:
        result = schedule(read_input(spark, args.input), args.address, **options)
    except WriteFailed as failed:
        print(f"error: {failed}")
        if failed.counts is not None:
            print(f"  before it failed: {failed.counts.summary()}")
        return 1
    print(("aborted: " if result.aborted else "") + result.counts.summary())
    for error in result.counts.errors:
        print(f"  refused: {error}")
    return 1 if result.aborted else 0
