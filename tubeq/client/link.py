"""One connection: ``_Link``, a thin :class:`asyncio.Protocol` between the socket and the calls.

It writes commands (the first of a loop turn at once, the turn's others together once it
ends: one system call where many callers share the link), feeds the :class:`ReplyParser` and
hands each reply, in wire order, to the command that asked for it (``_Pending``: its future
and the converter of its reply). Replies are converted (state updated, :class:`Job` built,
error raised) synchronously as they are routed, whether or not the caller is still waiting,
so pipelined calls and cancelled calls cannot disturb the connection's state. On a link in
push mode every RESERVED frame is a pushed job; on any link an END frame is the end of a call
(put-with notify-ms), for the future :meth:`_Link.expect_end` gave it.

Rules: a link knows the client that opened it only as a :class:`LinkClient` (declared here, as
it names :class:`Job`), so this module imports nothing of ``client``; it is the
:class:`~tubeq.client._contracts.Connection` the commands and jobs see.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tubeq.client._contracts import Connection, Convert
from tubeq.client.errors import ClientConnectionError, ClientError, ProtocolError
from tubeq.client.job import Job
from tubeq.client.parser import Reply, ReplyParser
from tubeq.client.wire import CANCELLED, END, END_TIMED_OUT, QUIET, RESERVED

T = TypeVar("T")


class LinkClient(Protocol):
    """What a link needs of the client that opened it (``client.Client``): its name for errors,
    its body limit, and the jobs it builds from RESERVED frames and puts back when orphaned."""

    @property
    def address(self) -> str: ...

    @property
    def max_body(self) -> int: ...

    def _job_from(self, reply: Reply, link: Connection | None, tube: str | None, *,
                  now: float | None = None) -> Job: ...

    def _release_orphan(self, job: Job) -> None: ...


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Any]
    convert: Callable[[Reply, Connection], Any]


class _Link(asyncio.Protocol):
    """One TCP connection: commands out, replies routed in wire order to the calls awaiting them.

    On a link that sent ``push``, RESERVED frames are jobs the server pushes: the client sends no
    reserve there, so no RESERVED can be the answer to a command, and every one goes to the push
    queue, wherever it falls between replies.
    """

    def __init__(self, client: LinkClient) -> None:
        self._client = client
        self._parser = ReplyParser(client.max_body)
        self._transport: asyncio.Transport | None = None
        # Commands written after the turn's first, sent as one write when the turn ends (None:
        # nothing written this turn yet).
        self._turn_out: list[bytes] | None = None
        self._pending: deque[_Pending] = deque()
        self._writable = asyncio.Event()
        self._writable.set()
        # Its loop, asked once (Python 3.11's get_running_loop() is a getpid system call).
        self._loop = asyncio.get_running_loop()
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self.error: ClientError | None = None
        self.push_requested = False
        self.pushing = False
        self._pushed: deque[Job] = deque()
        self._push_waiters: set[asyncio.Future[None]] = set()
        # push ... cancels=1: called with the id of a held job the server says was cancelled.
        self.on_cancelled: Callable[[int], None] | None = None
        self.on_quiet: Callable[[], None] | None = None
        # The server's extension words once asked (tubeq.client.batches), empty for beanstalkd.
        self.extensions: frozenset[str] | None = None
        # put-with notify-ms: job id -> its calls' deadlines (loop time) and the futures of
        # their END frames to come (one per call: two calls of one dedupe key share the job).
        self._ends: dict[int, list[tuple[float, asyncio.Future[Reply]]]] = {}

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for reply in self._parser.feed(data):
            if self.error is not None:
                return
            self._route(reply)
        if self._parser.error is not None and self.error is None:
            self._fail(self._parser.error)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            if self._parser.mid_reply:
                what = "closed the connection in the middle of a reply"
            elif self._pending:
                what = f"closed the connection with {len(self._pending)} replies outstanding"
            else:
                what = "closed the connection"
            reason = f" ({exc})" if exc is not None else ""
            self.error = ClientConnectionError(f"{self._client.address}: server {what}{reason}")
        self._fail_waiters()
        self._writable.set()
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- sending ------------------------------------------------------------------------------

    def failure(self) -> ClientError:
        """A fresh exception saying why this link is unusable (one instance per raise)."""
        assert self.error is not None
        return type(self.error)(*self.error.args)

    @property
    def writable(self) -> bool:
        """Whether the transport takes writes now (not paused by a server slow to read)."""
        return self._writable.is_set()

    @property
    def usable(self) -> bool:
        return self.error is None and self._transport is not None

    def send(self, data: bytes, convert: Convert[T], *,
             reserves: bool = False) -> asyncio.Future[T]:
        """Write one command; the future gets ``convert(reply)`` or its exception."""
        if self.error is not None:
            raise self.failure()
        if reserves and self.push_requested:
            raise RuntimeError("a connection that sent push must not send reserve commands: "
                               "their RESERVED replies could not be told from pushed jobs")
        assert self._transport is not None
        future: asyncio.Future[T] = self._loop.create_future()
        self._pending.append(_Pending(future, convert))
        self._write(data)
        return future

    def send_noreply(self, data: bytes) -> None:
        if self.error is not None:
            raise self.failure()
        assert self._transport is not None
        self._write(data)

    def _write(self, data: bytes) -> None:
        """A lone command leaves at once; the ones after it in the same loop turn (callers
        sharing the link, a consumer's acknowledgements) leave together when the turn ends."""
        out = self._turn_out
        if out is not None:
            out.append(data)
            return
        assert self._transport is not None
        self._transport.write(data)
        self._turn_out = []
        self._loop.call_soon(self._end_turn)

    def _end_turn(self) -> None:
        out, self._turn_out = self._turn_out, None
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    async def wait_writable(self) -> None:
        await self._writable.wait()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def close(self) -> None:
        if self._transport is not None:
            self._end_turn()  # the commands written before the close go first
            self._transport.close()

    # -- receiving ----------------------------------------------------------------------------

    def expect_end(self, job_id: int, deadline: float) -> asyncio.Future[Reply]:
        """The future of an END frame for job ``job_id`` (put-with notify-ms) of a call whose
        time runs out at ``deadline`` (loop time): called by the put's converter, so it is in
        place before the frame can come (frames follow the reply that named the job). Cancel
        it to stop listening."""
        future: asyncio.Future[Reply] = self._loop.create_future()
        if self.error is not None:
            future.set_exception(self.failure())
            return future
        self._ends.setdefault(job_id, []).append((deadline, future))
        return future

    def _end_frame(self, reply: Reply) -> None:
        """An END frame to one of its job's calls: how the job ended is the same for every
        call of the job (the first takes it); a ``timed-out`` frame is the call's whose time
        runs out first (calls of one dedupe key may have different timeouts)."""
        job_id = reply.int_arg(0)
        calls = self._ends.get(job_id)
        if calls is None:
            return  # its call gave up and went
        at = 0
        if len(calls) > 1 and reply.args[1] == END_TIMED_OUT:
            at = min(range(len(calls)), key=lambda i: calls[i][0])
        future = calls.pop(at)[1]
        if not calls:
            del self._ends[job_id]
        if not future.done():
            future.set_result(reply)

    def _route(self, reply: Reply) -> None:
        if reply.word == END:  # a frame: never the answer to a command
            self._end_frame(reply)
            return
        if reply.word == RESERVED and self.pushing:
            self._pushed.append(self._client._job_from(reply, self, None,
                                                       now=self._loop.time()))
            self._wake_push_waiters()
            return
        if reply.word == CANCELLED and reply.args and self.pushing:  # a frame, not a reply
            if self.on_cancelled is not None:
                self.on_cancelled(reply.int_arg(0))
            return
        if reply.word == QUIET and self.pushing:  # a frame: the server asks us to stop taking
            if self.on_quiet is not None:
                self.on_quiet()
            return
        if not self._pending:
            self._fail(ProtocolError(f"unsolicited reply {reply.word.decode()} from "
                                     f"{self._client.address}"))
            return
        pending = self._pending.popleft()
        future = pending.future
        try:
            value = pending.convert(reply, self)
        except ProtocolError as error:
            if not future.done():
                future.set_exception(error)
            self._fail(ProtocolError(f"{self._client.address}: {error}"))
            return
        except Exception as error:
            if not future.done():
                future.set_exception(error)
            return
        if not future.cancelled():
            future.set_result(value)
        elif isinstance(value, Job) and value.reserved:
            self._client._release_orphan(value)
        elif isinstance(value, list):  # reserve_many's jobs (batches)
            for job in value:
                if isinstance(job, Job) and job.reserved:
                    self._client._release_orphan(job)

    def _fail(self, error: ClientError) -> None:
        """Make the link unusable: every waiting call gets ``error``; the transport is aborted."""
        if self.error is None:
            self.error = error
        self._fail_waiters()
        if self._transport is not None:
            self._transport.abort()

    def _fail_waiters(self) -> None:
        while self._pending:
            future = self._pending.popleft().future
            if not future.done():
                future.set_exception(self.failure())
        ends, self._ends = self._ends, {}
        for calls in ends.values():
            for _, end in calls:
                if not end.done():
                    end.set_exception(self.failure())
                    end.exception()  # (retrieved: a call that gave up leaves no log line)
        self._wake_push_waiters()

    # -- pushed jobs --------------------------------------------------------------------------

    def _wake_push_waiters(self) -> None:
        for waiter in self._push_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._push_waiters.clear()

    def take_pushed(self) -> list[Job]:
        """The pushed jobs not taken by :meth:`next_pushed` yet, taken now."""
        jobs = list(self._pushed)
        self._pushed.clear()
        return jobs

    async def next_pushed(self) -> Job:
        while not self._pushed:
            if self.error is not None:
                raise self.failure()
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._push_waiters.add(waiter)
            try:
                await waiter
            finally:
                self._push_waiters.discard(waiter)
        return self._pushed.popleft()
