"""Writing jobs from Spark: ``df.write.format("tubeq").option("address", "HOST:PORT").save()``.

Owns the Python Data Source writer that turns each row of a DataFrame into one ``put`` on a
tubeq (or any beanstalkd) server, the checks that decide a row is bad, and the counts a write
reports. The ``tubeq`` format that reaches it is ``source.py``'s (one format reads events and
writes jobs); the driver side and the command are ``schedule.py``'s.

Columns (any other column is ignored; select or alias to these names):

* ``body`` (string, as UTF-8, or binary), required;
* ``tube`` (string), else the ``tube`` option (default ``default``);
* ``priority`` (0..2**32-1), else the ``priority`` option (default 2**31, as tubeq.client);
* ``delay`` (seconds) or ``due`` (a timestamp, or epoch milliseconds): when the job becomes
  ready. A due time is turned into a delay when the row is written (rounded up to whole seconds;
  a due time already past is delay 0). Else the ``delay`` option (default 0);
* ``ttr`` (seconds), else the ``ttr`` option (default 60);
* ``dedupe_key`` (string), see "Retries" below;
* ``group`` (string, spelled as a tube name): the job's group in its tube (put-with group=,
  protocol.md "Groups"); a row whose group is null is put without one. Like a key, it needs
  tubeq (a row with a group for another server is counted ``failed``, never sent).

Options (lower-case keys, as Spark hands them over): ``address`` (required, ``host:port``),
``tube``, ``priority``, ``delay``, ``ttr``, ``max_job_size`` (default 65535, the server's
default ``-z``), ``batch`` (puts sent before reading their replies, default 128), ``timeout``
(socket seconds, default 10), ``report_file`` (where the driver writes the counts as JSON),
``fail_once_after`` and ``fail_partition`` (failure injection for tests, below).

Counts: each task returns :class:`WriteCounts` as its commit message: ``put`` (the server
answered INSERTED, or BURIED with an id: stored but buried, out of memory), ``deduplicated`` (a
row with a ``dedupe_key`` whose job already lives: DUPLICATE, nothing enqueued), ``failed`` (the
server refused a well-formed put: DRAINING, OUT_OF_MEMORY, ...; or a keyed row for a server
without put-with, never sent), ``bad`` per reason (checked before sending: missing or non-text
body, body too big, bad tube name, negative or out-of-range delay/priority/ttr, a dedupe key
that is not 1-200 printable ASCII bytes without space or ``=``, a group that is no tube name;
a JOB_TOO_BIG answer counts as too big too). Bad and failed rows are counted, never fatal. A
connection that cannot be made or is lost fails the task, and Spark retries it.

Retries: without a ``dedupe_key`` column this writer is **at least once**. A task that fails
after some puts were acknowledged and is retried puts those rows again (plain ``put`` has no
idempotence). With one, a row with a key is written with tubeq's deduplicated put (``put-with
... key=<dedupe_key>``, protocol.md): the retried task's rows whose jobs the failed attempt
already stored answer ``DUPLICATE`` and are counted as ``deduplicated``, so the server holds
each keyed row once, **exactly once** as long as the first job is not deleted before the retry
(a key is free again once its job is deleted). A row whose key is null is put plainly. The key
is tubeq's: beanstalkd answers ``put-with`` UNKNOWN_COMMAND, counted as ``failed``. What a retry
costs is measured in the tests: with ``fail_once_after=N`` the first attempt of partition
``fail_partition`` (default 0) fails after N acknowledged puts and Spark retries it: without keys
the server holds exactly N duplicate jobs, with keys none. The driver's counts cover the
successful attempts only (Spark drops a failed attempt's commit message); ``retried_tasks`` /
``retried_rows`` say how many rows a retried task wrote: an upper bound on the duplicates of an
unkeyed write.

Rules: the writer object is pickled to the executors, so it holds only plain options; the socket
is made inside :meth:`TubeqDataSourceWriter.write`, per task, and closed there. The protocol
client here is synchronous and tiny on purpose (an executor task is synchronous code); it reuses
the bundled client's sans-IO reply parser.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from tubeq.client.parser import Reply, ReplyParser
from tubeq.client.wire import CRLF, DEFAULT_PRIORITY, DEFAULT_TTR, DEFAULT_TUBE, U32_MAX
from tubeq.protocol.limits import DEFAULT_MAX_JOB_SIZE, MAX_TUBE_NAME, TUBE_NAME_CHARS

# Puts sent before their replies are read. tubeq stops reading a connection at 128 unanswered
# commands (flow control) and beanstalkd at none; 128 keeps one round trip per 128 jobs without
# ever leaning on that limit. A batch also closes at BATCH_BYTES, so big bodies do not pile up.
DEFAULT_BATCH: Final = 128
BATCH_BYTES: Final = 256 * 1024
DEFAULT_TIMEOUT_S: Final = 10.0

# The reasons a row is bad, as the counts name them.
MISSING_BODY: Final = "missing_body"
BAD_BODY: Final = "bad_body"
BODY_TOO_BIG: Final = "body_too_big"
BAD_TUBE: Final = "bad_tube"
BAD_DELAY: Final = "bad_delay"
BAD_PRIORITY: Final = "bad_priority"
BAD_TTR: Final = "bad_ttr"
BAD_KEY: Final = "bad_dedupe_key"
BAD_GROUP: Final = "bad_group"

_NAME_BYTES: Final = frozenset(TUBE_NAME_CHARS)


class InjectedFailure(RuntimeError):
    """The failure ``fail_once_after`` asks for: a task dying after some puts went through."""


@dataclass
class WriteCounts(WriterCommitMessage):
    """What one task (or, summed, the whole write) did."""

    put: int = 0
    deduplicated: int = 0
    failed: int = 0
    bad: dict[str, int] = field(default_factory=dict)
    retried_tasks: int = 0  # tasks whose successful attempt was not their first
    retried_rows: int = 0  # rows those attempts wrote: at most this many may be duplicates
    errors: list[str] = field(default_factory=list)  # the first few refusals, for the report

    @property
    def bad_total(self) -> int:
        return sum(self.bad.values())

    def add(self, other: WriteCounts) -> None:
        self.put += other.put
        self.deduplicated += other.deduplicated
        self.failed += other.failed
        self.bad = dict(Counter(self.bad) + Counter(other.bad))
        self.retried_tasks += other.retried_tasks
        self.retried_rows += other.retried_rows
        self.errors = (self.errors + other.errors)[:MAX_ERRORS]

    def summary(self) -> str:
        bad = ", ".join(f"{reason} {count}" for reason, count in sorted(self.bad.items()))
        text = (f"put {self.put}, deduplicated {self.deduplicated}, failed {self.failed}, "
                f"bad {self.bad_total}" + (f" ({bad})" if bad else ""))
        if self.retried_tasks:
            text += (f"; {self.retried_tasks} task(s) retried, up to {self.retried_rows} "
                     "job(s) may have been put twice (at-least-once)")
        return text


MAX_ERRORS: Final = 5


@dataclass(frozen=True)
class WriteOptions:
    """The write's options, parsed and checked once on the driver."""

    host: str
    port: int
    tube: str = DEFAULT_TUBE
    priority: int = DEFAULT_PRIORITY
    delay: int = 0
    ttr: int = DEFAULT_TTR
    max_job_size: int = DEFAULT_MAX_JOB_SIZE
    batch: int = DEFAULT_BATCH
    timeout_s: float = DEFAULT_TIMEOUT_S
    report_file: str = ""
    fail_once_after: int = -1
    fail_partition: int = 0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        """From the data source's options (keys compared in lower case); ValueError if wrong."""
        opts = {key.lower(): value for key, value in options.items()}
        address = opts.get("address")
        if not address:
            raise ValueError('tubeq writer: option "address" (host:port) is required')
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"tubeq writer: address {address!r} is not host:port")

        def number(name: str, default: int, low: int = 0, high: int = U32_MAX) -> int:
            text = opts.get(name)
            if text is None:
                return default
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"tubeq writer: option {name}={text!r} is not an integer") \
                    from None
            if not low <= value <= high:
                raise ValueError(f"tubeq writer: option {name}={value} is not in {low}..{high}")
            return value

        tube = opts.get("tube", DEFAULT_TUBE)
        if not _tube_ok(tube):
            raise ValueError(f"tubeq writer: option tube={tube!r} is not a tube name")
        return cls(
            host=host.strip("[]"), port=int(port), tube=tube,
            priority=number("priority", DEFAULT_PRIORITY), delay=number("delay", 0),
            ttr=number("ttr", DEFAULT_TTR, 1), max_job_size=number("max_job_size",
                                                                   DEFAULT_MAX_JOB_SIZE),
            batch=number("batch", DEFAULT_BATCH, 1, 4096),
            timeout_s=float(opts.get("timeout", DEFAULT_TIMEOUT_S)),
            report_file=opts.get("report_file", ""),
            fail_once_after=number("fail_once_after", -1, -1),
            fail_partition=number("fail_partition", 0),
        )


def _tube_ok(name: str) -> bool:
    data = name.encode("utf-8", errors="replace")
    return (0 < len(data) <= MAX_TUBE_NAME and not data.startswith(b"-")
            and all(byte in _NAME_BYTES for byte in data))


class BadRow(ValueError):
    """A row that cannot become a job; ``reason`` is its count's name."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Put:
    """One row, checked: what the put will say."""

    tube: str
    priority: int
    delay: int
    ttr: int
    body: bytes
    dedupe_key: str | None = None
    group: str | None = None


def _uint(value: Any, reason: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRow(reason)
    number = int(value)
    if number != value or not 0 <= number <= U32_MAX:
        raise BadRow(reason)
    return number


def _due_delay(due: Any, now_ms: int) -> int:
    """Seconds from ``now_ms`` to ``due`` (a datetime or epoch ms), rounded up; 0 if past."""
    if isinstance(due, dt.datetime):
        aware = due if due.tzinfo is not None else due.replace(tzinfo=dt.UTC)
        due_ms = aware.timestamp() * 1000
    elif isinstance(due, int | float) and not isinstance(due, bool) and math.isfinite(due):
        due_ms = float(due)
    else:
        raise BadRow(BAD_DELAY)
    delay = max(0, math.ceil((due_ms - now_ms) / 1000))
    if delay > U32_MAX:
        raise BadRow(BAD_DELAY)
    return delay


def check_row(row: Mapping[str, Any], options: WriteOptions, now_ms: int) -> Put:
    """The put a row asks for, or :class:`BadRow` saying why there is none."""
    body = row.get("body")
    if body is None:
        raise BadRow(MISSING_BODY)
    if isinstance(body, str):
        data = body.encode("utf-8")
    elif isinstance(body, bytes | bytearray | memoryview):
        data = bytes(body)
    else:
        raise BadRow(BAD_BODY)
    if len(data) > options.max_job_size:
        raise BadRow(BODY_TOO_BIG)
    tube = row.get("tube")
    if tube is None:
        tube = options.tube
    if not isinstance(tube, str) or not _tube_ok(tube):
        raise BadRow(BAD_TUBE)
    priority = row.get("priority")
    priority = options.priority if priority is None else _uint(priority, BAD_PRIORITY)
    due, delay = row.get("due"), row.get("delay")
    if due is not None:
        delay = _due_delay(due, now_ms)
    else:
        delay = options.delay if delay is None else _uint(delay, BAD_DELAY)
    ttr = row.get("ttr")
    ttr = options.ttr if ttr is None else _uint(ttr, BAD_TTR)
    key = row.get("dedupe_key")
    if key is not None and (not isinstance(key, str) or _KEY.fullmatch(key) is None):
        raise BadRow(BAD_KEY)
    group = row.get("group")
    if group is not None and (not isinstance(group, str) or not _tube_ok(group)):
        raise BadRow(BAD_GROUP)
    return Put(tube, priority, delay, ttr, data, key, group)


# A dedupe key as put-with takes it (tubeq.model.options): 1-200 printable ASCII, no space, no '='.
_KEY: Final = re.compile(r"[!-<>-~]{1,200}")


def _put_command(put: Put) -> bytes:
    """The one place a put is spelled: plain ``put``, or ``put-with ... key= group=`` for a row
    with a key or a group."""
    numbers = b"%d %d %d %d" % (put.priority, put.delay, put.ttr, len(put.body))
    if put.dedupe_key is None and put.group is None:
        return b"put " + numbers + CRLF + put.body + CRLF
    key = b"" if put.dedupe_key is None else b" key=" + put.dedupe_key.encode("ascii")
    group = b"" if put.group is None else b" group=" + put.group.encode("ascii")
    return b"put-with " + numbers + key + group + CRLF + put.body + CRLF


class _Link:
    """One synchronous beanstalkd connection: send bytes, take ``n`` replies in order."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = ReplyParser()
        self.pending: list[Reply] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def replies(self, count: int) -> list[Reply]:
        while len(self.pending) < count:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection mid-write")
            self.pending.extend(self.parser.feed(chunk))
            if self.parser.error is not None:
                raise self.parser.error
        out, self.pending = self.pending[:count], self.pending[count:]
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(b"quit\r\n")
        self.sock.close()


class _Batch:
    """Puts of one task, sent ``batch`` at a time, their replies counted."""

    def __init__(self, link: _Link, options: WriteOptions, counts: WriteCounts) -> None:
        self.link = link
        self.options = options
        self.counts = counts
        self.using = DEFAULT_TUBE  # a fresh connection uses "default"
        self.data = bytearray()
        self.expect: list[bool] = []  # one per command sent: True for a put, False for a use
        self.put_with: bool | None = None  # the server takes put-with (asked once, if needed)

    def _has_put_with(self) -> bool:
        """Whether the server has tubeq's put-with: asked once, with ``extensions``."""
        if self.put_with is None:
            self.flush()
            self.link.send(b"extensions" + CRLF)
            reply = self.link.replies(1)[0]
            self.put_with = reply.word == b"OK" and b"\n- put-with\n" in (reply.body or b"")
        return self.put_with

    def add(self, put: Put) -> None:
        if (put.dedupe_key is not None or put.group is not None) and not self._has_put_with():
            # Never sent to a server without put-with: beanstalkd would answer the line
            # UNKNOWN_COMMAND and then read the body as commands.
            self.counts.failed += 1
            if len(self.counts.errors) < MAX_ERRORS:
                column = "dedupe_key" if put.dedupe_key is not None else "group"
                self.counts.errors.append(f"{column}: the server has no put-with (not tubeq)")
            return
        if put.tube != self.using:
            self.data += b"use " + put.tube.encode() + CRLF
            self.expect.append(False)
            self.using = put.tube
        self.data += _put_command(put)
        self.expect.append(True)
        if len(self.expect) >= self.options.batch or len(self.data) >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.expect:
            return
        self.link.send(bytes(self.data))
        replies = self.link.replies(len(self.expect))
        for is_put, reply in zip(self.expect, replies, strict=True):
            if not is_put:
                if reply.word != b"USING":
                    raise ConnectionError(f"use answered {reply.word.decode()}")
                continue
            if reply.word == b"INSERTED" or (reply.word == b"BURIED" and reply.args):
                self.counts.put += 1
            elif reply.word == b"DUPLICATE":  # a keyed row whose job lives already
                self.counts.deduplicated += 1
            elif reply.word == b"JOB_TOO_BIG":
                self.counts.bad[BODY_TOO_BIG] = self.counts.bad.get(BODY_TOO_BIG, 0) + 1
            else:
                self.counts.failed += 1
                if len(self.counts.errors) < MAX_ERRORS:
                    self.counts.errors.append(b" ".join((reply.word, *reply.args)).decode())
        self.data.clear()
        self.expect.clear()


class TubeqDataSourceWriter(DataSourceWriter):
    """Puts each row; picklable (plain options only), one connection per task."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriteCounts:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
        partition = context.partitionId() if context is not None else 0
        options = self.options
        inject = (options.fail_once_after >= 0 and attempt == 0
                  and partition == options.fail_partition)
        counts = WriteCounts()
        link = _Link(options.host, options.port, options.timeout_s)
        try:
            batch = _Batch(link, options, counts)
            for row in iterator:
                try:
                    put = check_row(row.asDict(), options, time.time_ns() // 1_000_000)
                except BadRow as bad:
                    counts.bad[bad.reason] = counts.bad.get(bad.reason, 0) + 1
                    continue
                batch.add(put)
                if inject and counts.put + sum(batch.expect) >= options.fail_once_after:
                    batch.flush()
                    if counts.put >= options.fail_once_after:
                        raise InjectedFailure(
                            f"fail_once_after: partition {partition} attempt {attempt} fails "
                            f"after {counts.put} puts")
            batch.flush()
        finally:
            link.close()
        if attempt > 0:
            counts.retried_tasks = 1
            counts.retried_rows = counts.put
        return counts

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._report(messages, aborted=False)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._report(messages, aborted=True)

    def _report(self, messages: list[WriterCommitMessage | None], *, aborted: bool) -> None:
        total = WriteCounts()
        for message in messages:
            if isinstance(message, WriteCounts):
                total.add(message)
        if self.options.report_file:
            Path(self.options.report_file).write_text(
                json.dumps({**asdict(total), "aborted": aborted}), encoding="utf-8")


def make_writer(options: Mapping[str, str], schema: StructType | None = None) -> DataSourceWriter:
    """The writer for a ``tubeq`` format DataSource's ``writer()``; checks options and columns."""
    parsed = WriteOptions.parse(options)
    if schema is not None and "body" not in schema.fieldNames():
        raise ValueError(f'tubeq writer: the DataFrame has no "body" column '
                         f"(columns: {', '.join(schema.fieldNames())})")
    return TubeqDataSourceWriter(parsed)
