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

Flow control (its bounds, and when reading pauses) is tubeq.server.flow's; the push extension's
loop and credits are tubeq.server.push's, its frames joining the reply stream between whole
replies; a blocked reserve waits through tubeq.server.wait.

What the connections of a namespace share (ServerContext) and what handlers may touch of a
connection (Session) are tubeq.server.context's; this module implements Session.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, TypeVar, cast

import structlog

from tubeq.protocol import commands as c
from tubeq.protocol import replies
from tubeq.protocol.parser import Parser
from tubeq.redisio.client import ran
from tubeq.redisio.futures import chain, discard
from tubeq.server.context import (
    RESTORE_RETRY_S,
    Reply,
    ServerContext,
)
from tubeq.server.flow import TURN_BUDGET, FlowControl
from tubeq.server.handlers import GATE_HANDLERS, HANDLERS
from tubeq.server.metrics import command_label
from tubeq.server.push import Push
from tubeq.server.runs import DeleteRun, PutRun
from tubeq.server.wait import Wait
from tubeq.store.records import Deferred, NoJob, Reservation

log = structlog.get_logger(__name__)

# beanstalkd's safety margin: a reserved job whose TTR ends within this many ms makes a reserve
# answer DEADLINE_SOON (the worker should finish or touch it instead of taking more work).
SAFETY_MARGIN_MS = 1000

# A reserve-with-timeout answers TIMED_OUT at most this long after its timeout, whatever Redis
# does: a try or a count still in flight then is not waited for (a job it grants later goes to
# the connection's next reserve, or back to ready by TTR or when the connection closes).
RESERVE_GRACE_S = 0.25

# A closed connection's clean-up that failed (Redis went away) is tried again after
# RESTORE_RETRY_S, at most DISCONNECT_TRIES times (about a minute: a Redis away for longer lost
# nothing it holds, and a restart of this process is the remedy for what stays counted).
DISCONNECT_TRIES = 60

# Past this many held jobs, a new reservation first drops the ones whose TTR ran out, so a
# worker that lets jobs time out does not grow the map forever.
PRUNE_RESERVED_AT = 64

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class PendingReserve:
    """A reserve sent to Redis and not yet answered."""

    timeout_s: int | None  # None waits forever
    reply: asyncio.Future[bytes]
    number: int  # its place among the connection's reserves (1, 2, ...)
    tried: bool = False  # its first try has come back
    failed: bool = False  # ... with a store error
    count: int | None = None  # reserve-many: up to this many jobs, answered as one BATCH
    # When it became the next reserve to answer (loop time): its timeout runs from then, as
    # in beanstalkd, which takes a connection's commands one at a time.
    started: float = 0.0


# The handlers of a connection refused at once (over --max-connections): it gets none.
_REFUSED: dict[type[c.Command], Any] = {}

# A connection that sends this many bad tokens is closed: tokens are not to be guessed.
MAX_AUTH_FAILURES = 3


class Connection(asyncio.Protocol):
    # Slots: thousands of idle connections each save their instance dict (~700 B).
    __slots__ = (
        "_auth_failures", "_blocking", "_cleaned_up", "_closed", "_deferred", "_deletes",
        "_eof", "_flow", "_flush_scheduled", "_grants", "_handlers", "_held", "_lost",
        "_numbered", "_pool", "_prune_at", "_pump_scheduled", "_push", "_puts", "_quit",
        "_replies", "_reserves", "_turn", "_untried", "_wait", "batch_parts", "ctx", "extended",
        "parser", "passing", "producer", "replaying", "reserved", "store", "token", "transport",
        "used", "watched", "worker",
    )

    def __init__(self, ctx: ServerContext, *, gated: bool = False) -> None:
        """A connection in namespace ``ctx``; ``gated``: in none until ``auth`` (ctx is then the
        listener's, for its limits only: nothing is stored or counted before auth)."""
        self.ctx = ctx
        self._handlers = GATE_HANDLERS if gated else HANDLERS
        self._auth_failures = 0
        self.store = ctx.store
        self.token = ctx.next_token()
        # A put-many keeps at most half the buffer cap of bodies (tubeq.protocol.batch_framing).
        self.parser = Parser(ctx.max_job_size, max_batch_bytes=ctx.max_client_buffer // 2)
        self.used = "default"
        # A tuple, replaced on watch/ignore: every connection shares the default one, and a
        # Waiter takes it as it is (tuple() of a tuple is the same object).
        self.watched: tuple[str, ...] = _WATCH_DEFAULT
        self.reserved: dict[int, int] = {}  # job id -> TTR deadline (ms)
        self._prune_at = PRUNE_RESERVED_AT  # see _hold
        self.producer = False
        self.worker = False
        # The client has sent a tubeq extension command: it knows tubeq, so stats documents
        # carry tubeq's extra keys (a client that never does sees beanstalkd's documents).
        self.extended = ctx.extra_keys_always
        self.transport: asyncio.Transport | None = None
        # Lists, not deques or sets: they stay short, and an empty deque costs ~600 B and an
        # empty set ~200 B per connection (thousands of idle connections hold these).
        self._replies: list[Reply] = []
        self._flush_scheduled = False
        self._reserves: list[PendingReserve] = []  # unanswered reserves, in order
        self._pool: list[Reservation] = []  # granted, not yet handed to a reserve
        self._held: c.Command | None = None  # parsed, waiting for the reserves before it
        self._numbered = 0  # reserves so far (PendingReserve.number)
        # Commands sent past a reserve that Redis deferred (tubeq.store.records.Deferred): each with
        # its reply and the number of the last reserve before it; sent again once those reserves
        # have answered (_replay_deferred). None while there are none.
        self._deferred: list[tuple[c.Command, asyncio.Future[bytes], int]] | None = None
        # While a handler runs: the number of the first unanswered reserve the command passes
        # (0: none), for the store call; and whether the command is a deferred one sent again.
        self.passing = 0
        self.replaying = False
        self.batch_parts: list[Any] | None = None  # a put-many's parts before its last
        # A turn of _pump (the commands of one read): its puts, its deletes that wait for
        # nothing and its reserves' first tries go to Redis as one call of each kind when the
        # turn ends (_send_turn), or before a command that must follow them in Redis. The
        # runs and the list exist only while a turn has something in them.
        self._turn = False
        self._puts: PutRun | None = None
        self._deletes: DeleteRun | None = None
        self._untried: list[PendingReserve] | None = None
        # Store calls that may grant jobs; None while there are none (most of an idle life).
        self._grants: list[asyncio.Future[Any]] | None = None
        self._blocking: asyncio.Task[bytes] | None = None  # the head reserve's wait
        self._wait: Wait | None = None  # the head reserve's, while it waits
        self._push: Push | None = None  # from the first ``push`` on
        self._flow = FlowControl()
        self._pump_scheduled = False
        self._quit = False
        self._eof = False
        self._lost = False
        self._closed: asyncio.Future[None] | None = None  # made when someone waits
        self._cleaned_up = False

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = self._flow.transport = cast(asyncio.Transport, transport)
        if not self.ctx.capacity.take():
            # Over --max-connections: one clear line, then closed; nothing registered.
            self._handlers = _REFUSED
            self.transport.write(replies.TOO_MANY_CONNECTIONS)
            self.transport.close()
            log.warning("connection refused: --max-connections reached", peer=_peer(transport))
            return
        self.ctx.connections[self.token] = self  # so shutdown finds it, gated or not
        log.info("connection opened", conn=self.token, peer=_peer(transport))
        if self.ctx.observer is not None:
            self.ctx.observer.connections_opened += 1
        if self._handlers is HANDLERS:
            self._register()
        elif self.ctx.gate is not None:
            ctx = self.ctx.gate.by_certificate(transport.get_extra_info("peercert"))
            if ctx is not None:
                self.enter(ctx)

    def _register(self) -> None:
        """Count this connection in its namespace: from here on it may store and reserve."""
        self.ctx.registered[self.token] = self
        self.store.connect(self.token).add_done_callback(discard)
        in_redis = self.ctx.using.acquire(self.used)
        if in_redis is not None:
            in_redis.add_done_callback(discard)

    @property
    def puts(self) -> PutRun | None:
        """The turn's puts, for a put to join (None: it goes alone)."""
        if not self._may_join(self._puts):
            return None
        if self._puts is None:
            self._puts = PutRun(self.store)
        return self._puts

    @property
    def deletes(self) -> DeleteRun | None:
        """The turn's deletes, as :attr:`puts` (only those that wait for nothing ask: _pump)."""
        if not self._may_join(self._deletes):
            return None
        if self._deletes is None:
            self._deletes = DeleteRun(self.store, self.token)
        return self._deletes

    def _may_join(self, run: PutRun | DeleteRun | None) -> bool:
        """Whether a command may join ``run``, the turn's run of its kind: inside a turn, if
        the run holds commands already or more input was read after this one (one that would
        go alone takes the single-job script's path, at no cost of its own)."""
        return self._turn and (bool(run) or bool(self.parser.buffered))

    @property
    def authenticated(self) -> bool:
        """In a namespace (always, without an access file)."""
        return self._handlers is HANDLERS

    def enter(self, ctx: ServerContext) -> None:
        """Leave the gate for namespace ``ctx`` (a good token or client certificate)."""
        self.ctx.connections.pop(self.token, None)
        self.ctx = ctx
        self.store = ctx.store
        self.token = ctx.next_token()
        self._handlers = HANDLERS
        ctx.connections[self.token] = self
        self._register()

    def auth_failed(self) -> None:
        """One more bad token; the last one allowed closes the connection after its reply."""
        self._auth_failures += 1
        if self._auth_failures >= MAX_AUTH_FAILURES:
            log.warning("closing a connection after repeated bad tokens")
            self.quit()

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        self._pump()

    def eof_received(self) -> bool:
        # Half-close: answer what was sent, a blocked reserve gets TIMED_OUT, then close.
        self._eof = True
        if self._wait is not None:
            self._wait.wake()
        if self._push is not None:
            self._push.stop()
        self._maybe_close()
        return True

    def pause_writing(self) -> None:
        self._flow.pause_writing()

    def resume_writing(self) -> None:
        self._flow.resume_writing()
        if self._push is not None:
            self._push.nudge()
        # Whether or not the pump stopped for this, reading was paused: the pump decides anew.
        self._schedule_pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._flow.transport = None  # reading is left as it is
        if self._handlers is not _REFUSED:
            self.ctx.capacity.open -= 1
            log.info("connection closed", conn=self.token,
                     error=None if exc is None else repr(exc))
            if self.ctx.observer is not None:
                self.ctx.observer.connections_closed += 1
        self.ctx.connections.pop(self.token, None)
        if self._handlers is not HANDLERS:  # never entered a namespace: nothing to clean up
            self._cleaned_up = True
            if self._closed is not None and not self._closed.done():
                self._closed.set_result(None)
            return
        push_task = None if self._push is None else self._push.task
        running = [t for t in (self._blocking, push_task) if t is not None and not t.done()]
        for task in running:
            task.cancel()
        # Wait for the tasks' `finally` (it takes the connection out of the waiters) and for
        # reserve calls still in flight, whose grants must be in `reserved` before
        # disconnect.lua hands every job back.
        pending = [*running, *(self._grants or ())]
        if pending:
            gathered = asyncio.gather(*pending, return_exceptions=True)
            gathered.add_done_callback(lambda _: self._disconnect())
        else:
            self._disconnect()

    def _disconnect(self) -> None:
        self.ctx.registered.pop(self.token, None)
        using = self.ctx.using
        using.release(self.used)
        for tube in self.watched:
            using.watch(tube, -1)
        done = self.store.disconnect(self.token, self.producer, self.worker, list(self.reserved))
        done.add_done_callback(self._disconnected)
        if self.reserved:  # job policies: a backoff may have delayed them; re-aim the scheduler
            done.add_done_callback(lambda _: self.ctx.scheduler.note_due(self.store.clock()))

    def _disconnected(self, f: asyncio.Future[Any], tries: int = 1) -> None:
        if not f.cancelled() and f.exception() is not None:
            # Redis was away: the connection would stay listed, watching and counted for as
            # long as this process lives. disconnect.lua is idempotent: send it again.
            retry = tries < DISCONNECT_TRIES
            log.warning("disconnect cleanup failed", token=self.token, error=repr(f.exception()),
                        retry=retry)
            if retry:
                asyncio.get_running_loop().call_later(
                    RESTORE_RETRY_S, self._disconnect_again, tries + 1)
                return
        self._cleaned_up = True
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def _disconnect_again(self, tries: int) -> None:
        done = self.store.disconnect(self.token, self.producer, self.worker, list(self.reserved))
        done.add_done_callback(functools.partial(self._disconnected, tries=tries))

    async def wait_closed(self) -> None:
        """Return once the connection is gone and its jobs were handed back."""
        if self._cleaned_up:
            return
        if self._closed is None:
            self._closed = asyncio.get_running_loop().create_future()
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
        """Dispatch parsed commands until the input runs dry or a bound is reached; read on
        only when the input ran dry (or a reserve holds the rest and little has arrived)."""
        self._pump_scheduled = False
        flow = self._flow
        budget = TURN_BUDGET
        limit = self.ctx.max_in_flight
        read_on = False
        self._turn = True
        while not self._quit and not self._lost:
            # Flow control's bounds (tubeq.server.flow), checked here: once per command.
            if flow.write_paused or len(self._replies) >= limit:
                flow.throttled = True  # _flush or resume_writing pumps again
                break
            if not budget:
                self._schedule_pump()  # the other connections' turn first
                break
            if self._held is not None:
                if self._reserves:
                    read_on = flow.reads_behind_reserve(self.parser.buffered)
                    break
                command, self._held = self._held, None
            else:
                parsed = self.parser.next_command()
                if parsed is None:
                    read_on = True
                    break
                command = parsed
                if self._reserves and not self._may_pass_a_reserve(command):
                    self._held = command
                    read_on = flow.reads_behind_reserve(self.parser.buffered)
                    break
            passing = self._passing(command) if self._reserves else 0
            kind = type(command)
            # What this command may depend on goes to Redis first: the other kinds' runs (a
            # put or delete keeps its place among the others), or everything.
            if kind is c.Put:
                if self._deletes:
                    self._deletes.send()
            elif kind is c.Delete and not passing:
                if self._puts:
                    self._puts.send()
            elif kind not in _ONE_JOB_RESERVES:
                self._send_turn()
            self._dispatch(command, passing)
            budget -= 1
        self._send_turn()
        self._turn = False
        self._puts = self._deletes = None
        flow.set_reading(read_on)
        self._maybe_close()

    def _send_turn(self) -> None:
        """Send the turn's run of puts or deletes (one at a time is open), then its reserves'
        first tries, each as one store call. Sending those deletes before reserves that came
        first changes nothing: they passed the reserves with ``passing`` 0 (whatever the
        reserves do, they cannot see the jobs deleted); a put never passes a reserve. The
        reserves still answer in their own order."""
        if self._puts:
            self._puts.send()
        if self._deletes:
            self._deletes.send()
        untried = self._untried
        if not untried:
            return
        self._untried = None
        first = untried[0]
        attempt: asyncio.Future[Any]
        if len(untried) == 1:
            attempt = self.track_grants(self.store.reserve(self.token, number=first.number))
        else:
            attempt = self.track_grants(self.store.reserve_many(
                self.token, len(untried), number=first.number, each=True))
        attempt.add_done_callback(functools.partial(self._tried, untried))

    def _schedule_pump(self) -> None:
        self._flow.throttled = False
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _passing(self, command: c.Command) -> int:
        """For a command let past unanswered reserves: the number of the first of them, which
        it tells Redis (it is deferred if one of them waits), or 0 when it cannot change what
        any of them returns, whatever they do: a delete or touch of jobs whose TTR cannot reach
        its safety margin before every reserve ahead has ended, even waiting to its timeout.
        (A bury always tells: another connection's kick could hand the job to the reserve.)
        A pipelining consumer with a long TTR and a short reserve timeout so pays nothing."""
        kind = type(command)
        if kind in _RESERVES:
            return 0
        first = self._reserves[0].number
        if kind is c.Bury:
            return first
        horizon = self.store.clock()
        for reserve in self._reserves:
            if reserve.timeout_s is None:
                return first
            horizon += reserve.timeout_s * 1000 + int(RESERVE_GRACE_S * 1000)
        ids = cast(c.DeleteMany, command).ids if kind is c.DeleteMany else (
            cast(c.Delete | c.Touch, command).id,)
        reserved = self.reserved
        if all(reserved.get(i, 0) - SAFETY_MARGIN_MS > horizon for i in ids):
            return 0
        return first

    def _may_pass_a_reserve(self, command: c.Command) -> bool:
        """Whether ``command`` may go to Redis while a reserve before it is unanswered.

        beanstalkd runs a connection's commands one at a time, so a reserve that blocks holds
        what follows. tubeq sends a reserve's first try at once and lets through further
        reserves, and delete, bury or touch of a job this connection already holds: these go to
        Redis with the number of the first reserve they pass, and if one of those reserves found
        nothing on its first try (so it waits), the script does nothing and says so (Deferred):
        the command is sent again once those reserves have answered (_replay_deferred). A bury
        that ran at once could otherwise be kicked by another connection into the waiting
        reserve; a delete or touch would change what a TTR time-out returns to it. Once a
        reserve is known to wait, or where the store cannot defer (a split namespace), they
        wait in the connection like every other command: until every reserve before them has
        answered. Replies keep their order either way.
        """
        kind = type(command)
        if kind in _RESERVES:
            return True
        if self._blocking is not None or not self.store.defers_behind_reserves:
            return False
        if kind in _ON_HELD_JOBS:
            return cast(c.Delete | c.Bury | c.Touch, command).id in self.reserved
        if kind is c.DeleteMany:  # batches: only when every id is a job this connection holds
            return all(i in self.reserved for i in cast(c.DeleteMany, command).ids)
        return False

    def _dispatch(self, command: c.Command, passing: int = 0) -> None:
        """Run ``command``'s handler and queue its reply; ``passing``: the number of the first
        unanswered reserve it was let past (see :meth:`_may_pass_a_reserve`)."""
        handlers = self._handlers
        if command.stat is not None and handlers is HANDLERS:  # nothing counted before auth
            self.ctx.counters.incr(command.stat)
        handler = handlers[type(command)]
        self.passing = passing
        try:
            reply = handler(self, command)
        except Exception:
            log.exception("handler failed", command=type(command).__name__)
            reply = replies.INTERNAL_ERROR
        finally:
            self.passing = 0
        if reply is None:
            return
        if passing and not isinstance(reply, bytes):  # Redis may defer it: see _passed
            outcome = reply
            reply = asyncio.get_running_loop().create_future()
            outcome.add_done_callback(functools.partial(
                self._passed, command, reply, self._reserves[-1].number))
        self._replies.append(reply)
        observer = self.ctx.observer
        if isinstance(reply, bytes):
            if observer is not None:
                observer.answered(command_label(type(command)), reply)
            self._schedule_flush()
        elif type(command) not in _RESERVES:  # a reserve's reply is written by _answer
            if observer is None:
                reply.add_done_callback(self._reply_done)
            else:  # the same one callback, which also tells the observer (tubeq.server.metrics)
                reply.add_done_callback(functools.partial(
                    self._observed_reply_done, command_label(type(command)), perf_counter()))

    def _observed_reply_done(self, label: str, started: float,
                             reply: asyncio.Future[bytes]) -> None:
        observer = self.ctx.observer
        assert observer is not None
        observer.finished(self.token, label, started, reply)
        self._reply_done(reply)

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
        for head in self._replies:
            if isinstance(head, bytes):
                out.append(head)
            elif head.done():
                out.append(_reply_bytes(head, self.extended))
            else:
                break
        del self._replies[:len(out)]
        transport = self.transport
        if out and transport is not None and not self._lost:
            transport.write(b"".join(out))
            if self._flow.aborted_over_cap(self.parser.buffered, self.ctx.max_client_buffer,
                                           self.token):
                return
        flow = self._flow
        if flow.throttled and not flow.write_paused:  # replies left: the pump's bound lifts
            self._schedule_pump()
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self._lost or self.transport is None or self._replies or self._reserves:
            return
        # Half-close, as beanstalkd: every command received before the EOF runs and answers
        # first, also those a reserve held or the pump left at a bound (it runs again); only
        # then is what is left in the parser an incomplete command that cannot finish.
        answered_to_eof = self._eof and self._held is None and not self._pump_scheduled \
            and not self._flow.throttled
        if self._quit or answered_to_eof:
            self.transport.close()

    # -- reserve ------------------------------------------------------------------------------

    def start_reserve(self, timeout_s: int | None, count: int | None = None) -> Reply:
        """Send this reserve's first try now; it answers in order (see :meth:`_advance`).
        With ``count`` (reserve-many) it takes up to that many jobs, answered as one BATCH."""
        self.mark_worker()
        self._numbered += 1
        pending = PendingReserve(timeout_s, asyncio.get_running_loop().create_future(),
                                 self._numbered, count=count)
        self._reserves.append(pending)
        if len(self._reserves) == 1:
            pending.started = asyncio.get_running_loop().time()
        if count is None and self._turn:
            if self._untried is None:
                self._untried = []
            self._untried.append(pending)  # tried with the turn's others (_send_turn)
        else:
            attempt: asyncio.Future[Any] = self.store.reserve(self.token, number=self._numbered) \
                if count is None else self.store.reserve_many(self.token, count,
                                                              number=self._numbered)
            self.track_grants(attempt)
            attempt.add_done_callback(functools.partial(self._tried, [pending]))
        if timeout_s is not None:  # answers TIMED_OUT if its first try is still out by then
            self.ctx.registry.overdue.add(
                pending, asyncio.get_running_loop().time() + timeout_s + RESERVE_GRACE_S,
                self._first_try_overdue)
        return pending.reply

    def _first_try_overdue(self, pending: PendingReserve) -> None:
        """A reserve-with-timeout whose first try Redis has not answered by its timeout: it
        answers TIMED_OUT if it is next to answer (a later one waits for the calls before it,
        which the Redis client's own bound ends)."""
        if pending.tried or self._lost or not self._reserves or self._reserves[0] is not pending:
            return
        pending.tried = True
        self._reserves.pop(0)
        self._answer(pending, replies.TIMED_OUT)
        self._advance()

    def track_grants(self, call: asyncio.Future[T]) -> asyncio.Future[T]:
        """Record the jobs a store call grants as this connection's, whatever becomes of the
        command that asked (a disconnect must hand them back)."""
        if self._grants is None:
            self._grants = []
        self._grants.append(call)
        call.add_done_callback(self._granted)
        return call

    def _granted(self, f: asyncio.Future[Any]) -> None:
        assert self._grants is not None
        self._grants.remove(f)
        if not self._grants:
            self._grants = None
        if f.cancelled() or f.exception() is not None:
            return
        result = f.result()
        if isinstance(result, list):
            if result:
                self._hold(result)
        elif isinstance(result, Reservation):
            self._hold((result,))

    def _hold(self, jobs: Sequence[Reservation]) -> None:
        """``jobs`` (one store call's grants) are this connection's until settled."""
        if len(self.reserved) >= self._prune_at:
            # Jobs whose TTR ran out are no longer ours (expire.lua requeued them, or will).
            now = self.store.clock()
            self.reserved = {j: d for j, d in self.reserved.items() if d > now}
            # The next pruning waits until the map has doubled: a connection that really holds
            # many jobs (reserve-many, push with many credits) would otherwise copy the whole
            # map for every job it takes; this way it costs O(1) per job, amortized.
            self._prune_at = max(PRUNE_RESERVED_AT, 2 * len(self.reserved))
        reserved = self.reserved
        for job in jobs:
            reserved[job.id] = job.deadline_ms
        self.ctx.scheduler.note_due(min(job.deadline_ms for job in jobs))

    def _tried(self, pendings: list[PendingReserve],
               f: asyncio.Future[Reservation | NoJob | list[Reservation]]) -> None:
        """The first try of ``pendings`` (consecutive reserves) came back: what it granted
        goes to the pool, which answers them in order."""
        failed = f.cancelled() or f.exception() is not None
        overdue = self.ctx.registry.overdue
        for pending in pendings:
            if pending.timeout_s is not None:
                overdue.discard(pending)
            # One answered TIMED_OUT while its try was out (_first_try_overdue) stays
            # answered: what the try granted is the next reserves'.
            if not pending.tried:
                pending.tried = True
                pending.failed = failed
        if not failed and not self._lost:
            result = f.result()  # a Reservation or NoJob; reserve-many: a list of them
            granted = result if isinstance(result, list) else [result]
            self._pool += [job for job in granted if isinstance(job, Reservation)]
            if self._pool and self._wait is not None:
                self._wait.wake()  # the blocked head takes it
        self._advance()

    def _pool_ready(self) -> bool:
        """Whether a granted job waits in the pool, once those whose TTR ran out meanwhile are
        dropped: expire.lua gave them back (another connection may have them now), so they
        are this connection's no more. A job granted by a call that outlived its reserve can
        wait here that long."""
        if self._pool:
            now = self.store.clock()
            if any(job.deadline_ms <= now for job in self._pool):
                self._pool = [job for job in self._pool if job.deadline_ms > now]
        return bool(self._pool)

    def _from_pool(self, count: int | None) -> bytes:
        """The answer of a reserve (``count`` None: one job) or a reserve-many (up to
        ``count`` jobs, as one BATCH reply) from the granted jobs; the pool is not empty."""
        if count is None:
            return _reserved(self._pool.pop(0))
        jobs = self._pool[:count]
        del self._pool[:count]
        return replies.batch([_reserved(job) for job in jobs])

    def _advance(self) -> None:
        """Answer reserves in order with the jobs granted so far; the first reserve that finds
        none waits (``_wait_for_job``) and holds the rest. The job order among one
        connection's reserves is the grant order, as if they had run one by one."""
        while self._reserves and self._blocking is None and not self._lost:
            head = self._reserves[0]
            if not head.started:
                head.started = asyncio.get_running_loop().time()
            if not head.tried:
                return
            if head.failed:
                answer = replies.INTERNAL_ERROR
            elif self._pool_ready():
                answer = self._from_pool(head.count)
            else:
                task = asyncio.get_running_loop().create_task(
                    self._wait_for_job(head.started, head.timeout_s, head.count))
                self._blocking = task
                task.add_done_callback(self._waited)  # for head, still _reserves[0] then
                return
            self._reserves.pop(0)
            self._answer(head, answer)
        if self._deferred is not None:
            self._replay_deferred()
        if not self._reserves and self._held is not None and not self._lost:
            self._schedule_pump()  # commands held behind them

    def _waited(self, task: asyncio.Task[bytes]) -> None:
        self._blocking = None
        if task.cancelled():
            return  # the connection is gone
        self._answer(self._reserves.pop(0), _reply_bytes(task, self.extended))
        self._advance()

    def _passed(self, command: c.Command, reply: asyncio.Future[bytes], last_reserve: int,
                outcome: asyncio.Future[bytes]) -> None:
        """A command sent past reserves up to number ``last_reserve`` came back: its reply,
        or Deferred (one of those reserves waits), then it is sent again after them."""
        if reply.done():
            return
        if outcome.cancelled():
            reply.cancel()
        elif isinstance(outcome.exception(), Deferred):
            if self._deferred is None:
                self._deferred = []
            self._deferred.append((command, reply, last_reserve))
            self._replay_deferred()
        else:
            chain(outcome, reply)

    def _replay_deferred(self) -> None:
        """Send again, in order, the deferred commands whose reserves have all answered."""
        deferred = self._deferred
        while deferred and not self._lost and (
                not self._reserves or self._reserves[0].number > deferred[0][2]):
            command, reply, _ = deferred.pop(0)
            self.replaying = True
            try:
                outcome = self._handlers[type(command)](self, command)
            except Exception:
                log.exception("handler failed", command=type(command).__name__)
                outcome = replies.INTERNAL_ERROR
            finally:
                self.replaying = False
            if outcome is None or isinstance(outcome, bytes):
                reply.set_result(outcome or replies.INTERNAL_ERROR)
            else:
                outcome.add_done_callback(functools.partial(chain, target=reply))
        if not deferred:
            self._deferred = None

    def _answer(self, reserve: PendingReserve, answer: bytes) -> None:
        """Resolve a reserve taken off ``_reserves`` and write its reply like any other (a
        reserve's reply future has no done-callback: one object less per waiting reserve)."""
        reserve.reply.set_result(answer)
        self._reply_done(reserve.reply)
        if self.ctx.observer is not None:  # a reserve that waited is not slow: not tracked
            kind = "reserve" if reserve.timeout_s is None else "reserve-with-timeout"
            self.ctx.observer.answered(kind, answer)

    def _in_margin(self, now: int) -> bool:
        return any(d - SAFETY_MARGIN_MS <= now < d for d in self.reserved.values())

    def _next_margin_s(self, now: int) -> float | None:
        starts = [d - SAFETY_MARGIN_MS for d in self.reserved.values()
                  if d - SAFETY_MARGIN_MS > now]
        return (min(starts) - now) / 1000 if starts else None

    async def _wait_for_job(self, started: float, timeout_s: int | None,
                            count: int | None = None) -> bytes:
        """A reserve whose first try found nothing: register, try, wait with a bound, try
        again (tubeq.server.wait). ``count``: a reserve-many's."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else started + timeout_s
        wait: Wait | None = None
        consumed = False
        try:
            while True:
                if self._pool_ready():  # a later reserve's try was granted a job: it is ours
                    consumed = True
                    return self._from_pool(count)
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
                    if wait is not None and wait.counted and not self._eof:
                        # A put may have handed us a job an instant ago: then it is the answer
                        # (at most one job per wait; any more go to the pool).
                        handed = await wait.claim()
                        if handed:
                            self._pool.insert(0, handed[0])
                            self._pool.extend(handed[1:])
                            if self._pool_ready():
                                consumed = True
                                return self._from_pool(count)
                    return ending
                if wait is None:
                    wait = self._wait = Wait(self.ctx.registry, self.store, self.token,
                                             self.watched, owner=self, deadline=deadline)
                    await wait.count_in()
                else:
                    if not wait.recount:
                        await wait.sleep(remaining, self._next_margin_s(now))
                        if self._eof:
                            return replies.TIMED_OUT
                        if self._pool_ready():
                            continue
                    await wait.count_in_again()
                result = await wait.take(count)
                if isinstance(result, Reservation) or (isinstance(result, list) and result):
                    self._pool[:0] = [result] if isinstance(result, Reservation) else result
                    if self._pool_ready():
                        consumed = True
                        return self._from_pool(count)
                    # Granted, but its TTR ran out before the reply was read (this process was
                    # paused): expire.lua gave it back. Wait on, counted in again.
                    await wait.count_in()
                del result  # not kept alive through the next (long) wait
        except _Overdue:
            return replies.TIMED_OUT
        finally:
            if wait is not None:
                self._wait = None
                stopped = wait.leave(consumed=consumed, claim=not self._lost)
                if stopped is not None:
                    self.track_grants(stopped).add_done_callback(self._late_grant)

    def _late_grant(self, f: asyncio.Future[Any]) -> None:
        """Jobs granted or claimed after the reserve that asked had answered (its wait ended,
        or it was overdue): the next reserves' (they are the connection's already)."""
        if f.cancelled() or f.exception() is not None or self._lost:
            return
        result = f.result()
        jobs = [job for job in (result if isinstance(result, list) else [result])
                if isinstance(job, Reservation)]
        if not jobs:
            return
        self._pool.extend(jobs)
        if self._wait is not None:
            self._wait.wake()
        self._advance()

    async def within(self, call: asyncio.Future[T], deadline: float | None) -> T:
        """``call``'s result; with a ``deadline`` (loop time), _Overdue once it has passed by
        RESERVE_GRACE_S (Redis stalled): then what the call grants goes to the next reserves."""
        if deadline is None:
            return await asyncio.shield(call)
        # What asyncio.shield plus asyncio.timeout_at do, without the timeout's own loop timer
        # (5-6 us per await on the AMD EPYC machine): the registry's Deadlines bound it.
        ended = asyncio.get_running_loop().create_future()
        settle = functools.partial(_settle, ended)
        call.add_done_callback(settle)
        overdue = self.ctx.registry.overdue
        overdue.add(ended, deadline + RESERVE_GRACE_S, _settle)
        try:
            await ended
        finally:
            overdue.discard(ended)
        if call.done():
            return call.result()
        call.remove_done_callback(settle)
        call.add_done_callback(self._late_grant)
        raise _Overdue

    def registration_lost(self) -> None:
        """Redis lost this connection's registrations and they were just restored (watches
        first, on the same Redis connection): a wait under way counts itself in again and
        tries again, as a put may have found no waiter meanwhile."""
        for wait in (self._wait, None if self._push is None else self._push.wait):
            if wait is not None:
                wait.registration_lost()

    # -- push extension -----------------------------------------------------------------------

    def start_push(self, credits: int) -> bytes:
        self.mark_worker()  # a push consumer is a worker, as a reserving one is
        if self._push is None:
            self._push = Push(self, self._flow, self._push_frames)
        self._push.start(credits)
        return replies.pushing(credits)

    def settled(self, *job_ids: int) -> None:
        """Jobs this connection held are no longer its own: free their push credits, if any."""
        reserved = self.reserved
        for job_id in job_ids:
            reserved.pop(job_id, None)
        if self._push is not None:
            self._push.settled(job_ids)

    def settling(self, job_ids: Sequence[int]) -> None:
        """A delete-many of ``job_ids`` was just sent and nothing can defer it: their push
        credits come back now, and the take they allow is sent in the same Redis write."""
        if self._push is not None:
            self._push.settled(job_ids, take_now=True)

    def _push_frames(self, frames: bytes) -> None:
        self._replies.append(frames)
        self._schedule_flush()


# Command classes by what may overtake a reserve (exact types: a set lookup beats isinstance
# with a union on this path, which every command behind a reserve takes).
_RESERVES: frozenset[type[c.Command]] = frozenset({c.Reserve, c.ReserveWithTimeout,
                                                   c.ReserveMany})  # batches: reserve-many
_ON_HELD_JOBS: frozenset[type[c.Command]] = frozenset({c.Delete, c.Bury, c.Touch})
_ONE_JOB_RESERVES: frozenset[type[c.Command]] = frozenset({c.Reserve, c.ReserveWithTimeout})


_WATCH_DEFAULT: tuple[str, ...] = ("default",)


def _reserved(job: Reservation) -> bytes:
    return replies.reserved(job.id, job.body)


def _peer(transport: asyncio.BaseTransport) -> str | None:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return None if peer is None else str(peer)


def _settle(ended: asyncio.Future[None], *_: object) -> None:
    if not ended.done():
        ended.set_result(None)


class _Overdue(Exception):
    """A reserve-with-timeout's Redis call outlived its timeout (Connection.within)."""


def _reply_bytes(f: asyncio.Future[bytes], extended: bool) -> bytes:
    """A reply future's bytes; a failed store call is INTERNAL_ERROR, saying whether the
    command ran to a connection that has used an extension (replies.internal_error)."""
    if f.cancelled():
        return replies.internal_error(None, extended)
    exc = f.exception()
    if exc is not None:
        log.warning("store call failed", error=repr(exc))
        return replies.internal_error(ran(exc), extended)
    return f.result()
