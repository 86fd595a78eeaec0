"""``tubeq-pipeline`` (and ``python -m tubeq.pipeline``): the pipeline's one command line.

Owns the table of commands (archive, report, schedule, tail, live), the options every command
shares (``--master``, a Spark master, default ``local[*]``; ``--remote``, a Spark Connect URL), and
how a failure reaches the user.

Rules:

* The commands are data: :data:`COMMANDS` maps a name to its module, the function that adds its
  arguments and the function that runs it. A command's module, and with it PySpark, is imported
  only when that command is chosen, so ``tubeq-pipeline --help`` lists every command quickly and
  without the extra installed.
* ``--master``/``--remote`` go before or after the command's name
  (``tubeq-pipeline --master spark://h:7077 report ...`` or ``tubeq-pipeline report --master ...``).
* A failure the user can fix is exactly one line on stderr (``tubeq-pipeline: ...``) and exit
  status 1: no Java or one older than 17, the pipeline extra (or Spark Connect's client, for
  ``--remote``) not installed, a missing or empty archive, an archive of the old format (with the
  command that converts it), an unreachable Redis, an unreachable ``--remote``, an error Spark
  reports (a corrupt Parquet file; a Python worker, on a cluster node, that cannot import tubeq:
  what to install). What can be checked without Spark is checked before its JVM starts. Bad
  arguments exit 2 (argparse). Anything else is a
  bug and keeps its traceback.
* The JVM a command starts writes its own output (its banner, log4j, the Python workers'
  stderr) to a temporary log file, not to the terminal: the file is removed when the command
  succeeds, and kept and named at the end of the error line when it fails.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from tubeq.pipeline.session import DEFAULT_MASTER, PipelineError, naming_log, written

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PROG: Final = "tubeq-pipeline"


@dataclass(frozen=True)
class Command:
    """One subcommand: where it lives and what ``--help`` says of it."""

    module: str
    add_arguments: str  # (parser) -> None: the command's own arguments
    run: str  # (args, spark=None) -> exit status
    summary: str


COMMANDS: Final[Mapping[str, Command]] = {
    "archive": Command("tubeq.pipeline.archive", "add_archive_arguments", "run_archive",
                       "copy the lifecycle event stream to Parquet, exactly once"),
    "report": Command("tubeq.pipeline.report", "add_report_arguments", "run_report",
                      "analyse an archive: Parquet tables and a self-contained report.html"),
    "schedule": Command("tubeq.pipeline.schedule", "add_schedule_arguments", "run_schedule",
                        "turn a dataset's rows into jobs on a tubeq or beanstalkd"),
    "tail": Command("tubeq.pipeline.tail", "add_tail_arguments", "run_tail",
                    "follow the live event stream: per-tube rates as they happen"),
    "live": Command("tubeq.pipeline.live", "add_live_arguments", "run_live",
                    "keep the report's per-minute counts of the last minutes current in a file"),
}

# Import names whose absence means the pipeline extra is not installed, and those of the gRPC
# client Spark Connect (--remote) needs on top of it (pyspark names the pip package it misses).
EXTRA_MODULES: Final = frozenset({"pyspark", "py4j", "pyarrow", "pandas", "numpy"})
CONNECT_MODULES: Final = frozenset({"grpc", "grpc_status", "google", "zstandard"})
EXTRA_HINT: Final = "pip install 'tubeq[pipeline]'"
CONNECT_HINT: Final = "pip install 'pyspark[connect]'"
_VALUED_OPTIONS: Final = frozenset({"--master", "--remote"})

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[..., int]


def load(name: str) -> tuple[AddArguments, Run]:
    """Import command ``name``'s module; its add-arguments and run functions."""
    command = COMMANDS[name]
    module = importlib.import_module(command.module)
    return (cast(AddArguments, getattr(module, command.add_arguments)),
            cast(Run, getattr(module, command.run)))


def _add_spark_options(parser: argparse.ArgumentParser, *, with_defaults: bool) -> None:
    # After the command's name the options only override what was given before it.
    unset: Any = argparse.SUPPRESS
    group = parser.add_argument_group("where Spark runs")
    group.add_argument("--master", default=DEFAULT_MASTER if with_defaults else unset,
                       help="Spark master: local[N], spark://HOST:7077, yarn, k8s://... "
                            f"(default {DEFAULT_MASTER})")
    group.add_argument("--remote", default=None if with_defaults else unset, metavar="URL",
                       help="a Spark Connect server (sc://HOST:15002) instead of --master")
    group.add_argument("--verbose", action="store_true", default=False if with_defaults else unset,
                       help="Spark's own output (warnings, progress bars) on stderr; by "
                            "default it goes to a log file, named when a command fails")


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command named in ``argv`` (its first positional word), if it is one of ours."""
    tokens = iter(argv)
    for token in tokens:
        if token in _VALUED_OPTIONS:
            next(tokens, None)
        elif not token.startswith("-"):
            return token if token in COMMANDS else None
    return None


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; only command ``chosen`` gets its own arguments (its module imported)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="tubeq's data pipeline on Spark (PySpark 4, Java 17+): archive the job "
                    "lifecycle events, report on them, schedule jobs from datasets.",
        epilog=f"'{PROG} COMMAND --help' gives a command's own options. Needs {EXTRA_HINT}.")
    _add_spark_options(parser, with_defaults=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     title="commands")
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.summary, description=command.summary)
        _add_spark_options(sub, with_defaults=False)
        if name == chosen:
            add_arguments, _ = load(name)
            add_arguments(sub)
    return parser


def run(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Run the parsed command, on ``spark`` if given (else the command builds its session)."""
    _, run_command = load(args.command)
    return run_command(args) if spark is None else run_command(args, spark)


def missing_dependency(exc: ImportError) -> str | None:
    """What to install when ``exc`` is a package of the extra (or of Spark Connect's client)
    not being there; None if it is some other import failure."""
    root = (exc.name or "").partition(".")[0]
    # pyspark reports its own missing optional packages (grpcio for --remote) as a
    # PySparkImportError with this condition and no module name.
    get_condition = getattr(exc, "getCondition", None)
    missing_package = callable(get_condition) and get_condition() == "PACKAGE_NOT_INSTALLED"
    if root in CONNECT_MODULES or missing_package:
        return f"--remote needs Spark Connect's client: {CONNECT_HINT} ({_first_line(exc)})"
    if root in EXTRA_MODULES:
        return (f"the pipeline needs its optional dependencies (PySpark, pyarrow, pandas<3): "
                f"{EXTRA_HINT} ({_first_line(exc)})")
    return None


def explain(exc: Exception) -> str | None:
    """The one line a user reads for a failure they can fix; None for a bug."""
    if isinstance(exc, PipelineError):
        return str(exc)
    if isinstance(exc, ImportError):
        hint = missing_dependency(exc)
        if hint is not None:
            return hint
    try:
        from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
        from pyspark.errors import PySparkException
    except ImportError:
        return None
    if isinstance(exc, PySparkException):
        return worker_import_error(str(exc)) or f"Spark: {_first_line(exc)}"
    if isinstance(exc, Py4JJavaError):
        try:
            text = str(exc)  # asks the JVM for the Java exception's text
        except Exception:
            return None
        return worker_import_error(text) or spark_error(text)
    return None


def worker_import_error(text: str) -> str | None:
    """What to do when a Spark error's text says a Python worker could not import a module:
    the executors' Python (on a cluster, each node's) lacks tubeq or a package of the extra.
    None for any other error."""
    found = _WORKER_IMPORT.search(text)
    if found is None:
        return None
    return (f"Spark: a Python worker could not import {found.group(1)!r}: install the "
            f"pipeline where Spark's Python workers run ({EXTRA_HINT} into the Python that "
            f"PYSPARK_PYTHON or spark.pyspark.python names, on every node; with --remote, the "
            f"Spark Connect server's)")


# The last line of a Python worker's traceback, inside the text of the Spark error it became.
_WORKER_IMPORT: Final = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def spark_error(text: str) -> str | None:
    """The line of a JVM error's text (a Py4JJavaError's) that Spark wrote for a user, with its
    deepest cause: ``Spark: [FAILED_READ_FILE.NO_HINT] ... (corrupted file: ...)``. None when
    the error has no Spark error condition (``[NAME]``): an internal failure, a bug."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = next((_SPARK_CONDITION.match(line) for line in lines
                  if _SPARK_CONDITION.match(line)), None)
    if found is None:
        return None
    message = found.group(1)
    causes = [line.removeprefix("Caused by: ") for line in lines
              if line.startswith("Caused by: ")]
    if causes:
        message += f" ({causes[-1].partition(': ')[2] or causes[-1]})"
    return f"Spark: {message}"


# A JVM exception line whose message starts with Spark's error condition: ": org.apache.spark.
# SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error while reading file ...", or the
# same as a cause: a result collected as Arrow (DataFrame.toArrow) fails with "Exception thrown in
# awaitResult", caused by the task's error.
_SPARK_CONDITION: Final = re.compile(
    r"^(?::|Caused by:)?\s*[\w.$]+(?:Exception|Error): (\[[A-Z_.]+\] .*)$")


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """The ``tubeq-pipeline`` command; returns its exit status (argparse exits 2 itself)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    log: Path | None = None
    status = 1
    try:
        args = build_parser(chosen_command(arguments)).parse_args(arguments)
        if not args.verbose:
            handle, name = tempfile.mkstemp(prefix=f"{PROG}-", suffix=".log")
            os.close(handle)
            args.jvm_log = log = Path(name)
        status = run(args, spark)
        return status
    except Exception as exc:
        message = explain(exc)
        if message is None:
            if written(log):
                print(f"{PROG}: Spark's log: {log}", file=sys.stderr)
            raise
        print(f"{PROG}: {naming_log(message, log)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # tail and a long-running archive stop on ^C
        status = 130
        return status
    finally:
        if log is not None and (status != 1 or not written(log)):
            log.unlink(missing_ok=True)
