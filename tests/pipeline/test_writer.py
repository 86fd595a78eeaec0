"""``df.write.format("tubeq")`` against a real tubeq and a real beanstalkd, counted job by job.

The session runs ``local[2,2]``: two cores and a task may fail once and be retried, which is what
the at-least-once test needs (plain ``local[2]`` never retries a task).
"""

from __future__ import annotations

import argparse
import datetime as dt
import secrets
from collections import Counter
from pathlib import Path

import greenstalk
import pytest
from pyspark.sql import DataFrame, SparkSession

from tests.pipeline.sparks import local_spark
from tests.support.servers import ServerProcess
from tubeq.model.events import FIELDS
from tubeq.pipeline import schedule
from tubeq.redisio.process import free_port

SCHEMA = "body STRING, tube STRING, priority BIGINT, delay BIGINT, ttr BIGINT"


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    """The process's session on local[2,2]: a failed task is retried once (the retry tests)."""
    return local_spark("local[2,2]")


def address(server: ServerProcess) -> str:
    return f"{server.host}:{server.port}"


def drain(server: ServerProcess, tube: str, limit: int = 100_000) -> list[tuple[bytes, dict]]:
    """Reserve and delete every ready job of ``tube``: (body, stats-job) each, in reserve order."""
    out = []
    with greenstalk.Client(server.address, encoding=None, watch=tube) as client:
        for _ in range(limit):
            try:
                job = client.reserve(timeout=0)
            except greenstalk.TimedOutError:
                break
            out.append((job.body, client.stats_job(job)))
            client.delete(job)
    return out


def tube_stats(server: ServerProcess, tube: str) -> dict:
    with greenstalk.Client(server.address) as client:
        try:
            return dict(client.stats_tube(tube))
        except greenstalk.NotFoundError:
            return {"current-jobs-ready": 0, "current-jobs-delayed": 0, "total-jobs": 0}


def fresh_tube(stem: str) -> str:
    return f"{stem}-{secrets.token_hex(3)}"


def test_rows_become_jobs(spark: SparkSession, tubeq: ServerProcess) -> None:
    a, b = fresh_tube("orders"), fresh_tube("mail")
    rows = [(f"job-{i}", a if i % 3 else b, i % 7, 3600 if i % 10 == 0 else 0, 30 + i % 5)
            for i in range(1000)]
    frame = spark.createDataFrame(rows, SCHEMA).repartition(4)
    result = schedule.schedule(frame, address(tubeq))
    assert not result.aborted
    assert (result.counts.put, result.counts.failed, result.counts.bad) == (1000, 0, {})
    assert result.counts.retried_tasks == 0
    delayed = {tube: sum(1 for row in rows if row[1] == tube and row[3]) for tube in (a, b)}
    for tube in (a, b):
        stats = tube_stats(tubeq, tube)
        assert stats["total-jobs"] == sum(1 for row in rows if row[1] == tube)
        assert stats["current-jobs-delayed"] == delayed[tube]
        jobs = drain(tubeq, tube)
        expected = {row[0].encode(): row for row in rows if row[1] == tube and not row[3]}
        assert sorted(body for body, _ in jobs) == sorted(expected)
        for body, stats_job in jobs:
            _, _, priority, _, ttr = expected[body]
            assert (stats_job["pri"], stats_job["ttr"], stats_job["tube"]) == (
                priority, ttr, tube)


def test_options_are_the_defaults_and_due_becomes_delay(spark: SparkSession,
                                                        tubeq: ServerProcess) -> None:
    tube = fresh_tube("close-unpaid")
    now = dt.datetime.now(dt.UTC)
    rows = [("past", now - dt.timedelta(hours=1)), ("soon", now + dt.timedelta(seconds=1800)),
            ("epoch-ms", int(now.timestamp() * 1000) + 600_000)]
    frame = spark.createDataFrame(
        [(body, due if isinstance(due, dt.datetime) else None,
          due if isinstance(due, int) else None) for body, due in rows],
        "body STRING, due_ts TIMESTAMP, due_ms BIGINT")
    frame = frame.selectExpr("body", "coalesce(unix_millis(due_ts), due_ms) AS due")
    result = schedule.schedule(frame, address(tubeq), tube=tube, priority=5, ttr=7)
    assert result.counts.put == 3
    with greenstalk.Client(tubeq.address, encoding=None, use=tube, watch=tube) as client:
        ready = client.peek_ready()
        assert ready.body == b"past"
        assert client.stats_job(ready)["delay"] == 0
        delays = {}
        while True:
            try:
                job = client.peek_delayed()
            except greenstalk.NotFoundError:
                break
            stats = client.stats_job(job)
            delays[job.body] = stats["delay"]
            assert (stats["pri"], stats["ttr"]) == (5, 7)
            client.delete(job)
    # Rounded up from the write's clock: a few seconds may pass between the row and the put.
    assert 1790 <= delays[b"soon"] <= 1800
    assert 590 <= delays[b"epoch-ms"] <= 600


def test_bad_rows_are_counted_not_fatal(spark: SparkSession, tubeq: ServerProcess) -> None:
    tube = fresh_tube("bad")
    good = [(f"ok-{i}", tube, 1, 0, 10) for i in range(20)]
    bad = [
        (None, tube, 1, 0, 10),                  # missing body
        ("x", tube, 1, -5, 10),                  # negative delay
        ("y" * 70_000, tube, 1, 0, 10),          # over the client-side 65535 check
        ("z", "-starts-with-dash", 1, 0, 10),    # bad tube name
        ("z", "has space", 1, 0, 10),            # bad tube name
        ("p", tube, -1, 0, 10),                  # negative priority
        ("t", tube, 1, 0, 2**32),                # ttr out of range
    ]
    frame = spark.createDataFrame(good + bad, SCHEMA).repartition(3)
    result = schedule.schedule(frame, address(tubeq))
    assert result.counts.put == 20
    assert result.counts.failed == 0
    assert result.counts.bad == {"missing_body": 1, "bad_delay": 1, "body_too_big": 1,
                                 "bad_tube": 2, "bad_priority": 1, "bad_ttr": 1}
    assert tube_stats(tubeq, tube)["total-jobs"] == 20
    summary = result.counts.summary()
    assert summary.startswith("put 20, deduplicated 0, failed 0, bad 7 (bad_delay 1, ")


def test_server_refusing_a_body_counts_it_too_big(spark: SparkSession,
                                                  tubeq: ServerProcess) -> None:
    """With the client-side check raised above the server's limit, JOB_TOO_BIG is the answer."""
    tube = fresh_tube("big")
    frame = spark.createDataFrame([("a" * 70_000, tube, 1, 0, 10), ("b", tube, 1, 0, 10)],
                                  SCHEMA).coalesce(1)
    result = schedule.schedule(frame, address(tubeq), max_job_size=1_000_000)
    assert (result.counts.put, result.counts.bad) == (1, {"body_too_big": 1})
    assert [body for body, _ in drain(tubeq, tube)] == [b"b"]


def test_retried_task_puts_again(spark: SparkSession, tubeq: ServerProcess) -> None:
    """At least once, measured: a task dies after 50 acknowledged puts and is retried whole."""
    tube = fresh_tube("retry")
    rows = [(f"order-{i}", tube, 1, 0, 10) for i in range(200)]
    frame = spark.createDataFrame(rows, SCHEMA).repartition(2)
    partition_sizes = frame.rdd.glom().map(len).collect()
    result = schedule.schedule(frame, address(tubeq), fail_once_after=50, fail_partition=0)
    # The counts come from the successful attempts: every row put once...
    assert (result.counts.put, result.counts.retried_tasks) == (200, 1)
    assert result.counts.retried_rows == partition_sizes[0]
    # ...but the server holds the failed attempt's 50 puts as well.
    bodies = Counter(body for body, _ in drain(tubeq, tube))
    assert sum(bodies.values()) == 250
    assert sorted(Counter(bodies.values()).items()) == [(1, 150), (2, 50)]
    assert set(bodies) == {row[0].encode() for row in rows}


def test_writes_to_real_beanstalkd(spark: SparkSession, beanstalkd: ServerProcess) -> None:
    tube = fresh_tube("bs")
    frame = spark.createDataFrame([(f"b{i}", tube, 9, 0, 20) for i in range(300)], SCHEMA)
    result = schedule.schedule(frame.repartition(3), address(beanstalkd))
    assert result.counts.put == 300
    jobs = drain(beanstalkd, tube)
    assert sorted(body for body, _ in jobs) == sorted(f"b{i}".encode() for i in range(300))
    assert {(stats["pri"], stats["ttr"]) for _, stats in jobs} == {(9, 20)}


def test_unreachable_server_fails_the_write(spark: SparkSession) -> None:
    frame = spark.createDataFrame([("x", "t", 1, 0, 10)], SCHEMA)
    with pytest.raises(schedule.WriteFailed, match="ConnectionRefusedError") as failed:
        schedule.schedule(frame, f"127.0.0.1:{free_port('127.0.0.1')}", timeout=2)
    assert "\n" not in str(failed.value)


KEYED = "body STRING, tube STRING, dedupe_key STRING"


def test_retried_task_with_dedupe_keys_puts_each_row_once(spark: SparkSession,
                                                          tubeq: ServerProcess) -> None:
    """Exactly once with keys: the retried task's first 50 rows answer DUPLICATE."""
    tube = fresh_tube("keyed")
    rows = [(f"order-{i}", tube, f"close-unpaid:{i}") for i in range(200)]
    frame = spark.createDataFrame(rows, KEYED).repartition(2)
    result = schedule.schedule(frame, address(tubeq), fail_once_after=50, fail_partition=0)
    assert result.counts.retried_tasks == 1
    assert (result.counts.put, result.counts.deduplicated) == (150, 50)
    # A second write of the same rows enqueues nothing: every key's job lives.
    again = schedule.schedule(frame, address(tubeq))
    assert (again.counts.put, again.counts.deduplicated, again.counts.failed) == (0, 200, 0)
    bodies = Counter(body for body, _ in drain(tubeq, tube))
    assert bodies == Counter(row[0].encode() for row in rows)  # each row once


def test_dedupe_keys_mix_with_plain_rows_and_bad_keys_are_counted(
        spark: SparkSession, tubeq: ServerProcess) -> None:
    tube = fresh_tube("keys")
    rows = [("a", tube, "k-1"), ("b", tube, "k-1"), ("c", tube, None), ("d", tube, None),
            ("e", tube, "has space"), ("f", tube, "x" * 201), ("g", tube, "a=b")]
    result = schedule.schedule(spark.createDataFrame(rows, KEYED).coalesce(1), address(tubeq))
    assert (result.counts.put, result.counts.deduplicated) == (3, 1)  # a, c, d; b refused
    assert result.counts.bad == {"bad_dedupe_key": 3}
    assert sorted(body for body, _ in drain(tubeq, tube)) == [b"a", b"c", b"d"]


def test_dedupe_keys_need_tubeq(spark: SparkSession, beanstalkd: ServerProcess) -> None:
    """beanstalkd has no put-with: keyed rows fail, counted and never sent (beanstalkd would
    read their bodies as commands); plain rows pass."""
    tube = fresh_tube("bs-keys")
    rows = [("a", tube, "k-1"), ("b", tube, None)]
    result = schedule.schedule(spark.createDataFrame(rows, KEYED).coalesce(1),
                               address(beanstalkd))
    assert (result.counts.put, result.counts.failed) == (1, 1)
    assert result.counts.errors == ["dedupe_key: the server has no put-with (not tubeq)"]
    assert [body for body, _ in drain(beanstalkd, tube)] == [b"b"]


GROUPED = "body STRING, tube STRING, group STRING"


def test_a_group_column_puts_each_row_in_its_group(spark: SparkSession,
                                                   tubeq: ServerProcess) -> None:
    """Rows of one tenant first, then another's: the tube serves the groups in turns; a bad
    group is counted, a null one is put without a group."""
    tube = fresh_tube("groups")
    rows = [*((f"a{i}", tube, "tenant-a") for i in range(3)), ("b0", tube, "tenant-b"),
            ("plain", tube, None), ("bad", tube, "has space")]
    result = schedule.schedule(spark.createDataFrame(rows, GROUPED).coalesce(1), address(tubeq))
    assert result.counts.put == 5 and result.counts.bad == {"bad_group": 1}
    assert [body for body, _ in drain(tubeq, tube)] == [b"a0", b"b0", b"plain", b"a1", b"a2"]


def test_bad_options_fail_before_any_put(spark: SparkSession, tubeq: ServerProcess) -> None:
    frame = spark.createDataFrame([("x",)], "body STRING")
    for options, message in (({"tube": "-no"}, "tube"), ({"ttr": "0"}, "ttr")):
        with pytest.raises(schedule.WriteFailed, match=message):
            schedule.schedule(frame, address(tubeq), **options)
    with pytest.raises(schedule.WriteFailed, match="host:port"):
        schedule.schedule(frame, "nowhere")
    no_body: DataFrame = spark.createDataFrame([("x",)], "payload STRING")
    with pytest.raises(schedule.WriteFailed, match="body"):
        schedule.schedule(no_body, address(tubeq))


@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet"])
def test_schedule_command(spark: SparkSession, tubeq: ServerProcess, tmp_path: Path,
                          suffix: str, capsys: pytest.CaptureFixture[str]) -> None:
    tube = fresh_tube("cli")
    frame = spark.createDataFrame([(f"c{i}", 0 if i else -1) for i in range(10)],
                                  "body STRING, delay BIGINT").coalesce(1)
    path = tmp_path / f"input{suffix}"
    if suffix == ".csv":
        frame.write.option("header", "true").csv(str(path))
    elif suffix == ".json":
        frame.write.json(str(path))
    else:
        frame.write.parquet(str(path))
    args = argparse.Namespace(input=str(path), address=address(tubeq), tube=tube,
                              priority=None, delay=None, ttr=None)
    assert schedule.run_schedule(args, spark) == 0
    assert capsys.readouterr().out.strip() == "put 9, deduplicated 0, failed 0, bad 1 (bad_delay 1)"
    assert tube_stats(tubeq, tube)["total-jobs"] == 9


def test_schedule_command_reads_csv_as_rfc_4180(spark: SparkSession, tubeq: ServerProcess,
                                              tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A CSV written the usual way (pandas.to_csv: a quote inside a field is doubled, a field
    with a comma, quote or newline is quoted) gives every body back byte for byte."""
    import pandas as pd

    bodies = ['{"order": 15}', "plain", "a, b, c", 'say "hi", then\n"bye"', "two\nlines",
              '""', "\\n is not a newline", "ends with a quote\""]
    tube = fresh_tube("csv")
    path = tmp_path / "orders.csv"
    pd.DataFrame({"body": bodies, "delay": [0] * len(bodies)}).to_csv(path, index=False)
    assert '"{""order"": 15}"' in path.read_text()  # the file really is RFC 4180's
    args = argparse.Namespace(input=str(path), address=address(tubeq), tube=tube,
                              priority=None, delay=None, ttr=None)
    assert schedule.run_schedule(args, spark) == 0
    assert capsys.readouterr().out.strip() == (
        f"put {len(bodies)}, deduplicated 0, failed 0, bad 0")
    assert Counter(body for body, _ in drain(tubeq, tube)) == Counter(
        body.encode() for body in bodies)


def test_after_a_schedule_the_tubeq_format_still_reads_events(spark: SparkSession,
                                                               tubeq: ServerProcess) -> None:
    # One format reads events and writes jobs: schedule() registering it must not leave the
    # session with a write-only "tubeq" (it once did, and spark.read.format("tubeq") failed).
    frame = spark.createDataFrame([("one", fresh_tube("both"), 0, 0, 30)], SCHEMA)
    assert schedule.schedule(frame, address(tubeq)).counts.put == 1
    events = spark.read.format("tubeq").option("redis", tubeq.extra["redis_url"]).load()
    assert events.columns == ["stream_id", *FIELDS]
