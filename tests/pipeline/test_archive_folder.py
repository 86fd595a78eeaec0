"""The archive folder as every reader sees it: pyarrow, pandas, DuckDB and Spark read exactly the
committed events, once each, at every moment: right after a kill -9 mid-batch, after ``mv`` and
``cp -r``, and after a restart; ``--check``/``--clean`` find and remove what is not the
archive's; an archive of the old format (Spark's file sink) is refused and converted.

Readers are given the archive's partition types (``batch`` an integer, ``date`` and ``tube``
strings), as the README shows: left to infer them, pyarrow and DuckDB read a tube named ``007``
as the number 7.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import redis
from pyspark.sql import SparkSession

from tests.pipeline import eventstream as es
from tests.pipeline.archives import archive_args
from tubeq.model.events import FIELDS, SPARK_DDL
from tubeq.pipeline import archive, layout
from tubeq.pipeline.report import read_archive
from tubeq.pipeline.session import PipelineError
from tubeq.redisio.process import RedisProcess

EVENTS = 4_000
BATCH = 500
STALLED_BATCH = 3  # batches 0-2 published and committed, 3 staged when the kill lands
STALL_WAIT_S = 300.0
COLUMNS = ("stream_id", *FIELDS)
PARTITION_TYPES = pa.schema([("batch", pa.int64()), ("date", pa.string()),
                             ("tube", pa.string())])

Row = tuple[str, ...]


def folder_command(flag: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """``tubeq-pipeline archive --check/--clean/--convert DIR`` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "tubeq.pipeline", "archive", flag, str(folder)],
                          capture_output=True, text=True, timeout=120, check=False)


def as_rows(records: Any) -> list[Row]:
    """Rows of any reader as sorted tuples of strings, in ``COLUMNS`` order."""
    return sorted(tuple(str(record[name]) for name in COLUMNS) for record in records)


def by_pyarrow(folder: Path) -> list[Row]:
    partitioning = ds.partitioning(PARTITION_TYPES, flavor="hive")
    table = ds.dataset(folder, partitioning=partitioning).to_table(columns=list(COLUMNS))
    return as_rows(table.to_pylist())


def by_pandas(folder: Path) -> list[Row]:
    frame = pd.read_parquet(folder, columns=list(COLUMNS),
                            partitioning=ds.partitioning(PARTITION_TYPES, flavor="hive"))
    return as_rows(frame.to_dict("records"))


def by_duckdb(folder: Path) -> list[Row]:
    with duckdb.connect() as conn:
        cursor = conn.execute(
            "SELECT * FROM read_parquet(?, hive_partitioning = 1, "
            "hive_types = {'batch': BIGINT, 'date': VARCHAR, 'tube': VARCHAR})",
            [f"{folder}/**/*.parquet"])
        names = [column[0] for column in cursor.description]
        return as_rows(dict(zip(names, row, strict=True)) for row in cursor.fetchall())


def by_spark(spark: SparkSession, folder: Path) -> list[Row]:
    return as_rows(row.asDict() for row in read_archive(spark, folder).collect())


def every_reader(spark: SparkSession, folder: Path) -> dict[str, list[Row]]:
    return {"pyarrow": by_pyarrow(folder), "pandas": by_pandas(folder),
            "duckdb": by_duckdb(folder), "spark": by_spark(spark, folder)}


def expected(written: list[es.Written]) -> list[Row]:
    return sorted((w.stream_id, *(str(w.fields[name]) for name in FIELDS)) for w in written)


def assert_read_by_all(spark: SparkSession, folder: Path, written: list[es.Written]) -> None:
    want = expected(written)
    assert len({row[0] for row in want}) == len(want)
    for reader, rows in every_reader(spark, folder).items():
        assert rows == want, f"{reader}: {len(rows)} rows, {len(set(rows))} distinct, " \
                             f"want {len(want)}"


def id_key(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq)


def committed_through(checkpoint: Path) -> tuple[list[int], str]:
    """The batches the checkpoint committed and the last stream id the last of them covers."""
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    offset = json.loads((checkpoint / "offsets" / str(commits[-1])).read_text().splitlines()[-1])
    return commits, str(offset["id"])


def truncated_copy(source: Path, target: Path) -> None:
    data = source.read_bytes()
    target.write_bytes(data[: len(data) // 2])


# ---------------------------------------------------------------------------------------------
# The folder commands and the layout, without Spark.
# ---------------------------------------------------------------------------------------------


def whole_parquet(path: Path, rows: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"stream_id": [f"{i}-0" for i in range(rows)]}), path)


def test_check_names_partial_and_foreign_files_and_clean_removes_them(tmp_path: Path) -> None:
    folder = tmp_path / "archive"
    good = folder / "batch=0" / "date=2026-01-01" / "tube=orders" / "part-0.parquet"
    whole_parquet(good)
    whole_parquet(folder / "batch=1" / "date=2026-01-01" / "tube=007" / "part-0.parquet")
    truncated_copy(good, good.with_name("part-1.parquet"))
    (good.parent / "part-2.parquet").write_bytes(b"")
    (good.parent / ".part-0.parquet.crc").write_bytes(b"crc")
    (folder / "batch=0" / "_SUCCESS").write_bytes(b"")
    (folder / "notes.txt").write_text("mine")
    (folder / "date=2026-01-01" / "tube=orders").mkdir(parents=True)
    done = folder_command("--check", folder)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        "archive: foreign: batch=0/_SUCCESS (not a date=YYYY-MM-DD directory)",
        "archive: foreign: batch=0/date=2026-01-01/tube=orders/.part-0.parquet.crc (not a "
        "Parquet file of the archive)",
        "archive: partial: batch=0/date=2026-01-01/tube=orders/part-1.parquet (not a whole "
        f"Parquet file ({good.stat().st_size // 2} bytes, no footer): cut short)",
        "archive: partial: batch=0/date=2026-01-01/tube=orders/part-2.parquet (not a whole "
        "Parquet file (0 bytes, no footer): cut short)",
        "archive: foreign: date=2026-01-01/ (not a batch=N directory)",
        "archive: foreign: notes.txt (not a batch=N directory)",
        f"archive: --check {folder}: 6 partial or foreign; --clean removes them",
    ]
    done = folder_command("--clean", folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"archive: --clean {folder}: 6 removed"
    done = folder_command("--check", folder)
    assert (done.returncode, done.stdout) == (
        0, f"archive: --check {folder}: 2 batches, no partial or foreign files\n")
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.parquet")) == [
        "batch=0/date=2026-01-01/tube=orders/part-0.parquet",
        "batch=1/date=2026-01-01/tube=007/part-0.parquet"]


@pytest.mark.parametrize("flag", ["--check", "--clean", "--convert"])
def test_a_folder_command_on_a_missing_folder_is_one_line(flag: str, tmp_path: Path) -> None:
    done = folder_command(flag, tmp_path / "nowhere")
    assert done.returncode == 1
    assert done.stderr == f"tubeq-pipeline: {flag} {tmp_path / 'nowhere'}: no such directory\n"


def test_convert_refuses_a_folder_of_the_new_format(tmp_path: Path) -> None:
    whole_parquet(tmp_path / "batch=0" / "date=2026-01-01" / "tube=a" / "p.parquet")
    done = folder_command("--convert", tmp_path)
    assert done.returncode == 1
    assert done.stderr == (f"tubeq-pipeline: --convert {tmp_path}: not an archive of the old "
                           "format (no _spark_metadata)\n")


def test_convert_refuses_an_old_archive_whose_listed_file_is_missing(tmp_path: Path) -> None:
    log = tmp_path / "_spark_metadata"
    log.mkdir()
    entry = {"path": "file:///elsewhere/events/date=2026-01-01/tube=a/part-0.parquet",
             "size": 1, "isDir": False, "modificationTime": 0, "blockReplication": 1,
             "blockSize": 1, "action": "add"}
    (log / "0").write_text("v1\n" + json.dumps(entry) + "\n")
    done = folder_command("--convert", tmp_path)
    assert done.returncode == 1
    assert done.stderr == (f"tubeq-pipeline: --convert {tmp_path}: date=2026-01-01/tube=a/"
                           "part-0.parquet, listed in _spark_metadata (batch 0), is missing: "
                           "the archive is incomplete\n")
    assert (log / "0").exists()


def test_a_published_batch_is_kept_when_its_replay_comes(tmp_path: Path) -> None:
    """Killed after the rename and before Spark's commit, the batch is replayed: the replay
    finds it published and writes nothing (it would not even read its rows)."""
    out, staging = tmp_path / "out", tmp_path / "checkpoint" / "staging"
    published = out / "batch=4" / "date=2026-01-01" / "tube=a" / "p.parquet"
    whole_parquet(published)
    before = published.read_bytes()

    class NoRows:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the replay touched its rows ({name})")

    archive.BatchPublisher(str(out), str(staging), layout.LocalFiles()).publish(
        NoRows(), 4)  # type: ignore[arg-type]
    assert published.read_bytes() == before
    assert not staging.exists()


def test_folder_of_another_checkpoint_is_refused_before_spark_starts(
        redis_process: RedisProcess, tmp_path: Path) -> None:
    whole_parquet(tmp_path / "out" / "batch=5" / "date=2026-01-01" / "tube=a" / "p.parquet")
    args = archive_args(redis_process.url, es.fresh_prefix(), tmp_path / "out",
                        tmp_path / "fresh-checkpoint", "--once")
    with pytest.raises(PipelineError, match=(
            rf"^--out {tmp_path / 'out'} holds batches up to 5 that --checkpoint "
            rf"{tmp_path / 'fresh-checkpoint'} never ran: it was written with another "
            r"checkpoint \(give that one, or a new --out\)$")):
        archive.run_archive(args)


def test_a_checkpoint_on_another_file_system_is_refused_before_spark_starts(
        redis_process: RedisProcess, tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs a second file system (/dev/shm)")
    checkpoint = Path(tempfile.mkdtemp(prefix="tubeq-archive-", dir=shm))
    try:
        args = archive_args(redis_process.url, es.fresh_prefix(), tmp_path / "out",
                            checkpoint, "--once")
        with pytest.raises(PipelineError, match=(
                rf"^--out {tmp_path / 'out'} and --checkpoint {checkpoint} must be on one file "
                "system: a batch is staged in the checkpoint and renamed into the archive$")):
            archive.run_archive(args)
    finally:
        shutil.rmtree(checkpoint)


def test_a_local_folder_with_a_remote_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=(
            rf"^--out {tmp_path} and --checkpoint hdfs://namenode/checkpoint must be on one "
            "file system: ")):
        archive.check_folders(str(tmp_path), "hdfs://namenode/checkpoint")


def test_a_folder_that_is_not_local_needs_a_session_with_a_jvm() -> None:
    """Spark Connect (--remote) has no JVM on this side to move files on hdfs:// or s3a://."""
    with pytest.raises(PipelineError, match=r"^an archive that is not a local path needs a "):
        archive.files_for(object(), "hdfs://namenode/archive")  # type: ignore[arg-type]


def test_out_without_checkpoint_is_one_line() -> None:
    parser = argparse.ArgumentParser()
    archive.add_archive_arguments(parser)
    with pytest.raises(PipelineError, match=r"^archive --out needs --checkpoint "):
        archive.run_archive(parser.parse_args(["--out", "somewhere"]))


# ---------------------------------------------------------------------------------------------
# kill -9 mid-batch, every reader, mv and cp -r, --check and --clean, a restart.
# ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_killed_mid_batch_every_reader_reads_exactly_the_committed_events(
        spark: SparkSession, client: redis.Redis, redis_process: RedisProcess,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = es.fresh_prefix()
    written = es.write_events(client, es.key_of(prefix), EVENTS)
    out, checkpoint = tmp_path / "events", tmp_path / "checkpoint"
    argv = [sys.executable, "-m", "tubeq.pipeline", "--master", "local[2]", "archive",
            "--redis", redis_process.url, "--prefix", prefix, "--out", str(out),
            "--checkpoint", str(checkpoint), "--once", "--max-events-per-trigger", str(BATCH)]
    log_path = tmp_path / "killed-run.log"
    env = {**os.environ, "TMPDIR": str(tmp_path),
           archive.STALL_BEFORE_PUBLISHING_ENV: str(STALLED_BATCH)}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + STALL_WAIT_S
        stalled = f"archive: test stall before publishing batch {STALLED_BATCH}"
        while stalled not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the archive never reached the stalled batch"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)  # batch 3 written to staging, not published
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    # The kill landed mid-batch: batch 3's files were written (staged) and not published.
    staged = checkpoint / "staging" / f"batch={STALLED_BATCH}"
    assert list(staged.glob("date=*/tube=*/*.parquet"))
    assert layout.published_batches(out) == [0, 1, 2]
    commits, last_id = committed_through(checkpoint)
    assert commits == [0, 1, 2]
    committed = [w for w in written if id_key(w.stream_id) <= id_key(last_id)]
    assert len(committed) == STALLED_BATCH * BATCH
    assert len(client.xrange(es.key_of(prefix))) == EVENTS  # the stream still holds them all
    assert_read_by_all(spark, out, committed)

    # Moved and copied, the folder is the same archive.
    moved = tmp_path / "moved"
    os.rename(out, moved)
    copied = tmp_path / "copied"
    shutil.copytree(moved, copied)
    assert_read_by_all(spark, moved, committed)
    assert_read_by_all(spark, copied, committed)

    # The kill left nothing partial in the folder; an interrupted copy and a stray file would be.
    done = folder_command("--check", moved)
    assert (done.returncode, done.stdout) == (
        0, f"archive: --check {moved}: 3 batches, no partial or foreign files\n"), done.stderr
    part = next(moved.glob("batch=1/date=*/tube=*/*.parquet"))
    cut = part.with_name("part-99999-copy.parquet")
    truncated_copy(part, cut)
    (moved / "batch=1" / "_SUCCESS").write_bytes(b"")
    done = folder_command("--check", moved)
    assert done.returncode == 1
    assert f"archive: partial: {cut.relative_to(moved).as_posix()} (not a whole" in done.stdout
    assert "archive: foreign: batch=1/_SUCCESS " in done.stdout
    with pytest.raises(duckdb.InvalidInputException, match="No magic bytes found at end of"):
        by_duckdb(moved)  # what --check is for: a cut file breaks a reader
    done = folder_command("--clean", moved)
    assert done.returncode == 0, done.stderr
    assert not cut.exists()
    assert_read_by_all(spark, moved, committed)

    # Restarted on the same checkpoint in its new place: batch 3 is replayed and published.
    capsys.readouterr()
    assert archive.run_archive(archive_args(redis_process.url, prefix, moved, checkpoint,
                                            "--once", "--max-events-per-trigger", str(BATCH)),
                               spark) == 0
    assert f"archive: {EVENTS - len(committed)} events in 5 batches" in capsys.readouterr().out
    assert layout.published_batches(moved) == list(range(EVENTS // BATCH))
    assert not staged.exists()
    assert_read_by_all(spark, moved, written)
    assert folder_command("--check", moved).returncode == 0


def test_hadoop_file_systems_publish_a_batch_the_same_way(spark: SparkSession,
                                                          tmp_path: Path) -> None:
    """The publish steps through Hadoop's API (hdfs://, s3a://), here on ``file:`` URLs."""
    rows = [(f"{es.BASE_MS + i}-0", *es.event_fields(i).values()) for i in range(60)]
    events = archive.with_archive_date(spark.createDataFrame(rows, SPARK_DDL))
    out, staging = tmp_path / "out", tmp_path / "checkpoint" / "staging"
    publisher = archive.BatchPublisher(out.as_uri(), staging.as_uri(), archive.HadoopFiles(spark))
    publisher.publish(events, 7)
    assert layout.published_batches(out) == [7]
    assert not (staging / "batch=7").exists()
    assert by_pyarrow(out) == sorted(tuple(str(value) for value in row) for row in rows)
    assert by_duckdb(out) == by_pyarrow(out)
    assert by_spark(spark, out) == by_pyarrow(out)
    missing = (tmp_path / "no-such-batch").as_uri()
    with pytest.raises(PipelineError, match=f"^cannot rename {missing} to "):
        archive.HadoopFiles(spark).rename(missing, (out / "batch=8").as_uri())


# ---------------------------------------------------------------------------------------------
# The old format: Spark's file sink with its _spark_metadata log.
# ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_an_archive_of_the_old_format_is_refused_then_converted_and_continued(
        spark: SparkSession, client: redis.Redis, redis_process: RedisProcess,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = es.fresh_prefix()
    key = es.key_of(prefix)
    written = es.write_events(client, key, 500)
    out, checkpoint = tmp_path / "events", tmp_path / "checkpoint"
    # The old archive: the file sink over 5 batches, compacting its log every 2 (1.compact and
    # 3.compact, which lists batches 0-3, then 4).
    spark.conf.set("spark.sql.streaming.fileSink.log.compactInterval", "2")
    try:
        frame = archive.archive_frame(spark, {"redis": redis_process.url, "prefix": prefix,
                                              "maxEventsPerTrigger": "100"})
        query = (frame.writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint))
                 .partitionBy(*layout.ARCHIVE_PARTITIONS).trigger(availableNow=True).start())
        query.awaitTermination()
    finally:
        spark.conf.unset("spark.sql.streaming.fileSink.log.compactInterval")
    assert (out / "_spark_metadata" / "3.compact").exists()
    # A killed batch's leftover, which the log does not list and every reader but Spark reads.
    leftover = next(out.glob("date=*/tube=orders")) / "part-00000-killed.c000.snappy.parquet"
    leftover.write_bytes(b"PAR1")

    refusal = (f"^{out} is an archive of the old format \\(Spark's _spark_metadata log of "
               "absolute paths, which only Spark reads right, and only where it was "
               f"written\\); convert it once: tubeq-pipeline archive --convert {out}$")
    with pytest.raises(PipelineError, match=refusal):
        read_archive(spark, out)
    with pytest.raises(PipelineError, match=refusal):
        archive.run_archive(archive_args(redis_process.url, prefix, out, checkpoint, "--once"),
                            spark)
    done = folder_command("--check", out)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"archive: partial: {leftover.relative_to(out).as_posix()} (not listed in "
        "_spark_metadata: a batch that never committed)",
        f"archive: --check {out}: an archive of the old format, 1 partial files; convert it: "
        f"tubeq-pipeline archive --convert {out}"]
    done = folder_command("--clean", out)
    assert done.returncode == 1
    assert done.stderr.startswith(f"tubeq-pipeline: {out} is an archive of the old format")

    done = folder_command("--convert", out)
    assert done.returncode == 0, done.stderr
    assert "into 2 batch directories; 1 partial files dropped" in done.stdout
    assert layout.published_batches(out) == [3, 4]
    assert folder_command("--check", out).returncode == 0
    assert_read_by_all(spark, out, written)

    # The same checkpoint goes on, now publishing batch directories.
    written += es.write_events(client, key, 150, start=500)
    assert archive.run_archive(archive_args(redis_process.url, prefix, out, checkpoint, "--once"),
                               spark) == 0
    assert "archive: 150 events in 1 batches" in capsys.readouterr().out
    assert layout.published_batches(out) == [3, 4, 5]
    assert_read_by_all(spark, out, written)
