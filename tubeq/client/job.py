"""Jobs: :class:`Job`, and the commands that act on one job id.

The command builders (delete, release, bury, touch, stats-job) each return the command's bytes and
the converter of its reply; :class:`Client` methods send them on the current connection,
:class:`Job` methods on the connection that holds the reservation. A job handed out by
``consume()`` also carries the consumer's claim on it (``consume._Hold``), which ``async with
job`` settles.

Rules: a job knows the client that made it only as a :class:`JobClient`, its connection only as
a :class:`Connection` (both in ``_contracts``), and the consumer holding it only as a
:class:`Hold`, declared here because it names :class:`Job`. So this module imports nothing of
``client``, ``link`` or ``consume``, which all build or hold jobs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Protocol, TypeVar

from tubeq.client._contracts import Connection, Convert, JobClient
from tubeq.client.args import _expect, _job_id, _uint
from tubeq.client.errors import ClientConnectionError, JobCancelled, NotFound, ProtocolError
from tubeq.client.parser import JOB_TEXT_KEYS, Reply, Stats, parse_yaml_mapping
from tubeq.client.wire import (
    BURIED,
    CRLF,
    DELETED,
    FAILED,
    FINISHED,
    MAX_MS,
    OK,
    RELEASED,
    TOUCHED,
    U32_MAX,
)

T = TypeVar("T")


class Holder(Protocol):
    """What a job handed out by ``consume()`` needs of the consumer holding it
    (:class:`Consumer`): to let go of it, and to settle it when ``async with job`` ends."""

    def _forget(self, job: Job) -> None: ...

    async def _settle_block(self, job: Job, exc: BaseException | None) -> bool: ...


class Hold(Protocol):
    """A consumer's claim on a job (``consume._Hold``), as the job sees it."""

    @property
    def consumer(self) -> Holder: ...


class Job:
    """A job as the server showed it: ``id``, ``body`` and, when the client knows it, ``tube``.

    A job from a reserve (or pushed by the server) is *reserved*: it is bound to the connection
    that holds the reservation, and :meth:`delete`, :meth:`release`, :meth:`bury` and
    :meth:`touch` go on that connection. A job from peek is not reserved; its
    :meth:`delete` goes on the client's current connection.

    ``tube`` is known for a job from peek-ready/-delayed/-buried, for a reserved job when one
    tube is watched, and after :meth:`stats` (auto_touch calls it); otherwise it is None.

    A job handed out by :meth:`Client.consume` is settled with ``async with job:``: a block
    that ends normally deletes it; one that raises releases it with backoff, or buries it once
    it has been reserved ``max_tries`` times (see :class:`Consumer`).
    """

    __slots__ = ("_client", "_hold", "_link", "_pri", "_ttr", "body", "id", "reserved_at", "tube")

    def __init__(self, client: JobClient, job_id: int, body: bytes, *, tube: str | None = None,
                 link: Connection | None = None, now: float | None = None) -> None:
        self._client = client
        self.id = job_id
        self.body = body
        self.tube = tube
        self._link = link
        self._pri: int | None = None
        self._ttr: int | None = None
        self._hold: Hold | None = None
        # ``now``: the loop's time, where the caller has it (a getpid system call less per job
        # than asking for the running loop on Python 3.11)
        self.reserved_at = asyncio.get_running_loop().time() if now is None else now

    def __repr__(self) -> str:
        state = "reserved" if self._link is not None else "seen"
        tube = f" tube={self.tube!r}" if self.tube is not None else ""
        return f"<Job {self.id}{tube} {state} {len(self.body)} bytes>"

    @property
    def reserved(self) -> bool:
        """Whether this client reserved the job (through the connection it is bound to)."""
        return self._link is not None

    async def stats(self) -> Stats:
        """The job's ``stats-job`` document (also fills in ``tube`` and the cached priority
        and TTR)."""
        stats = await self._call(*_stats_job_command(self.id))
        if "pri" in stats:
            self._pri = int(stats["pri"])
        if "ttr" in stats:
            self._ttr = int(stats["ttr"])
        if "tube" in stats:
            self.tube = str(stats["tube"])
        return stats

    async def _priority(self, pri: int | None) -> int:
        if pri is not None:
            return pri
        if self._pri is None:
            await self.stats()
        if self._pri is None:
            raise ProtocolError(f"stats-job {self.id} has no pri")
        return self._pri

    async def _settle(self, data: bytes, convert: Convert[None]) -> None:
        try:
            await self._call(data, convert)
        except (NotFound, JobCancelled, ClientConnectionError, ProtocolError):
            self._forget()  # the reservation is gone either way
            raise
        self._forget()

    async def _call(self, data: bytes, convert: Convert[T]) -> T:
        if self._link is None:
            return await self._client._call(data, convert)
        return await self._client._call_on(self._link, data, convert)

    def _forget(self) -> None:
        if self._hold is not None:
            self._hold.consumer._forget(self)

    async def delete(self) -> None:
        """Delete the job (DELETED); :class:`NotFound` if it is gone or reserved elsewhere."""
        await self._settle(*_delete_command(self.id))

    async def release(self, *, pri: int | None = None, delay: int = 0) -> None:
        """Put the reserved job back, ready or after ``delay`` s, at ``pri`` (default: its own
        priority, asked with stats-job when not known)."""
        priority = await self._priority(pri)
        await self._settle(*_release_command(self.id, priority, delay))

    async def bury(self, *, pri: int | None = None) -> None:
        """Bury the reserved job at ``pri`` (default: its own priority)."""
        priority = await self._priority(pri)
        await self._settle(*_bury_command(self.id, priority))

    async def hand_back(self) -> None:
        """Give the reserved job back because this worker is shutting down (tubeq's
        ``hand-back``; not in beanstalkd): ready at once at its own priority, and the
        reservation counts as no try (no max-tries try, no backoff). :class:`JobCancelled`
        when someone cancelled it (it is gone)."""
        await self._settle(*_hand_back_command(self.id))

    async def touch(self) -> None:
        """Give the reserved job a full TTR from now; :class:`JobCancelled` when someone
        cancelled it (tubeq: it is gone)."""
        try:
            await self._call(*_touch_command(self.id))
        except JobCancelled:
            self._forget()
            raise

    async def finish(self, result: bytes | str = b"") -> None:
        """Done, with ``result`` (a ``str`` is sent as UTF-8): the job is deleted and its
        result kept for whoever waits for it (tubeq's ``finish``; not in beanstalkd)."""
        await self._settle(*_finish_command(self.id, result))

    async def progress(self, data: bytes | str) -> None:
        """Report progress (``data``: any bytes, e.g. a percentage): the server keeps the
        latest for whoever waits for the job, and gives it a full TTR as ``touch`` does
        (tubeq's ``progress``); :class:`JobCancelled` when someone cancelled it."""
        try:
            await self._call(*_progress_command(self.id, data))
        except JobCancelled:
            self._forget()
            raise

    async def fail(self, error: bytes | str, *, max_tries: int | None = None,
                   backoff_ms: int | None = None, backoff_max_ms: int | None = None) -> None:
        """Failed, with ``error``: the server keeps the error and puts the job back, delays
        it or buries it by its own policies (tubeq's ``fail``; not in beanstalkd); the
        options are this worker's policy where neither the job nor its tube has one."""
        policy = ((b"max-tries", max_tries, U32_MAX), (b"backoff-ms", backoff_ms, MAX_MS),
                  (b"backoff-max-ms", backoff_max_ms, MAX_MS))
        await self._settle(*_fail_command(self.id, error, b"".join(
            b" %s=%d" % (name, _uint(value, name.decode(), maximum))
            for name, value, maximum in policy if value is not None)))

    async def __aenter__(self) -> Job:
        if self._hold is None:
            raise RuntimeError(f"job {self.id}: only a job handed out by consume() that is not "
                               f"settled yet can be used with 'async with'")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        hold = self._hold
        if hold is None:  # settled inside the block, or the consumer closed
            return False
        return await hold.consumer._settle_block(self, exc)


# Each command is its bytes and a converter; Client methods send them on the current connection,
# Job methods on the connection holding the reservation.


def _delete_command(job_id: int) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: Connection) -> None:
        _expect(reply, "delete", DELETED)

    return b"delete %d\r\n" % _job_id(job_id), convert


def _release_command(job_id: int, pri: int, delay: int) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: Connection) -> None:
        _expect(reply, "release", RELEASED)

    return (b"release %d %d %d\r\n" % (_job_id(job_id), _uint(pri, "pri"), _uint(delay, "delay")),
            convert)


def _hand_back_command(job_id: int) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: Connection) -> None:
        _expect(reply, "hand-back", RELEASED)

    return b"hand-back %d\r\n" % _job_id(job_id), convert


def _bury_command(job_id: int, pri: int) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: Connection) -> None:
        _expect(reply, "bury", BURIED)

    return b"bury %d %d\r\n" % (_job_id(job_id), _uint(pri, "pri")), convert


def _touch_command(job_id: int) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: Connection) -> None:
        _expect(reply, "touch", TOUCHED)

    return b"touch %d\r\n" % _job_id(job_id), convert


def _with_body(word: bytes, job_id: int, body: bytes | str, options: bytes = b"") -> bytes:
    data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    return b"%s %d %d%s\r\n" % (word, _job_id(job_id), len(data), options) + data + CRLF


def _finish_command(job_id: int, result: bytes | str) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: Connection) -> None:
        _expect(reply, "finish", FINISHED)

    return _with_body(b"finish", job_id, result), convert


def _progress_command(job_id: int, data: bytes | str) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: Connection) -> None:
        _expect(reply, "progress", TOUCHED)

    return _with_body(b"progress", job_id, data), convert


def _fail_command(job_id: int, error: bytes | str,
                  options: bytes = b"") -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: Connection) -> None:
        _expect(reply, "fail", FAILED)

    return _with_body(b"fail", job_id, error, options), convert


def _ok(command: str, parse: Callable[[bytes], T]) -> Convert[T]:
    def convert(reply: Reply, link: Connection) -> T:
        _expect(reply, command, OK)
        assert reply.body is not None
        return parse(reply.body)

    return convert


def _stats_job_command(job_id: int) -> tuple[bytes, Convert[Stats]]:
    parse = lambda data: parse_yaml_mapping(data, JOB_TEXT_KEYS)  # noqa: E731
    return b"stats-job %d\r\n" % _job_id(job_id), _ok("stats-job", parse)
