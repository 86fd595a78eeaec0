"""Spark's classes kept between runs: a class-data-sharing archive of the local driver's JVM.

Owns: the JVM options of a local pipeline command that map the archive, or, on the one run
that writes it, have its JVM write it at exit; and publishing a written archive once it is
whole. A fresh local JVM spends seconds loading and checking Spark's, Scala's and Catalyst's
classes before and during its first action; mapped from an archive (Java's AppCDS,
``-XX:SharedArchiveFile``), they are there at once (measured on 2 busy cores, a 1,000-event
report: 14.0-19.5 s with it, 19.6-26.4 s without; bench/RESULTS-pipeline.md).

Rules:

* Each command (its Spark app name: a report and a streaming archive load different classes)
  has an archive of its own, named after it and a hash of what it was made by: the ``java
  -version`` text, and pyspark's version and the folder of its jars. An archive of another
  Java or Spark is never used (Java would refuse it anyway, after reading it); of a command's,
  the two most recent are kept, so two installs side by side do not undo each other's.
* One writer at a time: a short run (``spark_session(short=True)``) that finds no archive takes
  the lock (``flock`` on a file beside it, held as long as the writing process lives: a writer
  that dies leaves no stale lock) and asks its JVM to write the archive under a name of its
  own when it exits; what an earlier writer left unfinished (``*.tmp``) is removed then. Every
  other run meanwhile starts without an archive. A long run (``live``, a standing
  ``archive``) never writes one: it exits when stopped, not when its work is done.
* A written archive is published (renamed into place) only when the JVM that wrote it exited
  with 0 and another JVM maps it without failing: a truncated archive is not refused by Java
  but crashes the JVM that maps it (SIGBUS, measured on 17.0.15), so nothing else may ever
  find one under the archive's name.
* The writing run waits for it at its end (``atexit``: it ends the JVM by closing its input,
  as Python's exit would, then waits for the write, at most DUMP_WAIT_S, after which the JVM
  is killed and nothing is kept): once per Java and Spark, 12-30 s of a 2-core machine
  (bench/RESULTS-pipeline.md), for 150-190 MB a command in the cache directory.
  ``TUBEQ_SPARK_CLASS_ARCHIVE=0`` turns the whole thing off; a cache directory that cannot be
  written, or whose path has a blank in it (the JVM's options are split on blanks), does too.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Final

SWITCH: Final = "TUBEQ_SPARK_CLASS_ARCHIVE"  # "0": no archive, neither used nor written
PREFIX: Final = "spark-classes-"
# The JVM's own messages about archives (a class it cannot archive, an archive it cannot
# use) go nowhere: either way the run goes on, only slower, and the user can do nothing.
QUIET: Final = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
# The writing JVM's exit: 150-190 MB written after the command's work (measured 12-30 s on two
# busy cores).
DUMP_WAIT_S: Final = 120.0
KEPT_ARCHIVES: Final = 2  # this Java's and Spark's, and the most recent other one
CHECK_TIMEOUT_S: Final = 60.0  # a JVM that maps the written archive and prints its version


def archive_path(cache: Path, java_version: str, kind: str) -> Path:
    """Where the archive of the runs of ``kind`` (a command: its Spark app name) for this Java
    (its ``java -version`` text) and this pyspark is kept."""
    import pyspark

    digest = hashlib.sha256("\0".join(
        (java_version, pyspark.__version__, str(Path(pyspark.__file__).parent))).encode())
    return cache / f"{_kind_prefix(kind)}{digest.hexdigest()[:16]}.jsa"


def _kind_prefix(kind: str) -> str:
    """The start of the names of ``kind``'s archives: its letters, digits and dots, anything
    else as '_', then '-' (so no kind's names start with another kind's prefix)."""
    return f"{PREFIX}{re.sub(r'[^A-Za-z0-9.]', '_', kind)}-"


def jvm_options(cache: Path | None, java: str, java_version: str, *, kind: str,
                may_write: bool) -> list[str]:
    """The driver JVM's options for ``kind``'s archive (a command's: a report and a streaming
    archive load different classes): map it if it is there; else, with ``may_write`` and the
    lock free, write it at exit (published by this process's exit); else none."""
    if (os.environ.get(SWITCH, "1") == "0" or cache is None
            or any(c.isspace() for c in str(cache))):
        return []
    final = archive_path(cache, java_version, kind)
    if final.is_file():
        return [f"-XX:SharedArchiveFile={final}", *QUIET]
    if not may_write:
        return []
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = take_lock(final.with_name(final.name + ".lock"))
    except OSError:  # no cache to write in: run without
        return []
    if lock is None:
        return []
    for leftover in cache.glob(f"{final.name}.*.tmp"):  # of writers gone: the lock is ours
        with contextlib.suppress(OSError):
            leftover.unlink()
    written = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    atexit.register(publish_at_exit, java, written, final, lock)
    return [f"-XX:ArchiveClassesAtExit={written}", *QUIET]


def take_lock(path: Path) -> int | None:
    """The open descriptor of ``path`` with this process's exclusive ``flock`` on it, or None
    while another process holds it. The lock lasts until the descriptor is closed or this
    process ends, however it ends (the file itself stays: removing it could let two writers
    lock two files of one name)."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    return fd


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
    """Rename ``written`` to ``final`` if a JVM maps it, keeping besides it the most recent
    archive of its kind for another Java or Spark only (KEPT_ARCHIVES of a kind in all);
    whether it was published."""
    if not written.is_file() or not mappable(java, written):
        return False
    os.replace(written, final)
    kind_prefix = final.name[:final.name.rindex("-") + 1]
    others = sorted((p for p in final.parent.glob(f"{kind_prefix}*.jsa") if p != final),
                    key=_modified, reverse=True)
    for old in others[KEPT_ARCHIVES - 1:]:
        with contextlib.suppress(OSError):
            old.unlink()
    return True


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def publish_at_exit(java: str, written: Path, final: Path, lock: int) -> None:
    """At the writing run's exit: end the JVM (its input closed: Spark's gateway exits, Spark's
    shutdown hook stops the context, and the JVM writes the archive), wait for it, publish; a
    JVM still writing after DUMP_WAIT_S is killed. The lock is released and a leftover
    removed, whatever happened."""
    try:
        from pyspark import SparkContext

        jvm = getattr(SparkContext._gateway, "proc", None)
        if jvm is None or jvm.stdin is None:
            return
        jvm.stdin.close()
        try:
            exited = jvm.wait(DUMP_WAIT_S)
        except subprocess.TimeoutExpired:
            jvm.kill()
            jvm.wait(DUMP_WAIT_S)
            return
        if exited == 0:
            publish(java, written, final)
    except Exception:  # at exit, an archive not kept is only a slower next run
        pass
    finally:
        with contextlib.suppress(OSError):
            written.unlink()
        os.close(lock)
