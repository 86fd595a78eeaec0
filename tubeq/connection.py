"""One client connection: the thin asyncio adapter between the parser and the store.

Bytes go to the sans-IO parser; each command it yields is dispatched at once to a handler that
returns its reply, either as bytes or as a future of bytes (a store call in flight). Replies
leave strictly in command order, coalesced into one write per loop tick. Pipelined commands
therefore reach Redis without waiting for each other. A reserve's first try goes out at once
too; as a reserve may have to wait, only commands that cannot change what it gets pass it
(see ``_may_pass_a_reserve``), and the first reserve that finds nothing waits for a job.

The connection owns its reservations (beanstalkd semantics): only it may delete, release, bury
or touch them, and when it goes away (quit, EOF, reset) disconnect.lua puts them back at once.
It keeps their deadlines locally for DEADLINE_SOON, which only it can be told.

Push extension (``push <credits>``, tubeq only): the connection then receives RESERVED frames
for ready jobs of its watched tubes without asking, at most ``credits`` unsettled at a time,
taken several per script call; each delete/release/bury of a pushed job (or its TTR running
out) frees a credit. The frames join the reply stream between whole replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import structlog

from tubeq import commands as c
from tubeq import replies
from tubeq.futures import discard
from tubeq.handlers import HANDLERS, Reply
from tubeq.protocol import Parser
from tubeq.scheduler import Scheduler
from tubeq.stats import CommandCounters, ServerIdentity
from tubeq.store import NoJob, Reservation, Store
from tubeq.using import UseLedger
from tubeq.waiters import Waiter, WaiterRegistry

log = structlog.get_logger(__name__)

# beanstalkd's safety margin: a reserved job whose TTR ends within this many ms makes a reserve
# answer DEADLINE_SOON (the worker should finish or touch it instead of taking more work).
SAFETY_MARGIN_MS = 1000
# A blocked reserve re-runs the reserve script at least this often even with no wake-up hint:
# hints are best effort (pub/sub), the script is the truth.
WAKE_RECHECK_S = 10.0

# Past this many held jobs, a new reservation first drops the ones whose TTR ran out, so a
# worker that lets jobs time out does not grow the map forever.
PRUNE_RESERVED_AT = 64
# The push extension takes at most this many jobs per script call, however many credits a
# client grants: one call must not hold Redis's single thread for long.
PUSH_BATCH_MAX = 64

T = TypeVar("T")


@dataclass(eq=False)
class PendingReserve:
    """A reserve sent to Redis and not yet answered."""

    timeout_s: int | None  # None waits forever
    reply: asyncio.Future[bytes]
    tried: bool = False  # its first try has come back
    failed: bool = False  # ... with a store error


@dataclass
class ServerContext:
    """What every connection of one tubeq process shares."""

    store: Store
    registry: WaiterRegistry
    scheduler: Scheduler
    counters: CommandCounters
    using: UseLedger
    identity: ServerIdentity
    max_job_size: int
    draining: bool = False
    connections: dict[str, Connection] = field(default_factory=dict)  # by token
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def next_token(self) -> str:
        return f"{self.store.instance_id}:{next(self._seq)}"


class Connection(asyncio.Protocol):
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.token = ctx.next_token()
        self.parser = Parser(ctx.max_job_size)
        self.used = "default"
        self.watched = ["default"]
        self.reserved: dict[int, int] = {}  # job id -> TTR deadline (ms)
        self.producer = False
        self.worker = False
        self.transport: asyncio.Transport | None = None
        self._replies: deque[Reply] = deque()
        self._flush_scheduled = False
        self._reserves: deque[PendingReserve] = deque()  # unanswered reserves, in order
        self._pool: deque[Reservation] = deque()  # granted, not yet handed to a reserve
        self._held: c.Command | None = None  # parsed, waiting for the reserves before it
        self._grants: set[asyncio.Future[Any]] = set()  # store calls that may grant jobs
        self._blocking: asyncio.Task[bytes] | None = None  # the head reserve's wait
        self._waiter: Waiter | None = None
        self._push_credits = 0
        self._pushed: set[int] = set()
        self._push_task: asyncio.Task[None] | None = None
        self._push_waiter: Waiter | None = None
        self._quit = False
        self._eof = False
        self._lost = False
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.ctx.connections[self.token] = self
        self.store.connect(self.token).add_done_callback(discard)
        in_redis = self.ctx.using.acquire(self.used)
        if in_redis is not None:
            in_redis.add_done_callback(discard)

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        self._pump()

    def eof_received(self) -> bool:
        # Half-close: answer what was sent, a blocked reserve gets TIMED_OUT, then close.
        self._eof = True
        if self._waiter is not None:
            self._waiter.wake()
        if self._push_task is not None:
            self._push_task.cancel()
        self._maybe_close()
        return True

    def pause_writing(self) -> None:
        assert self.transport is not None
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        assert self.transport is not None
        if not self._lost:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.ctx.connections.pop(self.token, None)
        running = [t for t in (self._blocking, self._push_task) if t is not None and not t.done()]
        for task in running:
            task.cancel()
        # Wait for the tasks' `finally` (it takes the connection out of the waiters) and for
        # reserve calls still in flight, whose grants must be in `reserved` before
        # disconnect.lua hands every job back.
        pending = [*running, *self._grants]
        if pending:
            gathered = asyncio.gather(*pending, return_exceptions=True)
            gathered.add_done_callback(lambda _: self._disconnect())
        else:
            self._disconnect()

    def _disconnect(self) -> None:
        self.ctx.using.release(self.used)
        done = self.store.disconnect(self.token, self.producer, self.worker, list(self.reserved))
        done.add_done_callback(self._disconnected)

    def _disconnected(self, f: asyncio.Future[Any]) -> None:
        if not f.cancelled() and f.exception() is not None:
            log.warning("disconnect cleanup failed", token=self.token, error=repr(f.exception()))
        if not self._closed.done():
            self._closed.set_result(None)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def close(self) -> None:
        if self.transport is not None and not self._lost:
            self.transport.close()

    def mark_producer(self) -> None:
        """This connection has put a job: it counts in current-producers from now on."""
        if not self.producer:
            self.producer = True
            self.store.bump_gauge("producers", 1)

    def mark_worker(self) -> None:
        """This connection has reserved (or asked for pushed jobs): it counts in current-workers."""
        if not self.worker:
            self.worker = True
            self.store.bump_gauge("workers", 1)

    def quit(self) -> None:
        """Stop reading commands; close once the replies before the quit are written."""
        self._quit = True

    # -- command flow -------------------------------------------------------------------------

    def _pump(self) -> None:
        while not self._quit and not self._lost:
            if self._held is not None:
                if self._reserves:
                    break
                command, self._held = self._held, None
            else:
                parsed = self.parser.next_command()
                if parsed is None:
                    break
                command = parsed
                if self._reserves and not self._may_pass_a_reserve(command):
                    self._held = command
                    break
            self._dispatch(command)
        self._maybe_close()

    def _may_pass_a_reserve(self, command: c.Command) -> bool:
        """Whether ``command`` may go to Redis while a reserve before it is unanswered.

        beanstalkd runs a connection's commands one at a time, so a reserve that blocks holds
        what follows. tubeq sends a reserve's first try at once and lets through only commands
        that cannot change what that reserve gets: further reserves, and delete, bury or touch
        of a job this connection already holds (none of them makes a job ready). The rest wait
        until every reserve before them has answered. Replies keep their order either way.
        """
        kind = type(command)
        if kind in _RESERVES:
            return True
        if kind in _ON_HELD_JOBS:
            return cast(c.Delete | c.Bury | c.Touch, command).id in self.reserved
        return False

    def _dispatch(self, command: c.Command) -> None:
        if command.stat is not None:
            self.ctx.counters.incr(command.stat)
        handler = HANDLERS[type(command)]
        try:
            reply = handler(self, command)
        except Exception:
            log.exception("handler failed", command=type(command).__name__)
            reply = replies.INTERNAL_ERROR
        if reply is None:
            return
        self._replies.append(reply)
        if isinstance(reply, bytes):
            self._schedule_flush()
        else:
            reply.add_done_callback(self._reply_done)

    def _reply_done(self, reply: asyncio.Future[bytes]) -> None:
        # A lone reply (one command in flight: a round-trip-bound client) is written at once;
        # several wait for the end of the tick and leave in one write.
        if len(self._replies) == 1 and self._replies[0] is reply and not self._flush_scheduled:
            self._flush()
        else:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out: list[bytes] = []
        while self._replies:
            head = self._replies[0]
            if isinstance(head, bytes):
                out.append(head)
            elif head.done():
                out.append(_reply_bytes(head))
            else:
                break
            self._replies.popleft()
        if out and self.transport is not None and not self._lost:
            self.transport.write(b"".join(out))
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self._lost or self.transport is None or self._replies or self._reserves:
            return
        # After EOF whatever is left in the parser is an incomplete command that cannot finish.
        if self._quit or self._eof:
            self.transport.close()

    # -- reserve ------------------------------------------------------------------------------

    def start_reserve(self, timeout_s: int | None) -> Reply:
        """Send this reserve's first try now; it answers in order (see :meth:`_advance`)."""
        self.mark_worker()
        pending = PendingReserve(timeout_s, asyncio.get_running_loop().create_future())
        self._reserves.append(pending)
        attempt = self.track_grants(self.store.reserve(self.token))
        attempt.add_done_callback(functools.partial(self._tried, pending))
        return pending.reply

    def track_grants(self, call: asyncio.Future[T]) -> asyncio.Future[T]:
        """Record the jobs a store call grants as this connection's, whatever becomes of the
        command that asked (a disconnect must hand them back)."""
        self._grants.add(call)
        call.add_done_callback(self._granted)
        return call

    def _granted(self, f: asyncio.Future[Any]) -> None:
        self._grants.discard(f)
        if f.cancelled() or f.exception() is not None:
            return
        result = f.result()
        for job in result if isinstance(result, list) else [result]:
            if isinstance(job, Reservation):
                self._hold(job)

    def _hold(self, job: Reservation) -> None:
        if len(self.reserved) >= PRUNE_RESERVED_AT:
            # Jobs whose TTR ran out are no longer ours (expire.lua requeued them, or will).
            now = self.store.clock()
            self.reserved = {j: d for j, d in self.reserved.items() if d > now}
        self.reserved[job.id] = job.deadline_ms
        self.ctx.scheduler.note_due(job.deadline_ms)

    def _tried(self, pending: PendingReserve, f: asyncio.Future[Reservation | NoJob]) -> None:
        pending.tried = True
        if f.cancelled() or f.exception() is not None:
            pending.failed = True
        elif isinstance(job := f.result(), Reservation):
            self._pool.append(job)
            if self._waiter is not None:
                self._waiter.wake()  # the blocked head takes it
        self._advance()

    def _advance(self) -> None:
        """Answer reserves in order with the jobs granted so far; the first reserve that finds
        none waits (``_wait_for_job``) and holds the rest. The job order among one
        connection's reserves is the grant order, as if they had run one by one."""
        while self._reserves and self._blocking is None and not self._lost:
            head = self._reserves[0]
            if not head.tried:
                return
            if head.failed:
                head.reply.set_result(replies.INTERNAL_ERROR)
            elif self._pool:
                head.reply.set_result(_reserved(self._pool.popleft()))
            else:
                task = asyncio.get_running_loop().create_task(self._wait_for_job(head.timeout_s))
                self._blocking = task
                task.add_done_callback(functools.partial(self._waited, head))
                return
            self._reserves.popleft()
        if not self._reserves and self._held is not None and not self._lost:
            asyncio.get_running_loop().call_soon(self._pump)  # commands held behind them

    def _waited(self, head: PendingReserve, task: asyncio.Task[bytes]) -> None:
        self._blocking = None
        if task.cancelled():
            return  # the connection is gone
        head.reply.set_result(_reply_bytes(task))
        self._reserves.popleft()
        self._advance()

    def _in_margin(self, now: int) -> bool:
        return any(d - SAFETY_MARGIN_MS <= now < d for d in self.reserved.values())

    def _next_margin_s(self, now: int) -> float | None:
        starts = [d - SAFETY_MARGIN_MS for d in self.reserved.values()
                  if d - SAFETY_MARGIN_MS > now]
        return (min(starts) - now) / 1000 if starts else None

    async def _wait_for_job(self, timeout_s: int | None) -> bytes:
        """A reserve whose first try found nothing: register, try, wait with a bound, try
        again (see tubeq.waiters for the timeline)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        registry = self.ctx.registry
        waiter: Waiter | None = None
        counted = consumed = False
        try:
            while True:
                if self._pool:  # a later reserve's try was granted a job: it is ours
                    consumed = True
                    return _reserved(self._pool.popleft())
                # One clock reading decides both "in the margin now" and "when the margin
                # starts", so no instant falls between the two checks.
                now = self.store.clock()
                remaining = None if deadline is None else deadline - loop.time()
                ending: bytes | None = None
                if self._in_margin(now):  # and nothing reservable (paused tubes count as empty)
                    ending = replies.DEADLINE_SOON
                elif self._eof or (remaining is not None and remaining <= 0):
                    ending = replies.TIMED_OUT
                if ending is not None:
                    if counted and not self._eof:
                        # A put may have handed us a job an instant ago: then it is the answer.
                        counted = False
                        handed = await self._stop_waiting()
                        if handed is not None:
                            consumed = True
                            return _reserved(handed)
                    return ending
                if waiter is None:
                    waiter = Waiter(self.watched)
                    self._waiter = waiter
                    registry.register(waiter)
                    counted = True
                    await self.store.set_waiting(self.token, 1)
                else:
                    bounds = [WAKE_RECHECK_S, remaining, self._next_margin_s(now)]
                    timeout = max(0.0, min(b for b in bounds if b is not None))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(waiter.event.wait(), timeout)
                    if self._eof:
                        return replies.TIMED_OUT
                    if self._pool:
                        continue
                waiter.rearm()
                call = self.track_grants(self.store.reserve(self.token, counted_waiting=counted))
                result = await asyncio.shield(call)
                if isinstance(result, Reservation):
                    consumed = True
                    counted = False  # the script counted us out of the waiters with the grant
                    return _reserved(result)
        finally:
            if waiter is not None:
                self._waiter = None
                registry.unregister(waiter, consumed=consumed)
            if counted:
                stopped = self.track_grants(
                    self.store.set_waiting(self.token, -1, claim=not self._lost))
                stopped.add_done_callback(self._pool_handed)

    async def _stop_waiting(self) -> Reservation | None:
        """Count this connection out of the waiters and claim what a put handed it meanwhile
        (at most one job per wait; any more go to the pool)."""
        handed = await asyncio.shield(
            self.track_grants(self.store.set_waiting(self.token, -1, claim=True)))
        if not handed:
            return None
        self._pool.extend(handed[1:])
        return handed[0]

    def _pool_handed(self, f: asyncio.Future[list[Reservation]]) -> None:
        """Jobs claimed after the wait that should have had them ended: the next reserves'."""
        if f.cancelled() or f.exception() is not None or not f.result() or self._lost:
            return
        self._pool.extend(f.result())
        if self._waiter is not None:
            self._waiter.wake()
        self._advance()

    def job_handed_over(self) -> None:
        """put.lua handed this connection a job while it waited: the next try claims it."""
        for waiter in (self._waiter, self._push_waiter):
            if waiter is not None:
                waiter.wake()

    # -- push extension -----------------------------------------------------------------------

    def start_push(self, credits: int) -> bytes:
        self.mark_worker()  # a push consumer is a worker, as a reserving one is
        self._push_credits = credits
        if self._push_task is None:
            self._push_task = asyncio.get_running_loop().create_task(self._push())
        elif self._push_waiter is not None:
            self._push_waiter.event.set()
        return replies.pushing(credits)

    def settled(self, job_id: int) -> None:
        """A job this connection held is no longer its own: free its push credit, if any."""
        self.reserved.pop(job_id, None)
        if job_id in self._pushed:
            self._pushed.discard(job_id)
            if self._push_waiter is not None:
                self._push_waiter.event.set()

    async def _push(self) -> None:
        """Deliver ready jobs while credits allow; sleep on the waiter registry otherwise."""
        registry = self.ctx.registry
        waiter = Waiter(self.watched)
        self._push_waiter = waiter
        registry.register(waiter)
        counted = False
        try:
            while True:
                now = self.store.clock()
                for job_id in [j for j in self._pushed if self.reserved.get(j, 0) <= now]:
                    self.settled(job_id)  # its TTR ran out: the job is back in the queue
                free = self._push_credits - len(self._pushed)
                if free > 0:
                    waiter.rearm()
                    call = self.store.reserve_many(self.token, min(free, PUSH_BATCH_MAX),
                                                   counted_waiting=counted)
                    jobs = await asyncio.shield(self.track_grants(call))
                    if jobs:
                        counted = False  # the script counted us out of the waiters
                        for job in jobs:
                            self._pushed.add(job.id)
                            self._push_frame(_reserved(job))
                        continue
                    if not counted:
                        counted = True
                        await self.store.set_waiting(self.token, 1)
                        continue  # try once more now that a put would wake us
                elif counted:
                    # No credit left (push 0, or credits lowered): stop waiting, so puts stop
                    # handing jobs over; one a put handed over while credit was free is sent.
                    counted = False
                    handed = await asyncio.shield(self.track_grants(
                        self.store.set_waiting(self.token, -1, claim=True)))
                    for job in handed:
                        self._pushed.add(job.id)
                        self._push_frame(_reserved(job))
                timeout = WAKE_RECHECK_S
                deadlines = [self.reserved[j] for j in self._pushed if j in self.reserved]
                if deadlines:  # wake when a pushed job's TTR runs out: its credit comes back
                    timeout = min(timeout, (min(deadlines) - now) / 1000)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.event.wait(), max(0.0, timeout))
                waiter.event.clear()
        finally:
            self._push_waiter = None
            registry.unregister(waiter, consumed=True)
            if counted:
                self.store.set_waiting(self.token, -1).add_done_callback(discard)

    def _push_frame(self, frame: bytes) -> None:
        self._replies.append(frame)
        self._schedule_flush()


# Command classes by what may overtake a reserve (exact types: a set lookup beats isinstance
# with a union on this path, which every command behind a reserve takes).
_RESERVES: frozenset[type[c.Command]] = frozenset({c.Reserve, c.ReserveWithTimeout})
_ON_HELD_JOBS: frozenset[type[c.Command]] = frozenset({c.Delete, c.Bury, c.Touch})


def _reserved(job: Reservation) -> bytes:
    return replies.reserved(job.id, job.body)


def _reply_bytes(f: asyncio.Future[bytes]) -> bytes:
    if f.cancelled():
        return replies.INTERNAL_ERROR
    exc = f.exception()
    if exc is not None:
        log.warning("store call failed", error=repr(exc))
        return replies.INTERNAL_ERROR
    return f.result()
