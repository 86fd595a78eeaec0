"""The one way tubeq's pipeline commands get a SparkSession, and the Java check before it.

Owns: the environment a local session needs (workers on this interpreter, every listener on
loopback; a cluster master gets neither), the settings that suit a laptop-sized local master,
Spark Connect (``--remote``), the one clear error when Java is missing or too old, instead
of a JVM trace, and where the JVM's own output goes (a log file, when the caller names one).

Rules: nothing here starts Spark at import time; every pipeline command builds its session
through :func:`spark_session`, so a fix to how sessions start is made once.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

from tubeq.pipeline import class_archive
from tubeq.store.scripts import cache_dir

if TYPE_CHECKING:
    # Imported for real inside spark_session(): the CLI imports JavaUnavailable from here even
    # when the pipeline extra (pyspark) is not installed, to say so in one line.
    from pyspark.sql import SparkSession

# PySpark 4 runs on Java 17 or newer (its jars are built for 17).
MIN_JAVA: Final = 17
# Spark's default of 200 shuffle partitions is sized for clusters: on 2 local cores the report of
# 400k events took 103 s with it and 17 s with 8 (bench/RESULTS-pipeline.md).
LOCAL_SHUFFLE_PARTITIONS: Final = 8
# A local master runs every task inside the driver's JVM, whose default 1 GiB heap makes the
# report's sorts spill and its caches evict on a 10M-event archive. Only honoured when this call
# starts the JVM (a session that already runs keeps its heap).
LOCAL_DRIVER_MEMORY: Final = "4g"
# The throughput collector for a local master's JVM: the report is a batch job, and G1's
# concurrent marking competed with the tasks for 2 cores (10M-event report, quiet Intel Xeon
# machine: 53.7 s and 100 CPU-s with G1, 49.2 s and 91 CPU-s with this; bench/RESULTS-pipeline.md).
LOCAL_DRIVER_JAVA_OPTIONS: Final = "-XX:+UseParallelGC"
# A short run's JVM compiles with C1 alone. C2 compiles the code a long run spends its time in,
# and a short run pays for those compilations without living long enough to gain from them: a
# fresh local[2] report of 1,000 events took 27 CPU-s with C1 alone against 47 with both
# compilers, one of 1,000,000 events 53 against 82 (AMD EPYC, 2 cores; bench/RESULTS-pipeline.md).
# The 10M-event report lives on C2's code and does not get it.
SHORT_RUN_JAVA_OPTIONS: Final = "-XX:TieredStopAtLevel=1"
# A local master lists an archive's folders in the driver however many there are. Past Spark's
# default of 32 folders at one level it runs a listing job instead: for a 1,000-event archive of
# 50 tubes, a job of 50 tasks that took 2.5 s of a fresh report's (bench/RESULTS-pipeline.md), on
# the same cores the driver's listing would use.
LOCAL_LISTING_JOB_THRESHOLD: Final = 1_000_000
DEFAULT_MASTER: Final = "local[*]"
JAVA_VERSION_TIMEOUT_S: Final = 30.0
# Spark Connect's client retries an unreachable server with backoff for minutes (measured: still
# waiting after 120 s); a plain TCP connect decides within this long that nobody is there.
CONNECT_PROBE_TIMEOUT_S: Final = 5.0
SPARK_CONNECT_PORT: Final = 15002


class PipelineError(RuntimeError):
    """A failure the user can fix (a missing Java, an unreachable server, a bad input); the
    command line prints its message as one line, without a traceback."""


class JavaUnavailable(PipelineError):
    """No usable Java for Spark; the message says what was found and what to do."""


class ConnectUnreachable(PipelineError):
    """Nothing answers at the Spark Connect URL given with ``--remote``."""


def check_reachable(remote: str) -> None:
    """Raise :class:`ConnectUnreachable` unless a TCP connection to ``remote``'s host and port
    (``sc://HOST[:PORT][/;params]``, default port 15002) opens within a few seconds."""
    rest = remote.removeprefix("sc://").split("/", 1)[0]
    host, _, port = rest.rpartition(":") if ":" in rest.lstrip("[") else (rest, "", "")
    host = (host or rest).strip("[]")
    try:
        number = int(port) if port else SPARK_CONNECT_PORT
    except ValueError:
        number = -1
    if not 0 < number < 65536:
        raise ConnectUnreachable(f"--remote {remote}: bad port {port!r}")
    try:
        with socket.create_connection((host, number), timeout=CONNECT_PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ConnectUnreachable(f"no Spark Connect server answers at {host}:{number} "
                                 f"(--remote {remote}): {exc}") from None


def java_executable() -> str | None:
    """The java Spark will run: ``$JAVA_HOME/bin/java`` if JAVA_HOME is set, else ``java`` on
    PATH (what pyspark's launcher does); None if there is none."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() else None
    return shutil.which("java")


def java_major(version_output: str) -> int | None:
    """The major version in ``java -version`` output (``"17.0.15"`` -> 17, ``"1.8.0_402"`` ->
    8); None if none is found."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if found is None:
        return None
    major = int(found.group(1))
    if major == 1 and found.group(2) is not None:  # the 1.x scheme of Java 8 and before
        major = int(found.group(2))
    return major


class Java(NamedTuple):
    """The java Spark will run: its path, its major version, and what ``-version`` printed."""

    path: str
    major: int
    version_text: str


def check_java() -> Java:
    """Return the Java Spark will use; raise :class:`JavaUnavailable` if there is no java, it
    does not run, or it is older than :data:`MIN_JAVA`."""
    java = java_executable()
    where = "JAVA_HOME" if os.environ.get("JAVA_HOME") else "PATH"
    advice = (f"the pipeline runs on Spark, which needs Java {MIN_JAVA} or newer: install it "
              f"(Debian: apt-get install openjdk-{MIN_JAVA}-jre-headless) or point JAVA_HOME at it")
    if java is None:
        raise JavaUnavailable(f"no java found (looked in {where}); {advice}")
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True,
                              timeout=JAVA_VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaUnavailable(f"{java} -version failed ({exc}); {advice}") from exc
    version_text = proc.stderr + proc.stdout
    major = java_major(version_text)
    if proc.returncode != 0 or major is None:
        raise JavaUnavailable(f"{java} -version did not say its version "
                              f"(exit {proc.returncode}); {advice}")
    if major < MIN_JAVA:
        raise JavaUnavailable(f"{java} is Java {major}; {advice}")
    return Java(java, major, version_text)


@contextlib.contextmanager
def children_stderr_to(log: Path) -> Iterator[None]:
    """Processes started inside the block write their stderr to ``log`` (appended), and so does
    this process meanwhile; this process's stderr is its own again after the block.

    The JVM that ``getOrCreate`` launches inherits file descriptor 2, and keeps it: its banner
    (``WARNING: Using incubator modules``, which no log4j level silences), log4j's output and
    progress bars, and the stderr of the Python workers it forks then all land in ``log``.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(log, "ab") as sink:
            os.dup2(sink.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def written(jvm_log: Path | None) -> bool:
    """Whether a JVM wrote anything to ``jvm_log``."""
    return jvm_log is not None and jvm_log.is_file() and jvm_log.stat().st_size > 0


def naming_log(message: str, jvm_log: Path | None) -> str:
    """``message``, followed by where the JVM's output is when there is some to read."""
    return f"{message} (Spark's log: {jvm_log})" if written(jvm_log) else message


def spark_session(master: str | None = DEFAULT_MASTER, remote: str | None = None,
                  app_name: str = "tubeq-pipeline",
                  jvm_log: Path | None = None, short: bool = False) -> SparkSession:
    """A SparkSession for a pipeline command: on ``remote`` (a Spark Connect URL) if given, else
    on ``master``; a local master gets Python workers on this interpreter and listeners on
    loopback, Spark's classes mapped from the archive in the cache directory where there is one
    (tubeq.pipeline.class_archive), and with ``short`` (the caller knows its work is small) a
    JVM that compiles with C1 alone and, where there is no archive yet, writes it at exit. A
    JVM this call starts writes its output to ``jvm_log`` if given (else to this process's
    stderr)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if remote:
        # The cluster runs the Python code: no local JVM, so no local Java check.
        check_reachable(remote)
        return builder.remote(remote).getOrCreate()
    java = check_java()
    master = master or DEFAULT_MASTER
    builder = (builder.master(master).config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC"))
    if master.startswith("local"):
        # Only for a local master: a cluster's executors must reach the driver (not on its
        # loopback) and run their own nodes' Python (this interpreter's path may not exist there).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.sql.shuffle.partitions", str(LOCAL_SHUFFLE_PARTITIONS))
                   .config("spark.sql.sources.parallelPartitionDiscovery.threshold",
                           str(LOCAL_LISTING_JOB_THRESHOLD))
                   .config("spark.driver.memory", LOCAL_DRIVER_MEMORY)
                   .config("spark.driver.extraJavaOptions", " ".join(
                       [LOCAL_DRIVER_JAVA_OPTIONS] + ([SHORT_RUN_JAVA_OPTIONS] if short else [])
                       + class_archive.jvm_options(cache_dir(), java.path, java.version_text,
                                                   kind=app_name, may_write=short))))
    if jvm_log is None:
        return builder.getOrCreate()
    # Stage progress bars are for a terminal, not for a log file.
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    with children_stderr_to(jvm_log):
        return builder.getOrCreate()
