"""Spark's classes kept between runs (tubeq.pipeline.class_archive): which JVM options a local
session gets, one writer at a time, and a real JVM writing, publishing and mapping the archive.

The options and the lock are checked without a JVM; then two real short runs in subprocesses,
each with a cache directory of the test's own (the other pipeline tests run with the archive
off: sparks.JVM_ENVIRONMENT): the first writes the archive at its exit and publishes it whole,
the second maps it; and a truncated copy, which crashes a JVM that maps it, is never published.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tubeq.pipeline import class_archive
from tubeq.pipeline.session import check_java

JAVA_TEXT = 'openjdk version "17.0.15" 2025-04-15'
KIND = "tubeq-pipeline"  # the report's app name
RUN_TIMEOUT_S = 300  # a JVM's start, a small job and the archive's write, on two busy cores

# A short local run, as `tubeq-pipeline report` of a small archive makes it: prints whether its
# JVM mapped an archive (its command line), and the answer of a small aggregation.
SHORT_RUN = """
import json, sys
from pyspark import SparkContext
from tubeq.pipeline.session import spark_session
spark = spark_session("local[1]", short=True)
rows = spark.range(100).selectExpr("id % 3 AS k").groupBy("k").count().collect()
pid = SparkContext._gateway.proc.pid
with open(f"/proc/{pid}/cmdline", "rb") as f:
    jvm = f.read().split(b"\\0")
print(json.dumps({"counts": sorted(r["count"] for r in rows),
                  "maps": any(a.startswith(b"-XX:SharedArchiveFile=") for a in jvm),
                  "writes": any(a.startswith(b"-XX:ArchiveClassesAtExit=") for a in jvm)}))
"""


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
    """The exit handlers class_archive registers, caught instead of run."""
    calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
    monkeypatch.setattr(class_archive.atexit, "register",
                        lambda fn, *args: calls.append((fn, args)))
    monkeypatch.delenv(class_archive.SWITCH, raising=False)
    return calls


def test_an_archive_in_place_is_mapped_and_none_is_written(
        tmp_path: Path, registered: list[Any]) -> None:
    final = class_archive.archive_path(tmp_path, JAVA_TEXT, KIND)
    final.write_bytes(b"archive")
    options = class_archive.jvm_options(tmp_path, "java", JAVA_TEXT, kind=KIND, may_write=True)
    assert options == [f"-XX:SharedArchiveFile={final}", *class_archive.QUIET]
    assert registered == []


def test_a_short_run_without_an_archive_writes_one_under_the_lock(
        tmp_path: Path, registered: list[Any]) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    final = class_archive.archive_path(cache, JAVA_TEXT, KIND)
    left = final.with_name(final.name + ".99999.tmp")  # a writer gone mid-write
    left.write_bytes(b"part of an archive")
    # another install's writer (its own lock) may be writing now: left alone
    other = cache / f"{class_archive.PREFIX}tubeq_pipeline-0123.jsa.99998.tmp"
    other.write_bytes(b"being written")
    options = class_archive.jvm_options(cache, "java", JAVA_TEXT, kind=KIND, may_write=True)
    written = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    assert options == [f"-XX:ArchiveClassesAtExit={written}", *class_archive.QUIET]
    assert not left.exists() and other.exists()
    [(handler, (java, to_write, to_publish, lock))] = registered
    assert (handler, java, to_write, to_publish) == (
        class_archive.publish_at_exit, "java", written, final)
    try:
        # Meanwhile another run finds the lock held: it writes nothing.
        assert class_archive.jvm_options(cache, "java", JAVA_TEXT, kind=KIND, may_write=True) == []
        assert len(registered) == 1
    finally:
        os.close(lock)
    assert class_archive.jvm_options(cache, "java", JAVA_TEXT, kind=KIND,
                                     may_write=True)  # free again
    os.close(registered[-1][1][3])


HOLD_LOCK = """
import sys, time
from pathlib import Path
from tubeq.pipeline.class_archive import take_lock
assert take_lock(Path(sys.argv[1])) is not None
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_the_lock_is_held_as_long_as_its_process_lives(tmp_path: Path) -> None:
    lock = tmp_path / "archive.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock), "60"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert class_archive.take_lock(lock) is None
    finally:
        holder.kill()  # dies holding it: no stale lock
        holder.wait(30)
    fd = class_archive.take_lock(lock)
    assert fd is not None
    os.close(fd)


def test_no_archive_for_a_long_run_when_switched_off_or_without_a_cache(
        tmp_path: Path, registered: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    assert class_archive.jvm_options(tmp_path, "java", JAVA_TEXT, kind=KIND, may_write=False) == []
    assert class_archive.jvm_options(None, "java", JAVA_TEXT, kind=KIND, may_write=True) == []
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert class_archive.jvm_options(blocked / "cache", "java", JAVA_TEXT, kind=KIND,
                                     may_write=True) == []
    blank = tmp_path / "a cache"  # the JVM's options are split on blanks
    class_archive.archive_path(blank, JAVA_TEXT, KIND).parent.mkdir()
    class_archive.archive_path(blank, JAVA_TEXT, KIND).write_bytes(b"archive")
    assert class_archive.jvm_options(blank, "java", JAVA_TEXT, kind=KIND, may_write=True) == []
    monkeypatch.setenv(class_archive.SWITCH, "0")
    class_archive.archive_path(tmp_path, JAVA_TEXT, KIND).write_bytes(b"archive")
    assert class_archive.jvm_options(tmp_path, "java", JAVA_TEXT, kind=KIND, may_write=True) == []
    assert registered == []


def test_publishing_keeps_the_most_recent_archive_of_another_java_or_spark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(class_archive, "mappable", lambda java, path: True)
    others = [tmp_path / f"{class_archive.PREFIX}tubeq_pipeline-{n}.jsa"
              for n in ("old", "older", "newer")]
    # another command's, whose name starts as this one's: left alone
    another_kind = tmp_path / f"{class_archive.PREFIX}tubeq_pipeline_x-0123.jsa"
    another_kind.write_bytes(b"archive")
    for age, other in zip((200, 300, 100), others, strict=True):
        other.write_bytes(b"archive")
        os.utime(other, (other.stat().st_mtime - age,) * 2)
    written = tmp_path / "written.tmp"
    written.write_bytes(b"archive")
    final = class_archive.archive_path(tmp_path, JAVA_TEXT, KIND)
    assert class_archive.publish("java", written, final)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [final.name, f"{class_archive.PREFIX}tubeq_pipeline-newer.jsa", another_kind.name])


def test_each_command_java_and_spark_has_an_archive_of_its_own(tmp_path: Path) -> None:
    other = class_archive.archive_path(tmp_path, JAVA_TEXT.replace("17.0.15", "17.0.16"),
                                       KIND)
    assert other != class_archive.archive_path(tmp_path, JAVA_TEXT, KIND)
    assert other.name.startswith(class_archive.PREFIX) and other.suffix == ".jsa"
    streaming = class_archive.archive_path(tmp_path, JAVA_TEXT, "tubeq-archive")
    assert streaming != class_archive.archive_path(tmp_path, JAVA_TEXT, KIND)
    assert class_archive.archive_path(tmp_path, JAVA_TEXT, "a/b c").name.startswith(
        f"{class_archive.PREFIX}a_b_c-")


def _short_run(cache: Path) -> dict[str, Any]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), class_archive.SWITCH: "1"}
    done = subprocess.run([sys.executable, "-c", SHORT_RUN], capture_output=True, text=True,
                          env=env, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_a_short_run_writes_the_archive_whole_and_the_next_maps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # where a crashing JVM would leave its report
    cache = tmp_path / "cache"
    first = _short_run(cache)
    assert first == {"counts": [33, 33, 34], "maps": False, "writes": True}
    folder = cache / "tubeq"
    names = sorted(p.name for p in folder.iterdir())
    archives = [name for name in names if name.endswith(".jsa")]
    # Published whole: no .tmp left; the lock's file stays (unlocked).
    assert names == [archives[0], archives[0] + ".lock"], names
    assert archives[0].startswith(class_archive.PREFIX)
    second = _short_run(cache)
    assert second == {"counts": [33, 33, 34], "maps": True, "writes": False}

    # A truncated archive crashes the JVM that maps it: it is never published.
    java = check_java().path
    archive = folder / archives[0]
    assert class_archive.mappable(java, archive)
    cut = tmp_path / "cut.jsa"
    with archive.open("rb") as whole, cut.open("wb") as part:
        part.write(whole.read(1 << 20))
    assert not class_archive.mappable(java, cut)
    elsewhere = tmp_path / "elsewhere" / archives[0]
    elsewhere.parent.mkdir()
    assert not class_archive.publish(java, cut, elsewhere)
    assert not elsewhere.exists()
    assert not list(tmp_path.glob("hs_err*")) and not list(tmp_path.glob("core*"))
