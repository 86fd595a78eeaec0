"""The archive: Parquet by date and tube, exactly once across a kill -9, gaps never silent.

The events are written by the tests themselves (``eventstream``), except in the end-to-end test,
where a real tubeq with ``--events on`` writes them as its jobs live. The archive is read back
with ``report.read_archive``, the way the report reads it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from tests.pipeline import archives
from tests.pipeline import eventstream as es
from tests.support.servers import TubeqCluster
from tubeq.client import Client
from tubeq.pipeline import archive, layout
from tubeq.pipeline.report import read_archive
from tubeq.pipeline.session import PipelineError
from tubeq.redisio.process import RedisProcess, free_port

KILL_EVENTS = 4_000
KILL_BATCH = 400
# The first run is killed once this many batches are committed: well before its 10th (each
# batch is a Spark job of its own; the test polls every 50 ms). The second run archives the rest.
KILL_AFTER_BATCHES = 3
KILL_WAIT_S = 240.0


def archive_args(url: str, prefix: str, out: Path, *extra: str) -> argparse.Namespace:
    return archives.archive_args(url, prefix, out / "events", out / "checkpoint", *extra)


def archived_ids(spark: SparkSession, out: Path) -> list[str]:
    return [r.stream_id for r in read_archive(spark, out / "events").select("stream_id").collect()]


def committed_batches(out: Path) -> int:
    return len(layout.published_batches(out / "events"))


def test_archive_is_partitioned_by_date_and_tube_and_readable_by_the_report(
        spark: SparkSession, client: redis.Redis, redis_process: RedisProcess, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    prefix = es.fresh_prefix()
    day = 86_400_000
    rows = [es.event_fields(i, time_ms=es.BASE_MS + (i % 2) * day + i) for i in range(300)]
    written = es.write(client, es.key_of(prefix), rows)
    assert archive.run_archive(archive_args(redis_process.url, prefix, tmp_path, "--once"),
                               spark) == 0
    assert "archive: 300 events in 1 batches" in capsys.readouterr().out
    frame = spark.read.parquet(str(tmp_path / "events"))
    dates = {r.date for r in frame.select("date").distinct().collect()}
    assert {str(d) for d in dates} == {"2026-01-01", "2026-01-02"}
    assert {p.name for p in (tmp_path / "events").glob("batch=0/date=*/tube=*")} == {
        f"tube={t}" for t in es.TUBES}
    back = {tuple(r) for r in read_archive(spark, tmp_path / "events").collect()}
    assert back == {(w.stream_id, *w.fields.values()) for w in written}
    # Nothing new: a second run archives nothing and duplicates nothing.
    assert archive.run_archive(archive_args(redis_process.url, prefix, tmp_path, "--once"),
                               spark) == 0
    assert "archive: 0 events in 0 batches" in capsys.readouterr().out
    assert len(archived_ids(spark, tmp_path)) == 300


def test_an_empty_stream_archives_nothing(spark: SparkSession, redis_process: RedisProcess,
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = archive_args(redis_process.url, es.fresh_prefix(), tmp_path, "--once")
    assert archive.run_archive(args, spark) == 0
    assert "archive: 0 events in 0 batches" in capsys.readouterr().out
    assert archived_ids(spark, tmp_path) == []


@pytest.mark.timeout(600)
def test_killed_mid_run_and_run_again_archives_every_event_exactly_once(
        spark: SparkSession, client: redis.Redis, redis_process: RedisProcess,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = es.fresh_prefix()
    key = es.key_of(prefix)
    written = es.write_events(client, key, KILL_EVENTS)
    flags = ["--once", "--trim", "--max-events-per-trigger", str(KILL_BATCH)]
    argv = [sys.executable, "-m", "tubeq.pipeline", "--master", "local[2]", "archive",
            "--redis", redis_process.url, "--prefix", prefix, "--out", str(tmp_path / "events"),
            "--checkpoint", str(tmp_path / "checkpoint"), *flags]
    log_path = tmp_path / "first-run.log"
    with log_path.open("wb") as log:
        # TMPDIR: the killed command's Spark log (tubeq.pipeline.cli) stays with the test's files.
        proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + KILL_WAIT_S
        while committed_batches(tmp_path) < KILL_AFTER_BATCHES:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the first run committed nothing in time"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # in the middle of its run, batches in flight
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = archived_ids(spark, tmp_path)
    assert 0 < len(before) < KILL_EVENTS  # killed halfway: some archived, not all
    assert len(before) == len(set(before))

    assert archive.run_archive(archive_args(redis_process.url, prefix, tmp_path, *flags),
                               spark) == 0
    out = capsys.readouterr().out
    assert "gap" not in out.lower()
    ids = archived_ids(spark, tmp_path)
    assert len(ids) == KILL_EVENTS
    assert len(set(ids)) == KILL_EVENTS
    assert set(ids) == {w.stream_id for w in written}
    # --trim trimmed what was committed, and never an event after it.
    left = [sid.decode() for sid, _ in client.xrange(key)]
    assert 0 < len(left) < KILL_EVENTS
    assert left == [w.stream_id for w in written[-len(left):]]


def test_a_gap_stops_the_archive_or_is_reported_and_skipped(
        spark: SparkSession, client: redis.Redis, redis_process: RedisProcess,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = es.fresh_prefix()
    key = es.key_of(prefix)
    written = es.write_events(client, key, 200)
    assert archive.run_archive(archive_args(redis_process.url, prefix, tmp_path, "--once"),
                               spark) == 0
    written += es.write_events(client, key, 2000, start=200, maxlen=150)  # the cap trims
    held = {sid.decode() for sid, _ in client.xrange(key)}
    lost = [w for w in written[200:] if w.stream_id not in held]
    assert lost
    capsys.readouterr()
    assert archive.run_archive(archive_args(redis_process.url, prefix, tmp_path, "--once"),
                               spark) == 1
    assert (f"archive: failed: {len(lost)} events of {key} after {written[199].stream_id} "
            f"and before") in capsys.readouterr().err
    assert len(archived_ids(spark, tmp_path)) == 200  # nothing past the gap was archived

    assert archive.run_archive(archive_args(redis_process.url, prefix, tmp_path, "--once",
                                            "--on-gap", "continue"), spark) == 0
    out = capsys.readouterr().out
    assert (f"archive: GAP: {len(lost)} events after {written[199].stream_id} were deleted "
            "before they were archived") in out
    assert "1 gap(s)" in out
    ids = archived_ids(spark, tmp_path)
    assert sorted(ids) == sorted(w.stream_id for w in written[:200]) + sorted(held)


def test_a_malformed_entry_stops_the_archive_with_its_id(
        spark: SparkSession, client: redis.Redis, redis_process: RedisProcess,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = es.fresh_prefix()
    key = es.key_of(prefix)
    es.write_events(client, key, 5)
    bad = es.write(client, key, [{"event": "put", "id": 1}])
    es.write_events(client, key, 5, start=5)
    assert archive.run_archive(archive_args(redis_process.url, prefix, tmp_path, "--once"),
                               spark) == 1
    err = capsys.readouterr().err
    assert f"archive: failed: malformed event in {key}: entry {bad[0].stream_id}: missing" in err
    assert archive.run_archive(archive_args(redis_process.url, prefix, tmp_path, "--once",
                                            "--skip-malformed"), spark) == 0
    assert len(archived_ids(spark, tmp_path)) == 10


def test_unreachable_redis_is_one_clear_error(spark: SparkSession, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(PipelineError, match=f"^cannot reach Redis at {url} "):
        archive.run_archive(archive_args(url, "tubeq", tmp_path, "--once"), spark)
    assert not (tmp_path / "checkpoint").exists()


async def _workload(host: str, port: int, tube: str, jobs: int, done: int) -> None:
    async with Client(host, port) as conn:
        await conn.use(tube)
        await conn.watch(tube)
        await conn.ignore("default")
        for i in range(jobs):
            await conn.put(f"job {i}", ttr=30)
        for _ in range(done):
            job = await conn.reserve()
            await conn.delete(job.id)


def test_a_real_tubeq_with_events_on_is_archived(
        spark: SparkSession, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster = TubeqCluster(tmp_path_factory.mktemp("archive-tubeq"))
    cluster.start_redis()
    try:
        server = cluster.start(label="tubeq-events", flags=("--events", "on"))
        asyncio.run(_workload(server.host, server.port, "archived", jobs=30, done=12))
        args = archive_args(server.extra["redis_url"], server.extra["prefix"], tmp_path,
                            "--once", "--trim")
        assert archive.run_archive(args, spark) == 0
    finally:
        cluster.stop_all()
    assert "archive: 54 events in 1 batches" in capsys.readouterr().out
    rows = read_archive(spark, tmp_path / "events").collect()
    assert Counter((r.tube, r.event) for r in rows) == {
        ("archived", "put"): 30, ("archived", "reserved"): 12, ("archived", "deleted"): 12}
    assert {r.id for r in rows if r.event == "put"} == {r.id for r in rows} and len(
        {r.id for r in rows}) == 30
    today = dt.datetime.now(dt.UTC).date()
    dates = {r.date for r in spark.read.parquet(str(tmp_path / "events")).collect()}
    assert {str(d) for d in dates} <= {str(today), str(today - dt.timedelta(days=1))}
