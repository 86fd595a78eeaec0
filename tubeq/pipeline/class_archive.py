"""Spark's classes kept between runs: a class-data-sharing archive of the local driver's JVM.

Owns: the JVM options of a local pipeline command that map the archive, or, on the one run
that writes it, have its JVM write it at exit; and publishing a written archive once it is
whole. A fresh local JVM spends seconds loading and checking Spark's, Scala's and Catalyst's
classes before and during its first action; mapped from an archive (Java's AppCDS,
``-XX:SharedArchiveFile``), they are there at once (measured on 2 cores: session start and a
first aggregation 14.5-18.5 s without, 9.9-11.1 s with; bench/RESULTS-pipeline.md).

Rules:

* The archive is named after a hash of what it was made by: the ``java -version`` text, and
  pyspark's version and the folder of its jars. An archive of another Java or Spark is never
  used (Java would refuse it anyway, after reading it); a new one replaces it.
* One writer at a time: a short run (``spark_session(short=True)``) that finds no archive takes
  the lock (a file created exclusively, holding its pid; the lock of a process that is gone is
  taken over) and asks its JVM to write the archive under a name of its own when it exits.
  Every other run meanwhile starts without an archive. A long run (``live``, a standing
  ``archive``) never writes one: it exits when stopped, not when its work is done.
* A written archive is published (renamed into place) only when the JVM that wrote it exited
  with 0 and another JVM maps it without failing: a truncated archive is not refused by Java
  but crashes the JVM that maps it (SIGBUS, measured on 17.0.15), so nothing else may ever
  find one under the archive's name.
* The writing run waits for it at its end (``atexit``: it stops Spark and ends the JVM, then
  waits for the write, at most DUMP_WAIT_S): once per Java and Spark, 5-15 s of a 2-core
  machine, for ~150 MB in the cache directory. ``TUBEQ_SPARK_CLASS_ARCHIVE=0`` turns the whole
  thing off; a cache directory that cannot be written does too.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Final

SWITCH: Final = "TUBEQ_SPARK_CLASS_ARCHIVE"  # "0": no archive, neither used nor written
PREFIX: Final = "spark-classes-"
# The JVM's own messages about archives (a class it cannot archive, an archive it cannot
# use) go nowhere: either way the run goes on, only slower, and the user can do nothing.
QUIET: Final = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
# The writing JVM's exit: ~150 MB written after the command's work (measured 15 s on two
# cores under load).
DUMP_WAIT_S: Final = 120.0
CHECK_TIMEOUT_S: Final = 60.0  # a JVM that maps the written archive and prints its version


def archive_path(cache: Path, java_version: str) -> Path:
    """Where the archive for this Java (its ``java -version`` text) and this pyspark is kept."""
    import pyspark

    digest = hashlib.sha256("\0".join(
        (java_version, pyspark.__version__, str(Path(pyspark.__file__).parent))).encode())
    return cache / f"{PREFIX}{digest.hexdigest()[:16]}.jsa"


def jvm_options(cache: Path | None, java: str, java_version: str, *,
                may_write: bool) -> list[str]:
    """The driver JVM's options for the archive: map it if it is there; else, with
    ``may_write`` and the lock free, write it at exit (published by this process's exit);
    else none."""
    if os.environ.get(SWITCH, "1") == "0" or cache is None:
        return []
    final = archive_path(cache, java_version)
    if final.is_file():
        return [f"-XX:SharedArchiveFile={final}", *QUIET]
    if not may_write:
        return []
    lock = final.with_name(final.name + ".lock")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        if not take_lock(lock):
            return []
    except OSError:  # no cache to write in: run without
        return []
    written = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    atexit.register(publish_at_exit, java, written, final, lock)
    return [f"-XX:ArchiveClassesAtExit={written}", *QUIET]


def take_lock(lock: Path) -> bool:
    """Whether this process now holds ``lock``: created here, or taken over from a process
    that is gone."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _holder_alive(lock):
                return False
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            continue
        with os.fdopen(fd, "w") as out:
            out.write(str(os.getpid()))
        return True
    return False


def _holder_alive(lock: Path) -> bool:
    try:
        pid = int(lock.read_text() or "0")
    except (OSError, ValueError):
        return False  # unreadable, or not yet written: the writer died between the two
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def mappable(java: str, archive: Path) -> bool:
    """Whether a JVM starts with ``archive`` mapped (it crashes on a truncated one: its crash
    report and core dump are not written, which would land in the working directory)."""
    try:
        run = subprocess.run([java, f"-XX:SharedArchiveFile={archive}", *QUIET,
                              "-XX:ErrorFile=/dev/null", "-XX:-CreateCoredumpOnCrash", "-version"],
                             capture_output=True, timeout=CHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return run.returncode == 0


def publish(java: str, written: Path, final: Path) -> bool:
    """Rename ``written`` to ``final`` if a JVM maps it, and drop the archives of other Javas
    and Sparks; whether it was published."""
    if not written.is_file() or not mappable(java, written):
        return False
    os.replace(written, final)
    for other in final.parent.glob(f"{PREFIX}*.jsa"):
        if other != final:
            with contextlib.suppress(OSError):
                other.unlink()
    return True


def publish_at_exit(java: str, written: Path, final: Path, lock: Path) -> None:
    """At the writing run's exit: stop Spark, end the JVM (its stdin closed: it exits, writing
    the archive), wait for it, publish; the lock and any leftover go, whatever happened."""
    try:
        from pyspark import SparkContext

        active = SparkContext._active_spark_context
        if active is not None:
            active.stop()
        gateway = SparkContext._gateway
        jvm = getattr(gateway, "proc", None)
        if jvm is None or jvm.stdin is None:
            return
        jvm.stdin.close()
        if jvm.wait(DUMP_WAIT_S) == 0:
            publish(java, written, final)
    except Exception:  # at exit, an archive not kept is only a slower next run
        pass
    finally:
        for leftover in (written, lock):
            with contextlib.suppress(OSError):
                leftover.unlink()
