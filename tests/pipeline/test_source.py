"""The ``tubeq`` data source against a private Redis whose stream the tests write themselves.

The reader's offset and gap logic is called directly (no Spark) where that is the thing under
test; reads through Spark check what a user sees: every entry once, in the schema, split over
partitions, and each bad input (malformed entry, gap, unreachable Redis) as a clear error.
"""

from __future__ import annotations

import itertools

import pytest
import redis
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from tests.pipeline import eventstream as es
from tubeq.model.events import FIELDS
from tubeq.pipeline import source
from tubeq.pipeline.source import (
    EventGap,
    Gap,
    SourceError,
    SourceOptions,
    StreamInfo,
    TubeqStreamReader,
    _batch,
    _parse_page,
    find_gap,
    parse_id,
    split_range,
)
from tubeq.redisio.process import RedisProcess, free_port


def expected_rows(written: list[es.Written]) -> set[tuple[object, ...]]:
    return {(w.stream_id, *(w.fields[name] for name in FIELDS)) for w in written}


def batch_read(spark: SparkSession, url: str, prefix: str,
               **options: str) -> set[tuple[object, ...]]:
    reader = spark.read.format("tubeq").option("redis", url).option("prefix", prefix)
    for key, value in options.items():
        reader = reader.option(key, value)
    rows = reader.load().collect()
    as_tuples = [tuple(row) for row in rows]
    assert len(as_tuples) == len(set(as_tuples))
    return set(as_tuples)


# --- pure logic ------------------------------------------------------------------------------


def test_ids_parse_and_ranges_split_without_gaps_or_overlaps() -> None:
    assert parse_id("17-3") == (17, 3)
    assert parse_id("17") == (17, 0)
    with pytest.raises(SourceError, match="not a stream id"):
        parse_id("x-1")
    parts = split_range((100, 5), (1000, 2), 4)
    assert parts[0].after == "100-5" and parts[-1].last == "1000-2"
    for left, right in itertools.pairwise(parts):
        assert left.last == right.after
    assert split_range((5, 0), (5, 0), 3) == []
    # Measured from the first entry: an 'earliest' start does not put everything in one part.
    assert len(split_range((0, 0), (2000, 0), 2, head=(1000, 0))) == 2
    assert parse_id(split_range((0, 0), (2000, 0), 2, head=(1000, 0))[0].last)[0] == 1500


def test_find_gap_counts_what_was_deleted_after_the_offset() -> None:
    def info(length: int, added: int, first: tuple[int, int] | None,
             last: tuple[int, int] = (900, 0), deleted: tuple[int, int] = (0, 0)) -> StreamInfo:
        return StreamInfo(True, length, added, last, deleted, first)

    # 100 seen up to 50-0; 40 more added, all still there after the head (trimmed up to 50-0).
    assert find_gap(info(41, 140, (50, 0)), (50, 0), 100) is None
    assert find_gap(info(40, 140, (60, 0)), (50, 0), 100) is None
    # 10 of the 40 after it are gone.
    assert find_gap(info(30, 140, (70, 0)), (50, 0), 100) == Gap((50, 0), (70, 0), 10)
    # Everything gone.
    assert find_gap(info(0, 140, None), (50, 0), 100) == Gap((50, 0), None, 40)
    # Head before the offset, but an XDEL after it.
    assert find_gap(info(100, 150, (1, 0), deleted=(60, 0)), (50, 0), 100) == Gap(
        (50, 0), (60, 0), None)
    # The stream went backwards: replaced.
    assert find_gap(info(5, 5, (1, 0), last=(10, 0)), (50, 0), 100) is not None


def test_options_are_checked() -> None:
    with pytest.raises(SourceError, match="unknown option"):
        SourceOptions.parse({"maxeventsper": "5"})
    with pytest.raises(SourceError, match="positive integer"):
        SourceOptions.parse({"maxeventspertrigger": "0"})
    with pytest.raises(SourceError, match="onGap"):
        SourceOptions.parse({"ongap": "ignore"})
    with pytest.raises(SourceError, match="either 'prefix' or 'key'"):
        SourceOptions.parse({"prefix": "a", "key": "b"})
    opts = SourceOptions.parse({"maxEventsPerTrigger": "7", "prefix": "p"})
    assert opts.max_events_per_trigger == 7 and opts.key == es.key_of("p")


def test_a_traced_puts_trailing_field_is_read_and_left_out_of_the_row() -> None:
    """A put-with traceparent='s put entry (a trailing field after FIELDS) parses, and its
    row has the archive's columns, no more (protocol.md, "Trailing fields")."""
    fields = {k.encode(): str(v).encode() for k, v in es.event_fields(1).items()}
    traced = fields | {b"traceparent": b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    opts = SourceOptions.parse({"prefix": "p"})
    events = _parse_page([(b"1-0", fields), (b"1-1", traced)], opts, [0])
    assert [e.traceparent[:2] for e in events] == ["", "00"]
    batch = _batch(events)
    assert batch.schema.names == ["stream_id", *FIELDS]
    assert batch.to_pylist()[0] | {"stream_id": "1-1"} == batch.to_pylist()[1]


# --- the stream reader's offsets, called directly ------------------------------------------------


def test_offsets_follow_admission_control_and_available_now(client: redis.Redis,
                                                           redis_process: RedisProcess) -> None:
    prefix = es.fresh_prefix()
    written = es.write_events(client, es.key_of(prefix), 25)
    reader = TubeqStreamReader(SourceOptions.parse({"redis": redis_process.url,
                                                    "prefix": prefix}))
    start = reader.initialOffset()
    assert start == {"id": "0-0", "n": 0}
    first = reader.latestOffset(start, ReadMaxRows(10))
    assert first == {"id": written[9].stream_id, "n": 10}
    reader.prepareForTriggerAvailableNow()
    es.write_events(client, es.key_of(prefix), 5, start=25)  # after the target: not read
    second = reader.latestOffset(first, ReadMaxRows(10))
    third = reader.latestOffset(second, ReadMaxRows(10))
    assert third == {"id": written[24].stream_id, "n": 25}
    assert reader.latestOffset(third, ReadMaxRows(10)) == third
    assert reader.latestOffset(third, ReadAllAvailable()) == third


def test_trim_never_passes_the_committed_offset(client: redis.Redis,
                                                redis_process: RedisProcess) -> None:
    prefix = es.fresh_prefix()
    written = es.write_events(client, es.key_of(prefix), 30)
    opts = SourceOptions.parse({"redis": redis_process.url, "prefix": prefix,
                                "trimCommitted": "true"})
    reader = TubeqStreamReader(opts)
    end = reader.latestOffset(reader.initialOffset(), ReadMaxRows(12))
    reader.commit(end)
    left = [sid.decode() for sid, _ in client.xrange(es.key_of(prefix))]
    assert left == [w.stream_id for w in written[11:]]  # the committed last id stays
    # The next batch after a trim of our own is no gap.
    nxt = reader.latestOffset(end, ReadAllAvailable())
    assert nxt == {"id": written[-1].stream_id, "n": 30}
    # Without the option nothing is trimmed.
    TubeqStreamReader(SourceOptions.parse({"redis": redis_process.url,
                                           "prefix": prefix})).commit(nxt)
    assert client.xlen(es.key_of(prefix)) == 19


def test_a_trim_past_the_committed_offset_is_a_gap_with_its_count(
        client: redis.Redis, redis_process: RedisProcess) -> None:
    prefix = es.fresh_prefix()
    key = es.key_of(prefix)
    written = es.write_events(client, key, 100)
    opts = {"redis": redis_process.url, "prefix": prefix}
    reader = TubeqStreamReader(SourceOptions.parse(opts))
    committed = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert committed["n"] == 100
    written += es.write_events(client, key, 1000, start=100, maxlen=100)  # the cap trims
    held = {sid.decode() for sid, _ in client.xrange(key)}
    lost = [w.stream_id for w in written[100:] if w.stream_id not in held]
    assert lost  # the cap did trim events after the offset
    with pytest.raises(EventGap, match=f"{len(lost)} events of .* after {written[99].stream_id}"):
        reader.latestOffset(committed, ReadAllAvailable())
    # A batch planned before the trim and replayed after it (a restart) is checked as well.
    with pytest.raises(EventGap, match=f"{len(lost)} events of"):
        reader.partitions(committed, {"id": written[-1].stream_id, "n": 1100})
    going_on = TubeqStreamReader(SourceOptions.parse({**opts, "onGap": "continue"}))
    end = going_on.latestOffset(committed, ReadAllAvailable())
    assert end["gap"] == {"after": written[99].stream_id, "before": min(held, key=parse_id),
                          "lost": len(lost)}
    assert end["id"] == written[-1].stream_id and end["n"] == 1100
    # Planning the batch accepts the declared gap; the next one has none.
    assert going_on.partitions(committed, end)
    assert going_on.latestOffset(end, ReadAllAvailable()) == end


def test_a_micro_batch_has_a_partition_per_min_events(client: redis.Redis,
                                                      redis_process: RedisProcess,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each partition of a micro-batch is a task and a Python worker: a batch gets one per
    ``MIN_EVENTS_PER_PARTITION`` events (rounded up), at most the ``partitions`` option."""
    prefix = es.fresh_prefix()
    key = es.key_of(prefix)
    for i in range(40):  # 10 ms apart: the batch's id range splits evenly
        client.xadd(key, es.event_fields(i), id=f"{1_000 + i * 10}-0")
    reader = TubeqStreamReader(SourceOptions.parse({"redis": redis_process.url,
                                                    "prefix": prefix, "partitions": "4"}))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert len(reader.partitions(start, end)) == 1
    monkeypatch.setattr(source, "MIN_EVENTS_PER_PARTITION", 15)
    assert len(reader.partitions(start, end)) == 3
    monkeypatch.setattr(source, "MIN_EVENTS_PER_PARTITION", 1)
    parts = reader.partitions(start, end)
    assert len(parts) == 4
    assert (parts[0].after, parts[-1].last) == ("0-0", "1390-0")


def test_a_deleted_stream_is_a_gap(client: redis.Redis, redis_process: RedisProcess) -> None:
    prefix = es.fresh_prefix()
    key = es.key_of(prefix)
    es.write_events(client, key, 10)
    reader = TubeqStreamReader(SourceOptions.parse({"redis": redis_process.url,
                                                    "prefix": prefix}))
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    client.delete(key)
    with pytest.raises(EventGap, match="an unknown number of events"):
        reader.latestOffset(end, ReadAllAvailable())
    # A replay of a planned batch checks too (a restart after the trim).
    es.write_events(client, key, 10)
    with pytest.raises(EventGap):
        reader.partitions(end, {"id": "99999999999999-0", "n": 30})


# --- through Spark ---------------------------------------------------------------------------


def test_batch_read_returns_every_entry_once_over_partitions(
        spark: SparkSession, client: redis.Redis, redis_process: RedisProcess) -> None:
    prefix = es.fresh_prefix()
    written = es.write_events(client, es.key_of(prefix), 3000)
    assert batch_read(spark, redis_process.url, prefix, partitions="3",
                      pageSize="700") == expected_rows(written)
    frame = (spark.read.format("tubeq").option("redis", redis_process.url)
             .option("prefix", prefix).option("partitions", 3).load())
    assert frame.rdd.getNumPartitions() == 3
    # An id range (inclusive), as for "the last hour": startingId may be a bare ms time.
    lo, hi = written[1000], written[1999]
    assert batch_read(spark, redis_process.url, prefix, startingId=lo.stream_id,
                      endingId=hi.stream_id) == expected_rows(written[1000:2000])


def test_batch_read_of_an_empty_or_missing_stream_is_empty(
        spark: SparkSession, client: redis.Redis, redis_process: RedisProcess) -> None:
    assert batch_read(spark, redis_process.url, es.fresh_prefix()) == set()
    prefix = es.fresh_prefix()
    es.write_events(client, es.key_of(prefix), 5)
    client.xtrim(es.key_of(prefix), maxlen=0)
    assert batch_read(spark, redis_process.url, prefix) == set()


def test_malformed_entry_fails_with_its_id_or_is_skipped(
        spark: SparkSession, client: redis.Redis, redis_process: RedisProcess) -> None:
    prefix = es.fresh_prefix()
    key = es.key_of(prefix)
    good = es.write_events(client, key, 10)
    bad_fields = es.event_fields(10)
    bad_fields["pri"] = "high"
    bad = es.write(client, key, [bad_fields, {"hello": "world"}])
    good += es.write_events(client, key, 10, start=20)
    with pytest.raises(Exception, match=f"malformed event in .*entry {bad[0].stream_id}: bad pri"):
        batch_read(spark, redis_process.url, prefix)
    assert batch_read(spark, redis_process.url, prefix,
                      skipMalformed="true") == expected_rows(good)


def test_unreachable_redis_is_one_clear_error(spark: SparkSession) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(Exception, match=f"cannot reach Redis at {url}"):
        batch_read(spark, url, "nothing")


def test_stream_read_admits_max_events_per_trigger_and_reads_each_once(
        spark: SparkSession, client: redis.Redis, redis_process: RedisProcess) -> None:
    prefix = es.fresh_prefix()
    written = es.write_events(client, es.key_of(prefix), 2500)
    query = (spark.readStream.format("tubeq").option("redis", redis_process.url)
             .option("prefix", prefix).option("maxEventsPerTrigger", 1000).load()
             .writeStream.format("memory").queryName("source_stream")
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [1000, 1000, 500]
    rows = {tuple(r) for r in spark.table("source_stream").collect()}
    assert rows == expected_rows(written)
    assert spark.table("source_stream").count() == 2500
