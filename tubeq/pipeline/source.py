"""Reading tubeq's lifecycle event stream from Spark: the ``tubeq`` Python Data Source.

Owns the reader side of the ``tubeq`` format: ``spark.read.format("tubeq")`` (a batch read of the
stream in parallel partitions) and ``spark.readStream.format("tubeq")`` (a micro-batch source
whose offsets are stream ids), the trim of what Spark has committed, and the detection of gaps.
The columns are ``tubeq.model.events.SPARK_DDL``; a row is one stream entry parsed by
``Event.from_entry``. ``df.write.format("tubeq")`` is the same format's writer, which lives in
``writer.py`` and is reached through :meth:`TubeqEventSource.writer`.

Options (Spark hands them over with lower-case keys; any case works for the caller):

* ``redis``: the Redis URL (default ``redis://127.0.0.1:6379/0``); ``prefix`` (default
  ``tubeq``) names the namespace whose stream (``Keys(prefix).events``) is read, or ``key``
  names a stream directly.
* ``partitions``: how many parallel partitions a read (or a micro-batch) is split into, by the
  millisecond part of the ids (default 2); a micro-batch of fewer than
  ``MIN_EVENTS_PER_PARTITION`` events per partition gets fewer (one for a small batch), since
  each partition starts a Python worker. ``pageSize``: entries per XRANGE (default 5000).
* ``startingId`` / ``endingId``: the first and last id read (inclusive; a bare millisecond time
  such as ``1700000000000`` works, so ``startingId = now - 1 h`` reads the last hour). A stream
  also takes ``earliest`` (the default) or ``latest``.
* Streaming only: ``maxEventsPerTrigger`` (admission control: at most that many events per
  micro-batch), ``trimCommitted`` (``true``: after Spark commits a batch, ``XTRIM MINID`` the
  stream up to the batch's last id, which is kept: never past what Spark has committed),
  ``onGap`` (``fail``, the default, or ``continue``), ``skipMalformed`` (``true`` or ``false``).

Offsets. A streaming offset is ``{"id": "<ms>-<seq>", "n": N}``: the last id a batch covers and
N, the number of entries the stream had ever received up to and including that id (Redis 7's
``entries-added`` counter, which trims never lower). Spark checkpoints it, so a restarted query
goes on from its last committed batch and replays an uncommitted one with the same offsets.

Gaps. Events after the committed offset that were deleted before they were read (by tubeq's
``--events-maxlen`` cap, ``XADD MAXLEN ~``, or anyone's XTRIM/XDEL) are a gap. Redis 7 does not
record trims in ``max-deleted-entry-id`` (only XDEL), so the check is by counting: when the
stream's first entry is past the committed id S, every entry the stream holds is after S, and
``entries-added - n(S) - length`` events after S are gone (exact). When the first entry is at or
before S, nothing after S was trimmed, and an XDEL after S shows as ``max-deleted-entry-id > S``
(of unknown size). The check runs when a batch is planned (``latestOffset``) and when it is read
(``partitions``, which covers a replay after a restart). A stream whose ids or count went
backwards (deleted, or a Redis restarted empty) is reported the same way. With ``onGap=fail`` a
gap fails the query with :class:`EventGap` naming the range and the count; with
``onGap=continue`` it is logged as a warning and recorded in the batch's end offset (``"gap":
{"after": S, "before": F, "lost": N}``, kept in the checkpoint's offset log and shown in the
query's progress, which ``tubeq-pipeline archive`` prints). Never skipped silently. The tasks
check once more as they page (the stream's first entry must not have passed the page they are
about to read); that check cannot count, so it may report a gap that held no event of its own
partition, and only when the cap trims the very events being read.

Malformed entries (``Event.from_entry`` raises :class:`tubeq.model.events.MalformedEvent`): by
default the read fails with the entry's id and what is wrong with it, because an archive that
leaves an entry out is not a record; ``skipMalformed=true`` leaves them out with one warning
per entry (its id and reason) and a count per task in the worker's log.

Rules: everything pickled to the workers (the source, readers, partitions) holds only plain
options; a Redis client is made inside ``partitions``/``read``/``latestOffset``/``commit`` and
closed there. Redis errors become :class:`SourceError` with the (password-free) URL.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa  # type: ignore[import-untyped]
import redis
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tubeq.model.events import FIELDS, INT_FIELDS, SPARK_DDL, Event, MalformedEvent
from tubeq.pipeline.writer import make_writer
from tubeq.store.keys import Keys

NAME: Final = "tubeq"
DEFAULT_REDIS: Final = "redis://127.0.0.1:6379/0"
DEFAULT_PARTITIONS: Final = 2
# A micro-batch's partitions each read at least this many events: each is a task, and each task a
# Python worker to start (its imports alone ~0.7 CPU-s), which a few thousand events do not repay
# (archive --once of 1,000 events: its batch took 11.7 s in one partition, 16.2 s in two, on a
# loaded 2-core machine; bench/RESULTS-pipeline.md). A worker parses ~100,000 events a second.
MIN_EVENTS_PER_PARTITION: Final = 50_000
# One XRANGE page: big enough that the round trip is small next to the parsing, small enough
# that a worker holds a few MB of entries at a time.
DEFAULT_PAGE_SIZE: Final = 5000
CONNECT_TIMEOUT_S: Final = 5.0
SOCKET_TIMEOUT_S: Final = 60.0
MAX_SEQ: Final = 2**64 - 1

log = logging.getLogger("tubeq.pipeline.source")

StreamId = tuple[int, int]
ZERO: Final[StreamId] = (0, 0)


class SourceError(RuntimeError):
    """The event source cannot do what it was asked (bad option, Redis unreachable, ...)."""


class EventGap(SourceError):
    """Events after the committed offset were deleted from the stream before they were read."""


def parse_id(text: str) -> StreamId:
    """``"<ms>-<seq>"`` or ``"<ms>"`` (seq 0) as a tuple; raises SourceError if it is neither."""
    ms, _, seq = text.partition("-")
    try:
        parsed = (int(ms), int(seq) if seq else 0)
    except ValueError:
        raise SourceError(f"not a stream id: {text!r}") from None
    if parsed[0] < 0 or parsed[1] < 0:
        raise SourceError(f"not a stream id: {text!r}")
    return parsed


def format_id(sid: StreamId) -> str:
    return f"{sid[0]}-{sid[1]}"


def previous_id(sid: StreamId) -> StreamId:
    """The greatest id before ``sid`` (``0-0`` stays ``0-0``)."""
    if sid[1] > 0:
        return (sid[0], sid[1] - 1)
    return (sid[0] - 1, MAX_SEQ) if sid[0] > 0 else ZERO


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flag(value: str | None, name: str) -> bool:
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off", ""):
        return False
    raise SourceError(f"option {name}: expected true or false, got {value!r}")


def _positive(value: str | None, name: str, default: int | None) -> int | None:
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise SourceError(f"option {name}: expected a positive integer, got {value!r}") from None
    if number <= 0:
        raise SourceError(f"option {name}: expected a positive integer, got {value!r}")
    return number


def redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, checked once (lower-case keys, as Spark passes them)."""

    redis_url: str
    key: str
    partitions: int
    page_size: int
    starting_id: str
    ending_id: str
    max_events_per_trigger: int | None
    trim_committed: bool
    on_gap: str
    skip_malformed: bool

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        known = {"redis", "prefix", "key", "partitions", "pagesize", "startingid", "endingid",
                 "maxeventspertrigger", "trimcommitted", "ongap", "skipmalformed", "path"}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise SourceError(f"unknown option(s) {unknown} for format {NAME!r}; known: "
                              f"{sorted(known - {'path'})}")
        if "key" in opts and "prefix" in opts:
            raise SourceError("give the stream as either 'prefix' or 'key', not both")
        key = opts.get("key") or Keys(opts.get("prefix", "tubeq")).events
        on_gap = opts.get("ongap", "fail").lower()
        if on_gap not in ("fail", "continue"):
            raise SourceError(f"option onGap: expected fail or continue, got {on_gap!r}")
        starting = opts.get("startingid", "earliest").strip()
        ending = opts.get("endingid", "+").strip()
        for value in (starting, ending):
            if value not in ("earliest", "latest", "-", "+"):
                parse_id(value)
        partitions = _positive(opts.get("partitions"), "partitions", DEFAULT_PARTITIONS)
        page = _positive(opts.get("pagesize"), "pageSize", DEFAULT_PAGE_SIZE)
        assert partitions is not None and page is not None
        return cls(
            redis_url=opts.get("redis", DEFAULT_REDIS), key=key, partitions=partitions,
            page_size=page, starting_id=starting, ending_id=ending,
            max_events_per_trigger=_positive(opts.get("maxeventspertrigger"),
                                             "maxEventsPerTrigger", None),
            trim_committed=_flag(opts.get("trimcommitted"), "trimCommitted"),
            on_gap=on_gap, skip_malformed=_flag(opts.get("skipmalformed"), "skipMalformed"),
        )


@contextlib.contextmanager
def connect(opts: SourceOptions) -> Iterator[redis.Redis]:
    """A Redis client for one call; Redis errors inside the block become SourceError."""
    where = redacted(opts.redis_url)
    try:
        client = redis.Redis.from_url(opts.redis_url, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                      socket_timeout=SOCKET_TIMEOUT_S)
    except ValueError as exc:
        raise SourceError(f"bad Redis URL {where!r}: {exc}") from None
    try:
        yield client
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise SourceError(f"cannot reach Redis at {where} (stream {opts.key}): {exc}") from None
    except redis.ResponseError as exc:
        raise SourceError(f"Redis at {where} refused a command on {opts.key}: {exc}") from None
    finally:
        client.close()


def ping(options: Mapping[str, str]) -> int:
    """Raise :class:`SourceError` unless ``options`` are the source's and their Redis answers
    a PING: what a command checks before it starts Spark. Returns how many entries the stream
    holds now (0 if there is none)."""
    opts = SourceOptions.parse(options)
    with connect(opts) as client:
        client.ping()
        return int(client.xlen(opts.key))


@dataclass(frozen=True)
class StreamInfo:
    """What XINFO STREAM says, or an empty stream when the key does not exist."""

    exists: bool
    length: int
    entries_added: int
    last_generated: StreamId
    max_deleted: StreamId
    first: StreamId | None

    @classmethod
    def of(cls, raw: Mapping[Any, Any] | None) -> StreamInfo:
        if raw is None:
            return cls(False, 0, 0, ZERO, ZERO, None)
        info = {_decode(k): v for k, v in raw.items()}
        if "entries-added" not in info:
            raise SourceError("the event source needs Redis 7.0 or newer (XINFO STREAM has no "
                              "entries-added, which the gap check counts with)")
        first = info.get("first-entry")
        return cls(True, int(info["length"]), int(info["entries-added"]),
                   parse_id(_decode(info["last-generated-id"])),
                   parse_id(_decode(info["max-deleted-entry-id"])),
                   parse_id(_decode(first[0])) if first else None)


def _info_and(client: redis.Redis, key: str, *calls: tuple[str, tuple[Any, ...]]
              ) -> tuple[StreamInfo, list[Any]]:
    """XINFO STREAM and the given stream reads in one MULTI, so they see one state."""
    pipe = client.pipeline(transaction=True)
    pipe.xinfo_stream(key)
    for method, args in calls:
        getattr(pipe, method)(key, *args)
    results = pipe.execute(raise_on_error=False)
    raw = results[0]
    if isinstance(raw, redis.ResponseError):
        if "no such key" not in str(raw).lower():
            raise raw
        raw = None
    for result in results[1:]:
        if isinstance(result, Exception):
            raise result
    return StreamInfo.of(raw), list(results[1:])


@dataclass(frozen=True)
class Gap:
    """Events after ``after`` deleted before they were read; ``lost`` is None when uncountable."""

    after: StreamId
    before: StreamId | None
    lost: int | None

    def describe(self, key: str) -> str:
        count = "an unknown number of" if self.lost is None else str(self.lost)
        upto = f" and before {format_id(self.before)}" if self.before is not None else ""
        return (f"{count} events of {key} after {format_id(self.after)}{upto} were deleted "
                f"before they were read (trimmed by the stream's cap, --events-maxlen, or "
                f"deleted by hand)")

    def as_offset(self) -> dict[str, Any]:
        return {"after": format_id(self.after),
                "before": format_id(self.before) if self.before is not None else None,
                "lost": self.lost}


def find_gap(info: StreamInfo, after: StreamId, seen: int) -> Gap | None:
    """The gap after ``after`` given that ``seen`` entries up to it were ever added, or None.

    A stream whose count or last id went backwards, or that holds more entries after ``after``
    than it ever received after it, was deleted or replaced: what the old one had after
    ``after`` is gone, counted as unknown.
    """
    if info.entries_added < seen or info.last_generated < after:
        return Gap(after, info.first, None)
    if info.first is None:
        lost = info.entries_added - seen
        return Gap(after, None, lost) if lost > 0 else None
    if info.first > after:
        lost = info.entries_added - seen - info.length
        if lost < 0:  # holds more after `after` than it ever received after it: replaced
            return Gap(after, info.first, None)
        return Gap(after, info.first, lost) if lost > 0 else None
    if info.max_deleted > after:
        return Gap(after, info.max_deleted, None)
    return None


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------

_ARROW_SCHEMA: Final = pa.schema(
    [pa.field("stream_id", pa.string())]
    + [pa.field(name, pa.int64() if name in INT_FIELDS else pa.string()) for name in FIELDS]
)


def _batch(events: Sequence[Event]) -> pa.RecordBatch:
    columns = [pa.array([e.stream_id for e in events], pa.string())]
    for name in FIELDS:
        kind = pa.int64() if name in INT_FIELDS else pa.string()
        columns.append(pa.array([getattr(e, name) for e in events], kind))
    return pa.RecordBatch.from_arrays(columns, schema=_ARROW_SCHEMA)


def _parse_page(entries: Sequence[tuple[bytes, dict[bytes, bytes]]], opts: SourceOptions,
                skipped: list[int]) -> list[Event]:
    events = []
    for sid, fields in entries:
        try:
            events.append(Event.from_entry(sid, fields))
        except MalformedEvent as exc:
            if not opts.skip_malformed:
                raise SourceError(f"malformed event in {opts.key}: {exc} (the read stops here; "
                                  f"option skipMalformed=true leaves such entries out)") from None
            skipped[0] += 1
            log.warning("tubeq source: skipped malformed entry: %s", exc)
    return events


@dataclass(frozen=True)
class IdRange(InputPartition):
    """A partition: the entries with ``after < id <= last`` (ids as ``<ms>-<seq>`` text).

    A streaming batch's partitions check for gaps as they page; the first one also knows
    ``seen``, how many entries the stream had ever received up to ``after`` (-1: unknown).
    """

    after: str
    last: str
    check_gaps: bool = False
    seen: int = -1


def split_range(after: StreamId, last: StreamId, parts: int, check_gaps: bool = False,
                seen: int = -1, head: StreamId | None = None) -> list[IdRange]:
    """``(after, last]`` cut into at most ``parts`` ranges of equal millisecond width, measured
    from ``head`` (the first entry there is, when it is past ``after``)."""
    if last <= after:
        return []
    base = head if head is not None and after < head <= last else after
    cuts = [after]
    width = last[0] - base[0]
    for i in range(1, parts):
        cut = (base[0] + width * i // parts, MAX_SEQ)
        if cuts[-1] < cut < last:
            cuts.append(cut)
    cuts.append(last)
    return [IdRange(format_id(lo), format_id(hi), check_gaps, seen if i == 0 else -1)
            for i, (lo, hi) in enumerate(itertools.pairwise(cuts))]


def read_range(opts: SourceOptions, part: IdRange) -> Iterator[pa.RecordBatch]:
    """The events of ``part``, one Arrow batch per page.

    With ``check_gaps`` each page is read in one MULTI with XINFO STREAM. The first partition
    counts: entries after its cursor deleted before it read them are a gap (exact, as
    :func:`find_gap`). The others cannot count: if the stream's first entry has passed their
    cursor, entries they had not read yet may be gone, and that is reported as a gap of unknown
    size (it may hold none of theirs; it only happens when the cap trims the batch being read).
    """
    cursor, last = parse_id(part.after), parse_id(part.last)
    seen = part.seen
    skipped = [0]
    with connect(opts) as client:
        while cursor < last:
            start = f"({format_id(cursor)}"
            if part.check_gaps:
                info, (entries,) = _info_and(
                    client, opts.key, ("xrange", (start, format_id(last), opts.page_size)))
                if seen >= 0:
                    gap = find_gap(info, cursor, seen)
                elif info.first is None or info.first > cursor:
                    gap = Gap(cursor, info.first, None)
                else:
                    gap = None
                if gap is not None:
                    _gap_in_task(opts, gap)
                    seen = -1  # counted once; the rest of the range is read as it is
            else:
                entries = client.xrange(opts.key, start, format_id(last), count=opts.page_size)
            if not entries:
                break
            events = _parse_page(entries, opts, skipped)
            if events:
                yield _batch(events)
            cursor = parse_id(_decode(entries[-1][0]))
            if seen >= 0:
                seen += len(entries)
            if len(entries) < opts.page_size:
                break
    if skipped[0]:
        log.warning("tubeq source: %d malformed entries skipped in (%s, %s]", skipped[0],
                    part.after, part.last)


def _gap_in_task(opts: SourceOptions, gap: Gap) -> None:
    message = gap.describe(opts.key) + " while the batch was being read"
    if opts.on_gap == "fail":
        raise EventGap(message + " (option onGap=continue goes on with a warning)")
    log.warning("tubeq source: %s", message)


# ---------------------------------------------------------------------------------------------
# The data source, its batch reader and its stream reader
# ---------------------------------------------------------------------------------------------


class TubeqEventSource(DataSource):
    """The ``tubeq`` format: tubeq's lifecycle events (read, readStream) and jobs (write)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return TubeqBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TubeqStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return make_writer(self.options, schema)


class TubeqBatchReader(DataSourceReader):
    """``spark.read.format("tubeq")``: the entries between startingId and endingId as they are
    when the read is planned, split into parallel partitions."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        start = "-" if opts.starting_id in ("earliest", "-") else opts.starting_id
        end = "+" if opts.ending_id in ("latest", "+") else opts.ending_id
        if opts.starting_id == "latest":
            return [IdRange("0-0", "0-0")]
        with connect(opts) as client:
            head = client.xrange(opts.key, start, end, count=1)
            tail = client.xrevrange(opts.key, end, start, count=1)
        if not head or not tail:
            return [IdRange("0-0", "0-0")]  # an empty read still needs one (empty) partition
        first = parse_id(_decode(head[0][0]))
        last = parse_id(_decode(tail[0][0]))
        return split_range(previous_id(first), last, opts.partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, IdRange)
        return read_range(self.opts, partition)


def _offset(sid: StreamId, seen: int, gap: Gap | None = None) -> dict[str, Any]:
    offset: dict[str, Any] = {"id": format_id(sid), "n": seen}
    if gap is not None:
        offset["gap"] = gap.as_offset()
    return offset


def _read_offset(offset: Mapping[str, Any]) -> tuple[StreamId, int]:
    return parse_id(str(offset["id"])), int(offset["n"])


class TubeqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("tubeq")``: micro-batches of ``(start id, end id]``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.target: tuple[StreamId, int] | None = None  # Trigger.AvailableNow's end

    def initialOffset(self) -> dict[str, Any]:
        opts = self.opts
        if opts.starting_id in ("earliest", "-"):
            return _offset(ZERO, 0)
        with connect(opts) as client:
            info, _ = _info_and(client, opts.key)
            if opts.starting_id == "latest":
                return _offset(info.last_generated, info.entries_added)
            after = previous_id(parse_id(opts.starting_id))
            # n(after) = everything ever added minus what the stream still holds after it.
            held_after = 0
            cursor = format_id(after)
            while True:
                page = client.xrange(opts.key, f"({cursor}", "+", count=opts.page_size) or []
                held_after += len(page)
                if len(page) < opts.page_size:
                    break
                cursor = _decode(page[-1][0])
        return _offset(after, max(info.entries_added - held_after, 0))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_events_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_events_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        with connect(self.opts) as client:
            info, _ = _info_and(client, self.opts.key)
        self.target = (info.last_generated, info.entries_added)

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        """The next batch's end: at most ``limit`` entries after ``start`` (and not past
        Trigger.AvailableNow's target), after checking nothing after ``start`` is missing."""
        after, seen = _read_offset(start) if start else (ZERO, 0)
        unchanged = start if start else _offset(after, seen)
        target = self.target
        if target is not None and target[0] <= after:
            return unchanged
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        calls: list[tuple[str, tuple[Any, ...]]] = []
        if max_rows is not None:
            stop = format_id(target[0]) if target is not None else "+"
            calls.append(("xrange", (f"({format_id(after)}", stop, max_rows)))
        with connect(self.opts) as client:
            info, results = _info_and(client, self.opts.key, *calls)
        gap = find_gap(info, after, seen)
        if gap is not None:
            self._report(gap)  # raises unless onGap=continue
        if gap is not None and gap.lost is None:
            # Uncountable (the stream was replaced, or XDEL): count again from its end.
            end, new_seen = info.last_generated, info.entries_added
            if target is not None:
                self.target = (max(end, target[0]), max(new_seen, target[1]))
        elif max_rows is not None and len(results[0]) == max_rows:
            end = parse_id(_decode(results[0][-1][0]))
            new_seen = seen + (gap.lost or 0 if gap is not None else 0) + max_rows
        elif target is not None:
            end, new_seen = target
        else:
            end, new_seen = info.last_generated, info.entries_added
        if end <= after and gap is None:
            return unchanged
        return _offset(max(end, after), new_seen, gap)

    def _report(self, gap: Gap) -> None:
        message = gap.describe(self.opts.key)
        if self.opts.on_gap == "fail":
            raise EventGap(f"{message}; the query stops here so the loss is seen (option "
                           f"onGap=continue goes on with a warning and records the gap in the "
                           f"batch's offset)")
        log.warning("tubeq source: %s; going on (onGap=continue)", message)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        after, seen = _read_offset(start)
        last, last_seen = _read_offset(end)
        if last <= after:
            return []
        # The offsets count every entry ever added: their difference is this batch's length.
        parts = max(1, min(self.opts.partitions,
                           -(-(last_seen - seen) // MIN_EVENTS_PER_PARTITION)))
        declared = end.get("gap")
        if declared is not None and declared.get("lost") is not None:
            seen += int(declared["lost"])  # the declared gap is accounted for, not re-reported
        elif declared is not None:
            seen = -1
        with connect(self.opts) as client:
            info, _ = _info_and(client, self.opts.key)
        if seen >= 0:
            # A replay after a restart reads what was planned then: check it is all still there.
            gap = find_gap(info, after, seen)
            if gap is not None:
                self._report(gap)
                seen = -1
        return split_range(after, last, parts, True, seen, info.first)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, IdRange)
        return read_range(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        if not self.opts.trim_committed:
            return
        last, _ = _read_offset(end)
        if last == ZERO:
            return
        with connect(self.opts) as client:
            # MINID deletes the ids below `last` only: the committed batch's last entry stays,
            # so nothing Spark has not committed is ever trimmed.
            client.xtrim(self.opts.key, minid=format_id(last), approximate=False)


def register(spark: Any) -> None:
    """Make ``format("tubeq")`` this source (reads and writes) on ``spark``."""
    spark.dataSource.register(TubeqEventSource)
