"""``tubeq-pipeline live``: the report's per-minute counts, kept current from a fed stream.

Each test writes known events (several minutes, tubes and reasons) to a private stream, runs the
live query on the module's SparkSession, and compares the file it wrote with counts the test
makes itself from what it wrote: once with ``--once`` runs (the table rebuilt, then grown), once
with the query running on while more events arrive and a reader opens the file all the while.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import SparkSession

from tests.pipeline import eventstream as es
from tubeq.pipeline import cli, live
from tubeq.pipeline.session import PipelineError
from tubeq.pipeline.tables import COUNTED_COLUMNS
from tubeq.redisio.process import RedisProcess, free_port

MINUTE_MS = 60_000
TUBES = ("orders", "mail", "007")
# Each (event, reason) the test writes, and the table's columns that must count it. Written out
# here rather than taken from tables.COUNTED, so the test checks the mapping, not repeats it.
COUNTED_AS: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("put", ""): ("put",),
    ("promoted", ""): ("promoted",),
    ("reserved", ""): ("reserved",),
    ("released", ""): ("released",),
    ("released", "hand-back"): ("released",),  # a consumer gave it back unstarted
    ("timed-out", ""): ("timed_out",),
    ("timed-out", "disconnect"): ("disconnected",),
    ("timed-out", "shutdown"): ("disconnected",),  # a stopping tubeq closed its connection
    ("timed-out", "reaped"): ("reaped",),
    ("touched", ""): ("touched",),
    ("buried", ""): ("buried", "buried_deliberate"),
    ("buried", "max-tries"): ("buried", "buried_max_tries"),
    ("buried", "expired"): ("buried", "buried_expired"),
    ("kicked", ""): ("kicked",),
    ("deleted", ""): ("deleted",),
    ("deleted", "finished"): ("deleted", "finished"),  # a finish is a delete too
    ("failed", ""): ("failed",),
    ("reprioritized", ""): (),  # an event no column counts: its tube and minute still have a row
}
KINDS = tuple(COUNTED_AS)
# How long a run may take to show what was written: Spark's micro-batches on two busy cores.
SETTLE_S = 120
READ_PAUSE_S = 0.01  # between a reader's opens: often, but leaving the cores to Spark


@pytest.fixture
def client(redis_process: RedisProcess) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_process.url)
    yield conn
    conn.close()


def events(minutes: Iterable[int], seed: int) -> list[dict[str, str | int]]:
    """Events in each of ``minutes`` (after ``es.BASE_MS``) for every tube, of every kind, in
    numbers that differ by tube, minute and kind; in time order, as tubeq writes them."""
    rows = []
    for minute in minutes:
        for t, tube in enumerate(TUBES):
            for k, (event, reason) in enumerate(KINDS):
                for n in range((seed + minute * 7 + t * 3 + k) % 4):
                    at = es.BASE_MS + minute * MINUTE_MS + (k * 4 + n) * 997 % MINUTE_MS
                    row = es.event_fields(len(rows), time_ms=at, tube=tube, event=event)
                    rows.append({**row, "reason": reason})
    return sorted(rows, key=lambda row: int(row["time_ms"]))


def expected(written: Iterable[Mapping[str, str | int]],
             keep_minutes: int) -> dict[tuple[str, int], dict[str, int]]:
    """The table the test expects: per (tube, minute) and per (``*``, minute), each column's
    count, for the last ``keep_minutes`` minutes up to the newest written."""
    counts: dict[tuple[str, int], Counter[str]] = {}
    for row in written:
        minute = int(row["time_ms"]) // MINUTE_MS * MINUTE_MS
        for tube in (str(row["tube"]), "*"):
            counts.setdefault((tube, minute), Counter()).update(
                COUNTED_AS[(str(row["event"]), str(row["reason"]))])
    newest = max(minute for _, minute in counts)
    return {key: {column: counter[column] for column in COUNTED_COLUMNS}
            for key, counter in counts.items()
            if key[1] > newest - keep_minutes * MINUTE_MS}


def as_counts(document: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, int]]:
    """The document's rows by (tube, minute); they must come in that order, with every column."""
    rows = document["rows"]
    assert document["columns"] == ["tube", "bucket_ms", *COUNTED_COLUMNS]
    assert all(list(row) == document["columns"] for row in rows)
    assert [(row["tube"], row["bucket_ms"]) for row in rows] == sorted(
        (row["tube"], row["bucket_ms"]) for row in rows)
    return {(row["tube"], row["bucket_ms"]): {column: row[column] for column in COUNTED_COLUMNS}
            for row in rows}


def live_args(url: str, prefix: str, out: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    live.add_live_arguments(parser)
    return parser.parse_args(["--redis", url, "--prefix", prefix, "--out", str(out), *extra])


def test_every_event_kind_has_its_columns() -> None:
    assert {column for columns in COUNTED_AS.values() for column in columns} == set(
        COUNTED_COLUMNS)


def test_once_builds_the_table_then_a_second_run_grows_it(
        spark: SparkSession, redis_process: RedisProcess, client: redis.Redis,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = es.fresh_prefix()
    # Through the command line's dispatcher: no events yet, so a table of no rows.
    assert cli.main(["live", "--redis", redis_process.url, "--prefix", prefix,
                     "--out", str(tmp_path), "--once"], spark) == 0
    assert as_counts(live.read_live(tmp_path)) == {}
    printed = capsys.readouterr().out
    assert printed == f"live: 0 events in 0 batches, to {tmp_path / live.LIVE_TABLE}\n"

    first = events(range(0, 4), seed=1)
    es.write(client, es.key_of(prefix), first)
    assert live.run_live(live_args(redis_process.url, prefix, tmp_path, "--once"), spark) == 0
    assert f"live: {len(first)} events in 1 batches" in capsys.readouterr().out
    table = live.read_live(tmp_path)
    assert as_counts(table) == expected(first, 60)
    assert table["keep_minutes"] == 60
    assert not [path for path in tmp_path.iterdir() if path.name != live.LIVE_TABLE]

    # More events: two minutes already there get more, three minutes are new.
    second = events(range(2, 7), seed=2)
    es.write(client, es.key_of(prefix), second)
    assert live.run_live(live_args(redis_process.url, prefix, tmp_path, "--once"), spark) == 0
    grown = as_counts(live.read_live(tmp_path))
    assert grown == expected(first + second, 60)
    before = as_counts(table)
    assert {key for key in grown if key not in before} == {
        (tube, es.BASE_MS + minute * MINUTE_MS) for tube in (*TUBES, "*") for minute in (4, 5, 6)}
    assert grown[("*", es.BASE_MS + 3 * MINUTE_MS)]["put"] > before[
        ("*", es.BASE_MS + 3 * MINUTE_MS)]["put"]

    # Only the last three minutes, counted back from the newest event's.
    args = live_args(redis_process.url, prefix, tmp_path, "--once", "--keep-minutes", "3")
    assert live.run_live(args, spark) == 0
    kept = as_counts(live.read_live(tmp_path))
    assert kept == expected(first + second, 3)
    assert {minute for _, minute in kept} == {es.BASE_MS + m * MINUTE_MS for m in (4, 5, 6)}


class Reader(threading.Thread):
    """Opens the live table over and over until told to stop; keeps what it saw and any error."""

    def __init__(self, out: Path) -> None:
        super().__init__(daemon=True)
        self.out = out
        self.stop = threading.Event()
        self.reads = 0
        self.batches: list[int] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.wait(READ_PAUSE_S):
            try:  # as a notebook would: the whole file, in one open
                document = json.loads((self.out / live.LIVE_TABLE).read_text())
                self.check_whole(document)
            except FileNotFoundError:
                if self.batches:  # replaced, never removed
                    self.errors.append("the table went missing")
            except Exception as exc:  # a partial file (JSONDecodeError) or a torn table
                self.errors.append(f"{type(exc).__name__}: {exc}")
            else:
                self.reads += 1
                self.batches.append(document["batch_id"])

    def check_whole(self, document: Mapping[str, Any]) -> None:
        """A whole table: its ``*`` rows are the sums of its tubes' rows, minute by minute."""
        counts = as_counts(document)
        sums: dict[int, Counter[str]] = {}
        for (tube, minute), row in counts.items():
            if tube != "*":
                sums.setdefault(minute, Counter()).update(row)
        for minute, total in sums.items():
            if {column: total[column] for column in COUNTED_COLUMNS} != counts[("*", minute)]:
                self.errors.append(f"minute {minute}: * is not the sum of the tubes")


def wait_for(condition: object, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + SETTLE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {SETTLE_S} s: {what}"
        time.sleep(0.2)


def shows(out: Path, table: dict[tuple[str, int], dict[str, int]]) -> bool:
    try:
        return as_counts(live.read_live(out)) == table
    except FileNotFoundError:
        return False


def state_rows(query: object) -> int:
    progress = getattr(query, "lastProgress", None) or {}
    return sum(int(operator["numRowsTotal"]) for operator in progress.get("stateOperators", []))


def test_a_running_query_keeps_the_table_current_and_readers_see_it_whole(
        spark: SparkSession, redis_process: RedisProcess, client: redis.Redis,
        tmp_path: Path) -> None:
    prefix = es.fresh_prefix()
    key = es.key_of(prefix)
    late_s = 60
    options = {"redis": redis_process.url, "prefix": prefix, "maxEventsPerTrigger": "40",
               "startingId": live.starting_id(int(time.time() * 1000), 60)}
    table = live.LiveTable(tmp_path / live.LIVE_TABLE, keep_minutes=60)
    reader = Reader(tmp_path)
    reader.start()
    first = events(range(0, 4), seed=3)
    es.write(client, key, first)
    query = live.start_live(spark, options, table, late_s, interval_s=0.2, once=False)
    try:
        wait_for(lambda: shows(tmp_path, expected(first, 60)), "the first events")
        second = events(range(3, 6), seed=4)
        es.write(client, key, second)
        wait_for(lambda: shows(tmp_path, expected(first + second, 60)), "the second events")
        groups = len({key for key in expected(first + second, 60) if key[0] != "*"})

        # Minute 1 is long past the watermark (the newest event is in minute 5, late_s 60): its
        # event is not counted, and its state is gone. Minute 6's is.
        old = {**es.event_fields(0, time_ms=es.BASE_MS + MINUTE_MS + 5, tube="orders",
                                 event="put"), "reason": ""}
        new = {**es.event_fields(1, time_ms=es.BASE_MS + 6 * MINUTE_MS + 5, tube="orders",
                                 event="put"), "reason": ""}
        es.write(client, key, [old, new])
        wait_for(lambda: shows(tmp_path, expected([*first, *second, new], 60)),
                 "the late event dropped, the new one counted")
        wait_for(lambda: 0 < state_rows(query) < groups, "state bounded by the watermark")
    finally:
        query.stop()
        reader.stop.set()
        reader.join()
    assert not reader.errors, reader.errors[:5]
    assert reader.reads >= 10
    assert len(set(reader.batches)) >= 4  # it read while the table was being rewritten
    assert reader.batches == sorted(reader.batches)
    assert [path.name for path in tmp_path.iterdir()] == [live.LIVE_TABLE]


# ---------------------------------------------------------------------------------------------
# The table without Spark, and every way the command fails.
# ---------------------------------------------------------------------------------------------


def rows_of(*keys: tuple[str, int], count: int = 1) -> list[Sequence[object]]:
    return [(tube, minute * MINUTE_MS, *[count] * len(COUNTED_COLUMNS)) for tube, minute in keys]


def test_rows_replace_theirs_and_the_oldest_minutes_leave() -> None:
    table = live.LiveTable(Path("unused"), keep_minutes=2)
    table.update(rows_of(("a", 10), ("b", 10), ("a", 11)))
    table.update(rows_of(("a", 11), count=5))
    assert [row[:3] for row in table.rows()] == [
        ("*", 10 * MINUTE_MS, 2), ("*", 11 * MINUTE_MS, 5), ("a", 10 * MINUTE_MS, 1),
        ("a", 11 * MINUTE_MS, 5), ("b", 10 * MINUTE_MS, 1)]
    table.update(rows_of(("b", 12)))
    assert {row[1] for row in table.rows()} == {11 * MINUTE_MS, 12 * MINUTE_MS}
    table.update(rows_of(("a", 3)))  # an old minute (from a watermark longer than the window)
    assert {row[1] for row in table.rows()} == {11 * MINUTE_MS, 12 * MINUTE_MS}


def test_a_write_that_fails_says_where_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    table = live.LiveTable(tmp_path / live.LIVE_TABLE, keep_minutes=5)
    (tmp_path / live.LIVE_TABLE).mkdir()
    with pytest.raises(IsADirectoryError):
        table.write(0)
    assert table.failure == f"cannot write {tmp_path / live.LIVE_TABLE}: Is a directory"
    assert [path.name for path in tmp_path.iterdir()] == [live.LIVE_TABLE]


def test_a_write_failing_in_the_query_is_one_line(
        spark: SparkSession, redis_process: RedisProcess, client: redis.Redis, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = es.fresh_prefix()
    es.write(client, es.key_of(prefix), events([0], seed=5))
    (tmp_path / live.LIVE_TABLE).mkdir()
    monkeypatch.setattr(live, "check_out", lambda out: None)  # let it reach the write
    assert live.run_live(live_args(redis_process.url, prefix, tmp_path, "--once"), spark) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"live: failed: cannot write {tmp_path / live.LIVE_TABLE}: Is a directory"
    assert not spark.streams.active


@pytest.mark.parametrize(("flag", "value", "error"), [
    ("--keep-minutes", "0", "argument --keep-minutes: must be at least 1, got 0"),
    ("--late", "-5", "argument --late: must be at least 0, got -5"),
    ("--interval", "0", "argument --interval: must be more than 0 seconds"),
    ("--seconds", "soon", "argument --seconds: not a number: 'soon'"),
    ("--batches", "nan", "argument --batches: not a number: 'nan'"),
])
def test_a_bad_argument_exits_2_with_one_error_line(
        flag: str, value: str, error: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["live", "--out", str(tmp_path / "out"), flag, value])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("usage: tubeq-pipeline live ")
    assert lines[-1] == f"tubeq-pipeline live: error: {error}"
    assert not (tmp_path / "out").exists()


def test_an_out_that_is_a_file_is_one_line_before_spark_starts(
        redis_process: RedisProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.write_text("not a directory")
    status = cli.main(["live", "--redis", redis_process.url, "--out", str(out), "--once"],
                      spark=None)
    assert status == 1
    assert capsys.readouterr().err == f"tubeq-pipeline: --out {out}: not a directory\n"


def test_an_unreachable_redis_is_one_line_before_spark_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(PipelineError, match=f"^cannot reach Redis at {url} "):
        live.run_live(live_args(url, "tubeq", tmp_path / "out", "--once"))
    assert not (tmp_path / "out").exists()


def test_an_out_that_cannot_hold_the_table_is_one_line(tmp_path: Path) -> None:
    (tmp_path / live.LIVE_TABLE).mkdir()
    with pytest.raises(PipelineError, match=(
            f"^--out {tmp_path}: {live.LIVE_TABLE} in it is a directory, not the table$")):
        live.check_out(str(tmp_path))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(PipelineError, match=(
            f"^--out {blocker / 'sub'}: cannot make it: Not a directory$")):
        live.check_out(str(blocker / "sub"))
