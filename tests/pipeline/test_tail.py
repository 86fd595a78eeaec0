"""``tubeq-pipeline tail``: live per-tube rates over a stream the test feeds, into memory."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from datetime import UTC, datetime

import pytest
import redis
from pyspark.sql import SparkSession

from tests.pipeline import eventstream as es
from tubeq.pipeline import tail
from tubeq.pipeline.session import PipelineError
from tubeq.redisio.process import RedisProcess, free_port

WINDOW_S = 10


def tail_args(url: str, prefix: str, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    tail.add_tail_arguments(parser)
    return parser.parse_args(["--redis", url, "--prefix", prefix, "--window", str(WINDOW_S),
                              "--interval", "0.5", "--sink", "memory", *extra])


def test_tail_counts_events_per_tube_and_name_per_window(
        spark: SparkSession, redis_process: RedisProcess) -> None:
    prefix = es.fresh_prefix()
    client = redis.Redis.from_url(redis_process.url)
    written = es.write_events(client, es.key_of(prefix), 600)
    client.close()
    args = tail_args(redis_process.url, prefix, "--from-start", "--batches", "2",
                     "--max-events-per-trigger", "300", "--query-name", "tail_rates")
    assert tail.run_tail(args, spark) == 0
    expected = Counter()
    for w in written:
        start_ms = int(w.fields["time_ms"]) // (WINDOW_S * 1000) * WINDOW_S * 1000
        expected[(start_ms, w.fields["tube"], w.fields["event"])] += 1
    got: dict[tuple[object, ...], int] = {}
    for row in spark.table("tail_rates").collect():
        key = (int(row.window_start.timestamp() * 1000), row.tube, row.event)
        got[key] = max(got.get(key, 0), row.events)  # update mode: a window's latest count
        assert row.per_second == row.events / WINDOW_S
    assert got == dict(expected)


def test_tail_on_an_unreachable_redis_fails_clearly(spark: SparkSession) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    args = tail_args(url, "tubeq", "--seconds", "60", "--query-name", "tail_down")
    with pytest.raises(PipelineError, match=f"^cannot reach Redis at {url} "):
        tail.run_tail(args, spark)
    assert not spark.streams.active


def test_format_rates_prints_no_table_for_a_batch_without_rows() -> None:
    assert tail.format_rates(4, []) is None


def test_format_rates_aligns_a_table_under_its_batch_number() -> None:
    text = tail.format_rates(7, [("2026-01-01 00:00:00", "007", "put", 12, 1.2),
                                 ("2026-01-01 00:00:00", "mail", "deleted", 3, 0.3)])
    assert text == "\n".join([
        "batch 7",
        "window_start         tube  event    events  per_second",
        "2026-01-01 00:00:00  007   put          12        1.20",
        "2026-01-01 00:00:00  mail  deleted       3        0.30",
    ])


def test_tail_prints_each_batch_sorted_by_window_tube_and_event(
        spark: SparkSession, redis_process: RedisProcess,
        capsys: pytest.CaptureFixture[str]) -> None:
    prefix = es.fresh_prefix()
    client = redis.Redis.from_url(redis_process.url)
    written = es.write_events(client, es.key_of(prefix), 600)
    client.close()
    args = tail_args(redis_process.url, prefix, "--from-start", "--batches", "2",
                     "--max-events-per-trigger", "300", "--sink", "console",
                     "--query-name", "tail_console")
    assert tail.run_tail(args, spark) == 0
    tables = [table.splitlines() for table in
              re.split(r"^(?=batch \d+$)", capsys.readouterr().out, flags=re.MULTILINE)
              if table.strip()]
    assert len(tables) >= 2
    got: dict[tuple[str, str, str], int] = {}
    for table in tables:
        assert re.fullmatch(r"batch \d+", table[0])
        assert table[1].split() == list(tail.RATE_COLUMNS)
        rows = [line.split() for line in table[2:]]
        assert rows, f"an empty table was printed: {table}"
        keys = [(f"{day} {time}", tube, event) for day, time, tube, event, _, _ in rows]
        assert keys == sorted(keys)
        for (day, time, tube, event, events, per_second) in rows:
            assert float(per_second) == pytest.approx(int(events) / WINDOW_S)
            got[(f"{day} {time}", tube, event)] = int(events)  # update mode: the latest count
    expected: Counter[tuple[str, str, str]] = Counter()
    for w in written:
        start_ms = int(w.fields["time_ms"]) // (WINDOW_S * 1000) * WINDOW_S * 1000
        start = datetime.fromtimestamp(start_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        expected[(start, str(w.fields["tube"]), str(w.fields["event"]))] += 1
    assert got == dict(expected)
