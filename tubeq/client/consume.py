"""Consumption: :class:`Consumer` (``client.consume()``) keeps jobs in flight over long-lived
connections of its own.

Each connection (``_Lane``) gets jobs through the server's push extension when the server has
one and through pipelined ``reserve-with-timeout`` otherwise. A held job carries the consumer's
claim on it (``_Hold``) until it is settled: deleted, released with :func:`backoff_delay`, or
buried. ``auto_touch`` touches held jobs every :func:`touch_interval`. The deletes of the jobs
that succeeded within one loop tick leave together, as one ``delete-many`` where the server has
it (``Consumer._ack``).

Rules: a consumer drives clients it knows only as :class:`ConsumerClient` (declared here, as it
names :class:`Job`; ``client.Client`` satisfies it), and their connections only as a
:class:`~tubeq.client._contracts.Connection`, so this module imports nothing of ``client`` or
``link``. A job sees its ``_Hold`` only as a ``job.Hold``; this module alone sets ``Job._hold``,
and reads it back through :func:`_hold_of`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal, Protocol

from tubeq.client import tracing
from tubeq.client._contracts import Connection
from tubeq.client.args import _tube, _uint
from tubeq.client.ends import Codec
from tubeq.client.errors import (
    ClientConnectionError,
    ClientError,
    DeadlineSoon,
    InternalError,
    JobCancelled,
    JobTooBig,
    NotFound,
    ProtocolError,
    TimedOut,
    UnknownCommand,
)
from tubeq.client.job import Job
from tubeq.client.wire import DEFAULT_TTR, DEFAULT_TUBE

log = logging.getLogger("tubeq.client")

# Touch a job this long before its TTR ends: the server's safety margin is 1 s (a reserve
# behind which our touch may wait is answered DEADLINE_SOON when it starts), plus 0.5 s for the
# touch to travel and be processed.
TOUCH_AHEAD_S: Final = 1.5
# ... but never less often than four times per TTR (TTRs of 1-2 s).
TOUCH_MIN_FRACTION: Final = 0.25
# After DEADLINE_SOON a connection asks again only after this pause: the job in its margin gets
# touched, settled or expires within the margin (1 s), and asking at once would only bounce.
DEADLINE_SOON_PAUSE_S: Final = 0.25
# A lost consumer connection is reopened after this delay, doubled per failure up to the max.
RECONNECT_MIN_S: Final = 0.1
RECONNECT_MAX_S: Final = 5.0
# Connections a consumer opens unless told: one per JOBS_PER_CONNECTION jobs in flight, at most
# MAX_DEFAULT_CONNECTIONS. Each connection's share of the jobs in flight is what the server
# moves per script call (push credits, or pipelined reserves), so fewer, fuller connections cost
# the server less per job: concurrency 32 over 2 connections instead of 4 measured tubeq + its
# Redis ~85 against ~115 us of CPU per processed job, and 1.3x the jobs/s (bench/PROFILE_NOTES.md);
# a few connections still spread a consumer over a server's workers (--workers).
JOBS_PER_CONNECTION: Final = 16
MAX_DEFAULT_CONNECTIONS: Final = 4
# A stopping consumer waits at most this long for the jobs it gives back (hand-back) to be
# answered, and for the handlers it cancelled past the grace to end, before it closes.
HAND_BACK_WAIT_S: Final = 5.0


def default_connections(concurrency: int) -> int:
    """How many connections ``consume(concurrency=...)`` opens unless told."""
    return max(1, min(MAX_DEFAULT_CONNECTIONS, -(-concurrency // JOBS_PER_CONNECTION)))


class ConsumerClient(Protocol):
    """What a :class:`Consumer` needs of a client (``client.Client``): the commands its lanes
    send, and a sibling client per lane with a connection of its own."""

    @property
    def address(self) -> str: ...

    @property
    def connected(self) -> bool: ...

    async def connect(self) -> None: ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...

    async def watch(self, tube: str) -> int: ...

    async def ignore(self, tube: str) -> int: ...

    async def push(self, credits: int, *,
                   on_cancelled: Callable[[int], None] | None = None,
                   on_quiet: Callable[[], None] | None = None) -> int: ...

    async def next_pushed(self) -> Job: ...

    def pushed_waiting(self) -> list[Job]: ...

    async def reserve_with_timeout(self, seconds: int) -> Job: ...

    def _sibling(self) -> ConsumerClient: ...

    async def _current_link(self) -> Connection: ...

    async def _extensions_of(self, link: Connection) -> frozenset[str]: ...

    async def _delete_many_on(self, link: Connection, ids: list[int]) -> list[bool]: ...


def backoff_delay(reserves: int, base: int, maximum: int) -> int:
    """Seconds to delay a failed job that has been reserved ``reserves`` times:
    ``min(base * 2 ** (reserves - 1), maximum)``."""
    exponent = max(0, reserves - 1)
    if exponent >= 63:
        return maximum
    return int(min(base * 2**exponent, maximum))


def touch_interval(ttr: int) -> float:
    """How often auto_touch touches a job whose TTR is ``ttr`` seconds."""
    return max(ttr - TOUCH_AHEAD_S, ttr * TOUCH_MIN_FRACTION)


@dataclass(eq=False)
class _Lane:
    """One long-lived consumer connection and the jobs reserved through it."""

    index: int
    client: ConsumerClient
    share: int  # reserves in flight (or push credits) this connection may hold
    slots: asyncio.Semaphore  # share minus the jobs held (and reserves in flight) here
    held: set[Job] = field(default_factory=set)
    mode: Literal["push", "reserve"] | None = None
    subscribed: bool = False
    # batches: the deletes of jobs that succeeded, waiting for the end of the loop tick, each
    # with the future its block awaits (None: run()'s handler, which does not wait for it)
    acks: list[tuple[Job, asyncio.Future[bool] | None]] = field(default_factory=list)
    # pipelined reserves: reserves sent and not answered yet, and whoever waits for a held job
    # of this lane to be settled (see Consumer._reserve_pipelined)
    asking: int = 0
    settle_waiters: set[asyncio.Future[None]] = field(default_factory=set)

    def wake_settle_waiters(self) -> None:
        for waiter in self.settle_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.settle_waiters.clear()


@dataclass(eq=False, slots=True)
class _Hold:
    """A consumer's claim on a job it reserved, from the reservation until it is settled."""

    consumer: Consumer
    lane: _Lane
    uses_slot: bool
    handed: bool = False
    handing_back: bool = False  # a hand-back (or put-back release) of it is on its way
    settling: bool = False  # its block ended: its delete, finish, fail... is on its way
    keep_alive: asyncio.Task[None] | None = None
    # run()'s task handling the job: cancelled when the job is (auto_touch hears it)
    handler: asyncio.Task[None] | None = None


def _hold_of(job: Job) -> _Hold | None:
    """The consumer's claim on ``job``: a ``_Hold`` whenever it is set, as only
    :meth:`Consumer._take` sets it (the job itself sees a ``job.Hold``). (No ``cast()``: it is
    a call at run time, and this runs ~5 times a job.)"""
    return job._hold  # type: ignore[return-value]


class Consumer:
    """Jobs of some tubes, as they become ready, over long-lived connections of its own.

    Two forms; both settle every job the same way:

    .. code-block:: python

        async for job in client.consume(["emails", "sms"], concurrency=32):
            async with job:                  # ends normally: deleted
                await send(job.body)         # raises: released with backoff, or buried

        await client.consume(["emails"], concurrency=32).run(handle)   # handle(job) concurrently

    Why ``async with job``: the body of an ``async for`` cannot tell the iterator how it ended
    (an exception leaves the loop before the iterator hears of it), while a context manager sees
    exactly that, per job. It also lets the caller hand each job to a task of its own (``async
    with`` inside the task), which is how jobs get processed concurrently; :meth:`run` does just
    that with ``handler(job)``. A failure is logged and swallowed (the loop goes on);
    cancellation is not swallowed. A job may also be settled explicitly instead
    (``job.delete()``, ``job.release()``, ``job.bury()``).

    Settling: success deletes the job. An exception, on tubeq, fails it (``fail``, with the
    exception's type and message as the error that stats-job, waiters and events show) and
    sends this policy along for a job and tube that have none: ``max-tries=max_tries``,
    ``backoff-ms=backoff_base * 1000``, ``backoff-max-ms=backoff_max * 1000`` (the server then
    delays it by its backoff with jitter, or buries it with reason max-tries). On beanstalkd it
    asks the job's ``reserves`` count (stats-job) and releases it at its own priority with
    ``delay = min(backoff_base * 2**(reserves-1), backoff_max)`` seconds, or buries it when
    ``reserves >= max_tries`` (``max_tries=None``: never bury).

    ``concurrency`` bounds the jobs the consumer holds: reserved and not yet settled, whether
    waiting to be handed out, handed out, or in a handler; ``prefetch`` more may be held
    waiting, so a handler that ends finds its next job here (:meth:`run` still runs at most
    ``concurrency`` handlers at once). The consumer asks for more only as jobs are settled.
    With ``async for`` and no task per job only one job is processed at a time
    and the others wait reserved, their TTR running; keep ``concurrency`` small then, or set
    ``auto_touch``.

    Deleting: the jobs whose blocks ended normally within one event-loop turn are deleted
    together, per connection, with one ``delete-many`` (tubeq) or pipelined ``delete``
    commands (a server without it, e.g. beanstalkd: asked once per connection with
    ``extensions``). An ``async with job`` block still ends only once its own job's delete
    was answered; :meth:`run`'s handler task ends without waiting for it, its job held (its
    slot taken) until the answer. Delivery stays at least once: a job whose delete was not
    confirmed comes back.

    ``auto_touch=True``: every held job is touched every ``ttr - 1.5`` s (a quarter of the TTR
    for TTRs under 2 s) from its reservation until it is settled. It costs one stats-job per job
    to learn the TTR.

    Delivery: each of ``connections`` connections (default: one per 16 jobs of ``concurrency``,
    at most 4: :func:`default_connections`) watches ``tubes`` (and not ``default`` unless
    asked). With ``push`` None (the default) each connection first sends ``push <credits>``; a
    server with the push extension (tubeq) then sends ready jobs as they come, with no round
    trip per job; one answering UNKNOWN_COMMAND (beanstalkd) gets pipelined reserves instead:
    one ``reserve-with-timeout reserve_timeout`` that waits, plus ``reserve-with-timeout 0``
    for the rest of the connection's share while jobs keep coming. Such a server answers a
    connection's commands in order, and only the connection that reserved a job may delete it,
    so a waiting reserve would hold back every delete, touch or release sent behind it: the
    waiting reserve is sent only while the connection holds no job (see
    ``_reserve_pipelined``). ``push=True`` requires the
    extension (UnknownCommand is raised from the iteration otherwise); ``push=False`` never asks.
    A lost connection is reopened with backoff; the jobs it held went back to the server.

    Stopping (a quiet shutdown): :meth:`stop` stops taking jobs (push connections are sent
    ``push 0``) and gives back at once the jobs it holds and has not handed out (prefetched,
    or pushed after the stop), then lets the jobs handed out finish for up to ``grace``
    seconds; past it, :meth:`run`'s handlers still running are cancelled and every job still
    held is given back; then the connections close. The iteration ends. On tubeq a job is
    given back with ``hand-back``: ready at once, and the reservation counts as no try
    (no max-tries try, no backoff); on beanstalkd it is released at its own priority. The
    consumer stops this way on the signals ``stop_signals`` (default SIGTERM, when it runs
    in the main thread: ``stop_signals=()`` leaves signals alone), and when a tubeq server
    asks it to (``QUIET``: an operator's ``quiet``, or the server stopping), which push
    connections ask to be told of. Cancelling the task
    that iterates (or runs :meth:`run`) closes at once: the jobs in flight go back through the
    closed connections (on tubeq each ends a try, as a worker that vanished does). Use
    ``async with client.consume(...) as jobs:`` when the loop may be
    left by ``break`` or an exception: the connections are then closed when the block ends.
    """

    def __init__(self, client: ConsumerClient, tubes: str | Iterable[str], *,
                 concurrency: int = 32, connections: int | None = None, auto_touch: bool = False,
                 max_tries: int | None = 5, backoff_base: int = 1, backoff_max: int = 60,
                 push: bool | None = None, reserve_timeout: int = 1,
                 grace: float = 30.0, codec: Codec | None = None, prefetch: int = 0,
                 stop_signals: Iterable[int] = (signal.SIGTERM,)) -> None:
        self.tubes = [tubes] if isinstance(tubes, str) else list(tubes)
        if not self.tubes:
            raise ValueError("consume() needs at least one tube")
        for tube in self.tubes:
            _tube(tube)
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if max_tries is not None and max_tries < 1:
            raise ValueError("max_tries must be at least 1 (or None: never bury)")
        prefetch = _uint(prefetch, "prefetch")
        held = concurrency + prefetch
        count = min(held, connections or default_connections(held))
        if count < 1:
            raise ValueError("connections must be at least 1")
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.stop_signals = tuple(stop_signals)
        self.auto_touch = auto_touch
        self.max_tries = max_tries
        self.backoff_base = _uint(backoff_base, "backoff_base")
        self.backoff_max = _uint(backoff_max, "backoff_max")
        self.push = push
        self.reserve_timeout = _uint(reserve_timeout, "reserve_timeout")
        self.grace = grace
        self.codec = codec
        self._lanes: list[_Lane] = []
        for index in range(count):
            share = held // count + (1 if index < held % count else 0)
            self._lanes.append(_Lane(index, client._sibling(), share, asyncio.Semaphore(share)))
        self._ready: deque[Job] = deque()
        self._readers: set[asyncio.Future[None]] = set()
        self._handed: set[Job] = set()
        self._drivers: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._started = False
        # The loop it runs on, from its start (Python 3.11's asyncio.get_running_loop() makes a
        # getpid system call each time: ~5 per job on the hot path, 2 us of a worker's ~17).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._closed = False
        self._done = asyncio.Event()
        self._failure: BaseException | None = None
        self._iterating: asyncio.Task[Any] | None = None
        self._closer: asyncio.Task[None] | None = None
        self._handing: set[asyncio.Task[None]] = set()  # hand-backs on their way

    # -- public surface -----------------------------------------------------------------------

    @property
    def modes(self) -> list[str | None]:
        """How each connection gets jobs: ``"push"``, ``"reserve"``, or None (not decided)."""
        return [lane.mode for lane in self._lanes]

    @property
    def held(self) -> int:
        """Jobs reserved through this consumer and not settled yet."""
        return sum(len(lane.held) for lane in self._lanes)

    def stop(self) -> None:
        """Stop taking jobs and give back those not handed out; the jobs handed out get
        ``grace`` s to finish, then the rest is given back and the connections close.

        Safe to call from a signal handler (``loop.add_signal_handler(SIGTERM, c.stop)``) and
        more than once.
        """
        if self._stopping:
            return
        self._stopping = True
        for driver in self._drivers:
            driver.cancel()
        for lane in self._lanes:
            if lane.mode == "push" and lane.client.connected:
                self._spawn(self._stop_pushing(lane))
        unstarted = list(self._ready)  # never handed out: given back now
        self._ready.clear()
        for job in unstarted:
            self._give_back(job)
        self._wake_readers()
        self._closer = self._spawn(self._close_when_idle())

    async def wait_closed(self) -> None:
        """Wait until the consumer has closed its connections."""
        if self._started or self._stopping:
            await self._done.wait()
            await asyncio.gather(*(lane.client.aclose() for lane in self._lanes))

    async def aclose(self) -> None:
        """Close now: every job still held goes back to the server."""
        self._close_now()
        await self.wait_closed()

    async def __aenter__(self) -> Consumer:
        self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc is None:
            self.stop()
            await self.wait_closed()
        else:
            self._close_now()

    def __aiter__(self) -> AsyncIterator[Job]:
        return self

    async def __anext__(self) -> Job:
        self._start()
        self._iterating = asyncio.current_task(self._loop)
        while True:
            if self._failure is not None:
                raise self._failure
            if self._stopping:
                raise StopAsyncIteration
            while self._ready:
                job = self._ready.popleft()
                hold = _hold_of(job)
                if hold is not None:  # else its connection was lost while it waited here
                    hold.handed = True
                    self._handed.add(job)
                    return job
            assert self._loop is not None
            reader: asyncio.Future[None] = self._loop.create_future()
            self._readers.add(reader)
            try:
                await reader
            except asyncio.CancelledError:
                self._close_now()
                raise
            finally:
                self._readers.discard(reader)

    async def run(self, handler: Callable[[Job], Awaitable[object]]) -> None:
        """Call ``handler(job)`` in a task per job, at most ``concurrency`` at once, until
        :meth:`stop` (then waits up to ``grace`` s for the running ones) or cancellation.
        A job someone cancels (tubeq's ``cancel``) while its handler runs: with ``auto_touch``
        the handler's task is cancelled (asyncio.CancelledError inside it) at the next touch;
        else its finish or fail hears it. Either way the server has dropped the job.

        A job the handler did not settle itself is settled as ``async with job`` settles it
        (deleted when the handler returns, released or buried when it raises); but a handler
        that returns ``bytes`` or a ``str`` answers the job: on a server with ``finish``
        (tubeq) it is finished with that result, for whoever waits for it (``Client.call``,
        ``Client.wait``). With ``codec`` (e.g. :data:`tubeq.client.JSON`) any value but None
        is encoded by it and answers the job. On beanstalkd, and for any other return value,
        it is deleted.

        Traces: where the application has set an OpenTelemetry tracer provider, the handler
        runs in a span ``process <tube>`` that is a child of the job's context (put-with
        traceparent=, which the bundled producer sets from its current span) and linked to
        it, so the handler's own spans join the producer's trace; the context costs one
        ``stats-job`` per job then, and nothing otherwise (tubeq.client.tracing)."""
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()

        async def handle(job: Job) -> None:
            """``async with job:`` around the handler, but that a block that succeeded sends
            its delete without waiting for the answer (_delete_soon): the task ends with the
            handler, with no future and no step more of its own."""
            hold = _hold_of(job)
            if hold is not None:
                hold.handler = asyncio.current_task(loop)
            try:
                try:
                    if tracing.recording():
                        traceparent = await self._traceparent(job)
                        with tracing.handler_span(traceparent, job.id, job.tube):
                            result = await handler(job)
                    else:  # (no span to make: no context manager per job either)
                        result = await handler(job)
                    if result is not None and self.codec is not None:
                        result = self.codec.encode(result)
                    if isinstance(result, bytes | str) and await self._server_has(job,
                                                                                  "finish"):
                        if hold is not None:
                            hold.settling = True  # (a stop past the grace lets it finish)
                        await self._finish(job, result)
                except BaseException as exc:
                    if not await job.__aexit__(type(exc), exc, exc.__traceback__):
                        raise
                else:
                    if _hold_of(job) is not None:  # (else it settled itself in the handler)
                        self._delete_soon(job)
            except JobCancelled:  # cancelled while held: the server dropped it
                log.info("job %d was cancelled", job.id)

        # At most ``concurrency`` handlers at once (prefetched jobs wait): the loop waits for
        # one to end (a counter and a future: this loop is the one taker, where an
        # asyncio.Semaphore's acquire scans its waiters in 3.11, per job).
        room: asyncio.Future[None] | None = None

        def ended(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if room is not None and not room.done():
                room.set_result(None)

        try:
            while True:
                while len(tasks) >= self.concurrency:
                    room = loop.create_future()
                    await room
                try:
                    job = await self.__anext__()
                except StopAsyncIteration:
                    break
                task = loop.create_task(handle(job))
                tasks.add(task)
                task.add_done_callback(ended)
            # stopped: the closer gives the handlers the grace, cancels the late ones (their
            # jobs are given back) and closes
            await self.wait_closed()
        except BaseException:
            self._close_now()
            raise
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _traceparent(self, job: Job) -> str | None:
        """The job's OpenTelemetry context (put-with traceparent=, stats-job's key), asked only
        where the application records spans (tracing.recording); None if it has none, or the
        server does not say (beanstalkd, or the question failed: the handler runs untraced)."""
        try:
            value = (await job.stats()).get("traceparent")
        except ClientError as error:
            log.debug("job %d: no trace context: %s", job.id, error)
            return None
        return value if isinstance(value, str) else None

    async def _finish(self, job: Job, result: bytes | str) -> None:
        """Finish ``job`` with its handler's ``result``; a result the server refuses (too big:
        --max-result-size) fails the job with that reason instead of running it again, and a
        finish that did not happen (the job gone, the connection lost) is logged, as a delete
        that did not happen is."""
        try:
            await job.finish(result)
        except JobTooBig as error:
            log.warning("job %d: its result is too big for the server; failed instead", job.id)
            await job.fail(f"result too big: {error}")
        except JobCancelled:
            raise
        except ClientError as error:
            log.warning("job %d done but not finished: %s", job.id, error)
            self._give_back_all(job, error)
            self._forget(job)

    async def _answers(self, job: Job) -> bool:
        """Whether ``job`` is still held here, on a connection to a server with ``finish``."""
        return await self._server_has(job, "finish")

    async def _server_has(self, job: Job, word: str) -> bool:
        """Whether ``job`` is still held here, on a connection to a server with ``word``."""
        hold = _hold_of(job)
        link = job._link
        if hold is None or link is None:
            return False
        known = link.extensions  # asked once per connection
        if known is None:
            known = await hold.lane.client._extensions_of(link)
        return word in known

    # -- lifecycle ----------------------------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        if self.stop_signals and threading.current_thread() is threading.main_thread():
            _STOP_ON_SIGNALS.add(self)
        for lane in self._lanes:
            self._drivers.append(self._spawn(self._drive(lane)))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _close_when_idle(self) -> None:
        """After stop(): wait (bounded by the grace) until the handed-out jobs are settled;
        then cancel the handlers still running, give back every job still held (and any
        pushed since), wait for that (bounded), and close."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.grace):
                while self._handed:
                    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    self._readers.add(waiter)
                    try:
                        await waiter
                    finally:
                        self._readers.discard(waiter)
        late: list[asyncio.Task[None]] = []
        for lane in self._lanes:
            for job in list(lane.held):
                hold = _hold_of(job)
                if hold is None or hold.settling:
                    continue  # its block ended: its delete (or finish...) is on its way
                if hold.handler is not None and not hold.handler.done():
                    hold.handler.cancel()  # its block gives the job back (_settle_block)
                    late.append(hold.handler)
                else:
                    self._give_back(job)
            if lane.mode == "push":
                for job in lane.client.pushed_waiting():  # pushed after the stop
                    self._take(job, lane, uses_slot=False)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HAND_BACK_WAIT_S):
                if late:
                    await asyncio.wait(late)
                while self._handing:
                    await asyncio.wait(set(self._handing))
                while any(hold.settling for lane in self._lanes for job in lane.held
                          if (hold := _hold_of(job)) is not None):
                    settled = asyncio.get_running_loop().create_future()
                    self._readers.add(settled)  # woken as each job is forgotten (_forget)
                    try:
                        await settled
                    finally:
                        self._readers.discard(settled)
        self._close_now()

    def _close_now(self) -> None:
        """Close every connection at once; the server puts back whatever they still hold."""
        if self._closed:
            return
        self._closed = self._stopping = True
        _STOP_ON_SIGNALS.discard(self)
        current = asyncio.current_task()
        for task in list(self._background):
            if task is not current:
                task.cancel()
        for lane in self._lanes:
            lane.client.close()
            for job in list(lane.held):
                self._forget(job)
        self._ready.clear()
        self._wake_readers()
        self._done.set()

    def _wake_readers(self) -> None:
        for reader in self._readers:
            if not reader.done():
                reader.set_result(None)
        self._readers.clear()

    # -- one connection -----------------------------------------------------------------------

    async def _drive(self, lane: _Lane) -> None:
        delay = RECONNECT_MIN_S
        while not self._stopping:
            try:
                await lane.client.connect()  # a reconnect replays the watch list
                if not lane.subscribed:
                    for tube in self.tubes:
                        await lane.client.watch(tube)
                    if DEFAULT_TUBE not in self.tubes:
                        await lane.client.ignore(DEFAULT_TUBE)
                    lane.subscribed = True
                # Whether deletes can go as delete-many: asked now, before a reserve can hold
                # the question back.
                await lane.client._extensions_of(await lane.client._current_link())
                if await self._try_push(lane):
                    delay = RECONNECT_MIN_S
                    await self._take_pushed(lane)
                else:
                    delay = RECONNECT_MIN_S
                    await self._reserve_pipelined(lane)
            except (ClientConnectionError, ProtocolError, InternalError) as error:
                # InternalError: the server lost its store (tubeq without Redis): start over.
                log.warning("consumer connection %d to %s: %s; reconnecting in %.1f s",
                            lane.index, lane.client.address, error, delay)
                lane.client.close()
                self._drop_unhanded(lane)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
            except asyncio.CancelledError:
                raise
            except BaseException as error:  # e.g. push=True against beanstalkd
                self._failure = error
                self._close_now()
                return

    async def _try_push(self, lane: _Lane) -> bool:
        if self.push is False:
            lane.mode = "reserve"
            return False
        # Jobs still held from a lost connection count against this lane's share: wait until
        # their handlers settle them, or the server's credits would exceed the bound.
        while lane.held:
            await asyncio.sleep(DEADLINE_SOON_PAUSE_S)
        try:
            await lane.client.push(lane.share,
                                   on_cancelled=lambda job_id: self._cancelled(lane, job_id),
                                   on_quiet=self._quieted)
        except UnknownCommand:
            if self.push:
                raise
            lane.mode = "reserve"
            return False
        lane.mode = "push"
        return True

    def _quieted(self) -> None:
        """The server asks this consumer to stop taking jobs (push ... quiet=1): it stops,
        as on :meth:`stop`."""
        if not self._stopping:
            log.info("the server at %s asks this consumer to stop taking jobs: stopping",
                     self._lanes[0].client.address)
            self.stop()

    def _cancelled(self, lane: _Lane, job_id: int) -> None:
        """The server says a job this lane holds was cancelled (push ... cancels=1): its
        handler's task is cancelled at once, as auto_touch does at its next touch; the job's
        settling (a release) lets the server drop it."""
        for job in lane.held:
            hold = _hold_of(job)
            if job.id == job_id and hold is not None and hold.handler is not None:
                log.info("job %d was cancelled: its handler is cancelled", job_id)
                hold.handler.cancel()

    async def _stop_pushing(self, lane: _Lane) -> None:
        """``push 0``: no new deliveries while the jobs handed out finish."""
        with contextlib.suppress(ClientError):
            await lane.client.push(0)

    async def _take_pushed(self, lane: _Lane) -> None:
        """Take the jobs the server pushes, each once the lane has a free slot.

        The server's credits bound what it has reserved for this connection, not what the lane
        holds: it frees a credit as soon as it has run a delete (or release, bury), and pushes the
        next job at once, while the block whose job that was has yet to hear the answer (a
        batched delete's answer reaches it through ``_delete_acked``, a task in between) and to
        drop its hold. Until then the new job waits in the link's queue, reserved on the server
        (its credit used), and is not handed out: held jobs never exceed the share.
        """
        while True:
            await lane.slots.acquire()
            try:
                job = await lane.client.next_pushed()
            except BaseException:
                lane.slots.release()
                raise
            self._take(job, lane, uses_slot=True)

    async def _reserve_pipelined(self, lane: _Lane) -> None:
        """``lane.share`` reservers on one connection; only the first one's reserve may wait.

        The first asks for a job and loops; when it gets one, jobs are coming: the others ask
        with timeout 0 (answered at once) until one times out, then wait for the first to see
        work again. Each reserver takes a slot before asking, so held jobs plus reserves in
        flight never exceed the share.

        The first one's reserve waits (``reserve_timeout`` s) only while the connection holds
        no job and has no other reserve in flight: the server answers in order, so a delete sent
        behind a waiting reserve is answered only when that reserve ends (up to the timeout;
        the last deletes of a drained queue did wait that long). A timeline of what this rules
        out, one connection, an empty queue after job 7::

            reserve-with-timeout 1  ->  RESERVED 7      (the first reserver loops at once)
            reserve-with-timeout 1                      (sent before job 7's block ends)
            delete 7                                    (answered after the reserve: ~1 s)

        While the connection holds jobs the first asks with timeout 0 instead, and when the
        queue is empty waits until one of the lane's jobs is settled, or ``reserve_timeout`` s
        at most (so a connection whose jobs run long still looks for new ones that often, as the
        waiting reserve did), then asks again. Nothing else may queue behind the waiting reserve:
        the jobs reserved through reserves sent after it are answered after it.
        """
        busy = asyncio.Event()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._reserver(lane, busy, first=(i == 0)))
                 for i in range(lane.share)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # raises the connection error that ended it
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _reserver(self, lane: _Lane, busy: asyncio.Event, *, first: bool) -> None:
        client = lane.client
        while True:
            if not first:
                await busy.wait()
            await lane.slots.acquire()
            # Decided and sent in one step (the reserve is written before the first await when
            # the connection is up): nothing can be reserved between the check and the send.
            waits = first and not lane.held and lane.asking == 0
            job: Job | None = None
            pause = 0.0
            idle = False  # the first found the queue empty while this lane holds jobs
            lane.asking += 1
            try:
                job = await client.reserve_with_timeout(self.reserve_timeout if waits else 0)
            except TimedOut:
                lane.slots.release()
                if not first:
                    busy.clear()
                idle = first and not waits
            except DeadlineSoon:
                lane.slots.release()
                busy.clear()
                pause = DEADLINE_SOON_PAUSE_S
            except InternalError as error:  # the server's store failed; this connection is fine
                lane.slots.release()
                busy.clear()
                log.warning("reserve on consumer connection %d: %s", lane.index, error)
                pause = RECONNECT_MAX_S
            except BaseException:
                lane.slots.release()
                raise
            finally:
                lane.asking -= 1
            if job is not None:
                if first:
                    busy.set()
                self._take(job, lane, uses_slot=True)
            elif idle:
                await self._settled_or_timeout(lane)
            elif pause:
                await asyncio.sleep(pause)

    async def _settled_or_timeout(self, lane: _Lane) -> None:
        """Wait until a job the lane holds is settled (or the lane holds none), bounded by
        ``reserve_timeout`` s."""
        if not lane.held:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lane.settle_waiters.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(self.reserve_timeout, 0.05)):
                    await waiter
        finally:
            lane.settle_waiters.discard(waiter)

    # -- held jobs ----------------------------------------------------------------------------

    def _take(self, job: Job, lane: _Lane, *, uses_slot: bool) -> None:
        if len(self.tubes) == 1:
            job.tube = self.tubes[0]
        job._hold = hold = _Hold(self, lane, uses_slot)
        lane.held.add(job)
        if self._stopping:
            self._give_back(job)  # came after the stop (pushed, or a reserve's answer)
            return
        if self.auto_touch:
            hold.keep_alive = self._spawn(self._keep_alive(job))
        self._ready.append(job)
        self._wake_readers()

    def _forget(self, job: Job) -> None:
        """The job is no longer held: settled, or its connection is gone."""
        hold = _hold_of(job)
        if hold is None:
            return
        job._hold = None
        hold.lane.held.discard(job)
        self._handed.discard(job)
        if hold.keep_alive is not None and hold.keep_alive is not asyncio.current_task():
            hold.keep_alive.cancel()
        if hold.uses_slot:
            hold.lane.slots.release()
        hold.lane.wake_settle_waiters()
        if self._stopping:
            self._wake_readers()  # _close_when_idle counts the handed-out jobs

    def _drop_unhanded(self, lane: _Lane) -> None:
        """A lane's connection is gone: the jobs it held that nobody got are gone with it."""
        for job in list(lane.held):
            hold = _hold_of(job)
            if hold is not None and not hold.handed:
                self._forget(job)

    async def _keep_alive(self, job: Job) -> None:
        loop = asyncio.get_running_loop()
        hold = _hold_of(job)  # (a cancelled touch lets go of the job: kept here for its task)
        try:
            if job._ttr is None:
                await job.stats()
            interval = touch_interval(job._ttr if job._ttr is not None else DEFAULT_TTR)
            due = job.reserved_at + interval
            while True:
                await asyncio.sleep(max(0.0, due - loop.time()))
                sent = loop.time()
                await job.touch()
                due = sent + interval
        except JobCancelled:
            log.info("job %d was cancelled: its handler is cancelled", job.id)
            if hold is not None and hold.handler is not None:
                hold.handler.cancel()
        except ClientError as error:
            log.warning("auto_touch of job %d stopped: %s", job.id, error)

    async def _settle_block(self, job: Job, exc: BaseException | None) -> bool:
        """The end of ``async with job``: delete, or release with backoff / bury, or put back."""
        hold = _hold_of(job)
        if hold is not None:
            hold.settling = True  # (a stop past the grace lets it finish)
        if exc is None:
            try:
                deleted: bool | ClientError = await self._ack(job)
            except ClientError as error:
                deleted = error
            self._deleted(job, deleted)
            return False
        if not isinstance(exc, Exception):  # cancelled (or exiting): not the job's failure
            if isinstance(exc, asyncio.CancelledError) and (
                    asyncio.current_task() is self._iterating):
                self._close_now()  # the loop itself is being cancelled
            elif not self._closed:
                self._give_back(job)
            return False
        log.warning("job %d failed", job.id, exc_info=exc)
        try:
            if await self._answers(job):  # tubeq: fail, with the error and this policy
                await job.fail(_error_text(exc), max_tries=self.max_tries,
                               backoff_ms=self.backoff_base * 1000,
                               backoff_max_ms=self.backoff_max * 1000)
                return True
            stats = await job.stats()
            reserves, pri = int(stats["reserves"]), int(stats["pri"])
            if self.max_tries is not None and reserves >= self.max_tries:
                await job.bury(pri=pri)
            else:
                delay = backoff_delay(reserves, self.backoff_base, self.backoff_max)
                await job.release(pri=pri, delay=delay)
        except ClientError as error:
            log.warning("failed job %d not released: %s", job.id, error)
            self._give_back_all(job, error)
            self._forget(job)
        return True

    def _give_back_all(self, job: Job, error: ClientError) -> None:
        """A settle the server answered with an error other than NOT_FOUND (INTERNAL_ERROR:
        its Redis away or stalled; or no answer) leaves the job reserved for this connection,
        holding one of its push credits, until its TTR: close the lane's connection instead,
        so the server gives back every job it held (they run again: at least once) and the
        lane starts over with its full share (``_drive`` reconnects)."""
        hold = _hold_of(job)
        if hold is not None and not isinstance(error, NotFound):
            log.warning("consumer connection %d: reconnecting so that the server gives back "
                        "what it holds", hold.lane.index)
            hold.lane.client.close()

    # -- batched deletes ----------------------------------------------------------------------

    async def _ack(self, job: Job) -> bool:
        """Delete a job that succeeded along with the others of this loop tick; whether it was
        deleted (False: not found). Raises ClientError when the delete was not answered."""
        hold = _hold_of(job)
        assert hold is not None
        lane = hold.lane
        loop = self._loop or asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        if not lane.acks:
            loop.call_soon(self._send_acks, lane)
        lane.acks.append((job, done))
        return await done

    def _delete_soon(self, job: Job) -> None:
        """:meth:`_ack` for run()'s handler, which does not wait: the answer settles the job
        (:meth:`_deleted`) when its batch's comes."""
        hold = _hold_of(job)
        assert hold is not None
        hold.settling = True  # (a stop past the grace lets it finish)
        lane = hold.lane
        if not lane.acks:
            (self._loop or asyncio.get_running_loop()).call_soon(self._send_acks, lane)
        lane.acks.append((job, None))

    def _deleted(self, job: Job, deleted: bool | ClientError) -> None:
        """The end of a block that succeeded: its delete's answer (False: not found). A job
        the consumer no longer holds (it closed meanwhile: the server gives it back unless
        the delete was run) has nothing left to settle."""
        if _hold_of(job) is None:
            return
        if isinstance(deleted, ClientError):
            log.warning("job %d done but not deleted: %s", job.id, deleted)
            self._give_back_all(job, deleted)
        elif not deleted:
            log.warning("job %d done but not deleted: not found", job.id)
        self._forget(job)  # deleted, or the reservation is gone either way

    def _send_acks(self, lane: _Lane) -> None:
        acks, lane.acks = lane.acks, []
        by_link: dict[Any, list[tuple[Job, asyncio.Future[bool] | None]]] = {}
        for job, done in acks:  # one connection normally; a job from a lost one fails alone
            by_link.setdefault(job._link, []).append((job, done))
        for link, group in by_link.items():
            self._spawn(self._delete_acked(lane, link, group))

    async def _delete_acked(self, lane: _Lane, link: Any,
                            group: list[tuple[Job, asyncio.Future[bool] | None]]) -> None:
        outcomes: list[bool | ClientError] = []
        try:
            if link is None:
                raise ClientConnectionError("job not bound to a connection")
            outcomes += await lane.client._delete_many_on(link, [job.id for job, _ in group])
        except ClientError as error:
            outcomes = [error] * len(group)
        finally:  # cancelled (the consumer closes): the blocks waiting must not hang
            if len(outcomes) != len(group):
                outcomes = [ClientConnectionError("the consumer closed")] * len(group)
            for (job, done), outcome in zip(group, outcomes, strict=True):
                if done is None or done.cancelled():  # (no block waits: settled here)
                    self._deleted(job, outcome)
                elif isinstance(outcome, ClientError):
                    done.set_exception(outcome)
                else:
                    done.set_result(outcome)

    def _give_back(self, job: Job) -> None:
        """Give back a held job that is not to run here (the consumer stops, or its handler
        was cancelled), once, in a task the closer waits for."""
        hold = _hold_of(job)
        if hold is None or hold.handing_back:
            return
        hold.handing_back = True
        task = self._spawn(self._hand_back(job))
        self._handing.add(task)
        task.add_done_callback(self._handing.discard)

    async def _hand_back(self, job: Job) -> None:
        """tubeq: ``hand-back`` (ready at once, no try counted); else a release at the job's
        own priority with no delay."""
        try:
            if await self._server_has(job, "hand-back"):
                await job.hand_back()
            else:
                await job.release(delay=0)
        except JobCancelled:
            log.info("job %d was cancelled", job.id)
        except ClientError as error:
            log.debug("job %d not given back: %s", job.id, error)
            self._forget(job)


class _SignalStops:
    """The consumers that stop on signals (``stop_signals``), and the loop's one handler per
    signal that stops them all: several consumers of one process share it. It takes a signal
    only while nobody else handles it (its disposition is the default: an application's own
    handler, the loop's or not, is left alone) and gives it back to the default once the last
    of its consumers closed. A new event loop starts afresh (consumers of a loop that ended
    are forgotten)."""

    def __init__(self) -> None:
        self._consumers: dict[int, set[Consumer]] = {}  # signal -> the consumers it stops
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, consumer: Consumer) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._consumers, self._loop = {}, loop
        for sig in consumer.stop_signals:
            consumers = self._consumers.get(sig)
            if consumers is None:
                if signal.getsignal(sig) not in (signal.SIG_DFL, signal.default_int_handler):
                    log.info("signal %d has a handler already: consume() leaves it alone", sig)
                    continue
                try:
                    loop.add_signal_handler(sig, self._stop, sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    continue  # no signals on this loop (Windows, or not the main thread)
                consumers = self._consumers[sig] = set()
            consumers.add(consumer)

    def discard(self, consumer: Consumer) -> None:
        for sig, consumers in list(self._consumers.items()):
            consumers.discard(consumer)
            if not consumers:
                del self._consumers[sig]
                if self._loop is not None and not self._loop.is_closed():
                    self._loop.remove_signal_handler(sig)

    def _stop(self, sig: int) -> None:
        consumers = list(self._consumers.get(sig, ()))
        log.info("signal %d: stopping %d consumer(s)", sig, len(consumers))
        for consumer in consumers:
            consumer.stop()


_STOP_ON_SIGNALS: Final = _SignalStops()


# A handler's exception as fail's error text: its type and message, at most this many bytes
# (a traceback stays in the worker's log).
ERROR_TEXT_MAX = 4096


def _error_text(exc: BaseException) -> bytes:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text.encode("utf-8", "replace")[:ERROR_TEXT_MAX]
