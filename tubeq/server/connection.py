"""One client connection: the thin asyncio adapter between the parser and the store.

Owns: :class:`Connection`, the asyncio.Protocol of one client: it feeds the sans-IO parser,
dispatches each command it yields at once to a handler that returns its reply, either as bytes
or as a future of bytes (a store call in flight), and writes the replies strictly in command
order, coalesced into one write per loop tick. Pipelined commands therefore reach Redis without
waiting for each other; a read's puts, deletes, finishes and reserves' first tries go as one
call of each kind (its turn, tubeq.server.runs). Also: the connection's life (open, auth,
half-close, close and the hand-back of its jobs), and the held-job map it keeps for
DEADLINE_SOON.

The connection owns its reservations (beanstalkd semantics): only it may delete, release, bury
or touch them, and when it goes away (quit, EOF, reset) disconnect.lua puts them back at once.

Not here: the order of its reserves and of the commands behind them (which command may pass an
unanswered reserve, what is deferred and replayed, how a reserve waits and answers) is its
:class:`~tubeq.server.reserves.ReserveQueue`'s, ``self.reserves``; flow control (its bounds,
and when reading pauses) is tubeq.server.flow's; the push extension's loop and credits are
tubeq.server.push's, its frames joining the reply stream between whole replies.

What the connections of a namespace share (ServerContext) and what handlers may touch of a
connection (Session) are tubeq.server.context's; this module implements Session.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from time import perf_counter
from typing import Any, TypeVar, cast

import structlog

from tubeq.protocol import commands as c
from tubeq.protocol import replies
from tubeq.protocol.parser import Parser
from tubeq.redisio.futures import SentLater, discard
from tubeq.server import ops
from tubeq.server.context import (
    RESTORE_RETRY_S,
    Reply,
    ServerContext,
    Session,
    reply_bytes,
)
from tubeq.server.end_waits import EndWait
from tubeq.server.flow import TURN_BUDGET, FlowControl
from tubeq.server.handlers import GATE_HANDLERS, HANDLERS
from tubeq.server.idle_poll import IdlePoll
from tubeq.server.metrics import UNTIMED
from tubeq.server.push import Push
from tubeq.server.reserves import ONE_JOB_RESERVES, RESERVES, ReserveQueue
from tubeq.server.runs import CallRun, DeleteRun, FinishRun, PutRun, joins_calls
from tubeq.store.records import JobEnd, Reservation

log = structlog.get_logger(__name__)

# A closed connection's clean-up that failed (Redis went away) is tried again after
# RESTORE_RETRY_S, at most DISCONNECT_TRIES times (about a minute: a Redis away for longer lost
# nothing it holds, and a restart of this process is the remedy for what stays counted).
DISCONNECT_TRIES = 60

T = TypeVar("T")

# The handlers of a connection refused at once (over --max-connections): it gets none.
_REFUSED: dict[type[c.Command], Any] = {}

# A connection that sends this many bad tokens is closed: tokens are not to be guessed.
MAX_AUTH_FAILURES = 3


class Connection(asyncio.Protocol):
    # Slots: thousands of idle connections each save their instance dict (~700 B).
    __slots__ = (
        "_asked", "_asked_since", "_auth_failures", "_calls", "_cleaned_up", "_closed",
        "_closed_by_stop", "_deletes", "_ends", "_eof", "_finishes", "_flow", "_flush_scheduled",
        "_held_by", "_idle_poll", "_loop", "_lost", "_own_finishes",
        "_pump_scheduled", "_push", "_puts", "_quit", "_replies", "_turn", "_turn_at",
        "batch_parts", "ctx",
        "extended", "handlers", "parser", "passing", "producer", "replaying", "reserved",
        "reserves", "store", "token", "transport", "turn_stats", "used", "watched", "worker",
    )

    def __init__(self, ctx: ServerContext, *, gated: bool = False,
                 idle_poll: IdlePoll | None = None) -> None:
        """A connection in namespace ``ctx``; ``gated``: in none until ``auth`` (ctx is then the
        listener's, for its limits only: nothing is stored or counted before auth).
        ``idle_poll``: the process's, told of each input (tubeq.server.idle_poll)."""
        self.ctx = ctx
        self._idle_poll = idle_poll
        # Its loop, asked once (Python 3.11's get_running_loop() is a getpid system call).
        self._loop = asyncio.get_running_loop()
        # The handler table commands are dispatched through (ReserveQueue replays by it too).
        self.handlers: dict[type[c.Command], Callable[[Session, Any], Reply | None]] = \
            GATE_HANDLERS if gated else HANDLERS
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
        # put-with notify-ms: the waits whose END frame is still to come (None until the first)
        self._ends: set[EndWait] | None = None
        # The replies of this connection's finishes in flight while it has calls waiting, by
        # job id: the END of a call it finishes itself follows that reply.
        self._own_finishes: dict[int, asyncio.Future[bytes]] | None = None
        # With metrics (or the slow log) on: what each queued reply answers, for the observer
        # to count as the replies leave (tubeq.server.metrics). One observer per process, so
        # a connection that changes namespace (auth) keeps it.
        self._asked: list[type[c.Command] | None] | None = None
        self._asked_since: list[float] | None = None
        if ctx.observer is not None:
            self._asked, self._asked_since = ctx.observer.asked_lists()
        self._turn_at = 0.0  # with the slow log: perf_counter when the current turn began
        # Its unanswered reserves, what they grant and the commands held behind them.
        self.reserves = ReserveQueue(self)
        # While a handler runs: the number of the first unanswered reserve the command passes
        # (0: none), for the store call; and whether the command is a deferred one sent again.
        self.passing = 0
        self.replaying = False
        self.batch_parts: list[Any] | None = None  # a put-many's parts before its last
        # A turn of _pump (the commands of one read): its puts, its deletes and finishes that
        # wait for nothing and its reserves' first tries (ReserveQueue.untried) go to Redis as
        # one call of each kind when the turn ends (_send_turn), or before a command that must
        # follow them in Redis. The runs exist only while a turn has something in them.
        self._turn = False
        # The counts read of a run of stats in this turn (no other command between them): they
        # all take its answer, and it is sent when the run ends (handlers._stats).
        self.turn_stats: SentLater[Any] | None = None
        self._puts: PutRun | None = None
        self._calls: CallRun | None = None
        self._deletes: DeleteRun | None = None
        self._finishes: FinishRun | None = None
        self._push: Push | None = None  # from the first ``push`` on
        # A blocking command's reply (wait) and how to end it early: nothing after it runs
        # until it is settled (hold).
        self._held_by: tuple[asyncio.Future[bytes], Callable[[], None]] | None = None
        self._flow = FlowControl()
        self._pump_scheduled = False
        self._quit = False
        self._eof = False
        self._lost = False
        self._closed: asyncio.Future[None] | None = None  # made when someone waits
        self._cleaned_up = False
        # Closed by its stopping process (Server.stop), not by the client: the jobs it held go
        # back with no try counted (disconnect.lua's shutdown)
        self._closed_by_stop = False

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = self._flow.transport = cast(asyncio.Transport, transport)
        if not self.ctx.capacity.take():
            # Over --max-connections: one clear line, then closed; nothing registered.
            self.handlers = _REFUSED
            self.transport.write(replies.TOO_MANY_CONNECTIONS)
            self.transport.close()
            unlogged = self.ctx.capacity.refusal_to_log()
            if unlogged is not None:
                log.warning("connection refused: --max-connections reached",
                            peer=_peer(transport), refused_unlogged_before=unlogged)
            return
        self.ctx.connections[self.token] = self  # so shutdown finds it, gated or not
        log.info("connection opened", conn=self.token, peer=_peer(transport))
        if self.ctx.observer is not None:
            self.ctx.observer.connections_opened += 1
        if self.handlers is HANDLERS:
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
            self._puts = PutRun(self.store, self._loop)
        return self._puts

    @property
    def deletes(self) -> DeleteRun | None:
        """The turn's deletes, as :attr:`puts` (only those that wait for nothing ask: _pump)."""
        if not self._may_join(self._deletes):
            return None
        if self._deletes is None:
            self._deletes = DeleteRun(self.store, self._loop, self.token)
        return self._deletes

    @property
    def calls(self) -> CallRun | None:
        """The turn's plain calls (put-with notify-ms: runs.joins_calls), as :attr:`puts`."""
        if not self._may_join(self._calls):
            return None
        if self._calls is None:
            ctx = self.ctx
            self._calls = CallRun(self.store, self._loop, ctx.result_ttl_ms, ctx.direct_room,
                                  ctx.release_room)
        return self._calls

    @property
    def finishes(self) -> FinishRun | None:
        """The turn's finishes, as :attr:`deletes`."""
        if not self._may_join(self._finishes):
            return None
        if self._finishes is None:
            self._finishes = FinishRun(self.store, self._loop, self.token,
                                       self.ctx.result_ttl_ms)
        return self._finishes

    def _may_join(self, run: PutRun | CallRun | DeleteRun | FinishRun | None) -> bool:
        """Whether a command may join ``run``, the turn's run of its kind: inside a turn, if
        the run holds commands already or more input was read after this one (one that would
        go alone takes the single-job script's path, at no cost of its own)."""
        return self._turn and (bool(run) or bool(self.parser.buffered))

    @property
    def authenticated(self) -> bool:
        """In a namespace (always, without an access file)."""
        return self.handlers is HANDLERS

    def enter(self, ctx: ServerContext) -> None:
        """Leave the gate for namespace ``ctx`` (a good token or client certificate)."""
        self.ctx.connections.pop(self.token, None)
        self.ctx = ctx
        self.store = ctx.store
        self.token = ctx.next_token()
        self.handlers = HANDLERS
        ctx.connections[self.token] = self
        self._register()

    def auth_failed(self) -> None:
        """One more bad token; the last one allowed closes the connection after its reply."""
        self._auth_failures += 1
        if self._auth_failures >= MAX_AUTH_FAILURES:
            log.warning("closing a connection after repeated bad tokens")
            self.quit()

    def data_received(self, data: bytes) -> None:
        if self._idle_poll is not None:
            self._idle_poll.input()
        self.parser.feed(data)
        self._pump()

    def eof_received(self) -> bool:
        # Half-close: answer what was sent, a blocked reserve gets TIMED_OUT, then close.
        self._eof = True
        self.reserves.eof_received()
        if self._held_by is not None:
            self._held_by[1]()  # a wait answers TIMED_OUT, as a blocked reserve does
        self._give_up_ends()  # their frames say timed-out, then the connection closes
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
        self.schedule_pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        reserves = self.reserves
        reserves.connection_lost()
        if self._held_by is not None:
            self._held_by[1]()
        self._give_up_ends()
        self._flow.transport = None  # reading is left as it is
        if self.handlers is not _REFUSED:
            self.ctx.capacity.open -= 1
            log.info("connection closed", conn=self.token,
                     error=None if exc is None else repr(exc))
            if self.ctx.observer is not None:
                self.ctx.observer.connections_closed += 1
        self.ctx.connections.pop(self.token, None)
        if self.handlers is not HANDLERS:  # never entered a namespace: nothing to clean up
            self._cleaned_up = True
            if self._closed is not None and not self._closed.done():
                self._closed.set_result(None)
            return
        push_task = None if self._push is None else self._push.task
        running = [t for t in (reserves.blocking, push_task) if t is not None and not t.done()]
        for task in running:
            task.cancel()
        # Wait for the tasks' `finally` (it takes the connection out of the waiters) and for
        # reserve calls still in flight, whose grants must be in `reserved` before
        # disconnect.lua hands every job back.
        pending = [*running, *(reserves.grants or ())]
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
        done = self.store.disconnect(self.token, self.producer, self.worker, list(self.reserved),
                                     shutdown=self._closed_by_stop)
        done.add_done_callback(self._disconnected)
        if self.ctx.tracer is not None:  # (a stopping server's close is no try: 'shutdown')
            self.ctx.tracer.closed(self.token, "shutdown" if self.ctx.stopping else "disconnect")
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
        done = self.store.disconnect(self.token, self.producer, self.worker, list(self.reserved),
                                     shutdown=self._closed_by_stop)
        done.add_done_callback(functools.partial(self._disconnected, tries=tries))

    async def wait_closed(self) -> None:
        """Return once the connection is gone and its jobs were handed back."""
        if self._cleaned_up:
            return
        if self._closed is None:
            self._closed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._closed)

    def close(self, *, stopping: bool = False) -> None:
        if self.transport is not None and not self._lost:
            self._closed_by_stop = stopping
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
        """Stop reading commands; close once the replies before the quit are written (calls
        awaiting their end hear timed-out at once, as at a half-close)."""
        self._quit = True
        self._give_up_ends()

    # -- command flow -------------------------------------------------------------------------

    def _pump(self) -> None:
        """Dispatch parsed commands until the input runs dry or a bound is reached; read on
        only when the input ran dry (or a reserve holds the rest and little has arrived)."""
        self._pump_scheduled = False
        flow = self._flow
        budget = TURN_BUDGET
        limit = self.ctx.max_in_flight
        read_on = False
        reserves = self.reserves
        waiting = reserves.pending  # the same list for the connection's life
        self._turn = True
        if self._asked_since is not None:
            self._turn_at = perf_counter()  # the slow log times commands from their turn
        while not self._quit and not self._lost:
            # Flow control's bounds (tubeq.server.flow), checked here: once per command.
            ends = self._ends  # put-with notify-ms's waits count as unanswered commands
            if flow.write_paused or len(self._replies) + (len(ends) if ends else 0) >= limit:
                flow.throttled = True  # _flush or resume_writing pumps again
                break
            if not budget:
                self.schedule_pump()  # the other connections' turn first
                break
            if self._held_by is not None:  # a blocking command before: _release pumps again
                read_on = flow.reads_behind_reserve(self.parser.buffered)
                break
            if reserves.held is not None:
                if waiting:
                    read_on = flow.reads_behind_reserve(self.parser.buffered)
                    break
                command, reserves.held = reserves.held, None
            else:
                parsed = self.parser.next_command()
                if parsed is None:
                    read_on = True
                    break
                command = parsed
                if waiting and not reserves.may_pass(command):
                    reserves.held = command
                    read_on = flow.reads_behind_reserve(self.parser.buffered)
                    break
            passing = reserves.passing(command) if waiting else 0
            kind = type(command)
            if kind is not c.Stats and self.turn_stats is not None and self._send_stats():
                reserves.held = command  # after the stats' answer (_send_stats)
                break
            # What this command may depend on goes to Redis first: the other kinds' runs (a
            # put or delete keeps its place among the others), or everything.
            if kind is c.Put:
                self._send_runs_but(self._puts)
            elif kind is c.Delete and not passing:
                self._send_runs_but(self._deletes)
            elif kind is c.Finish and not passing:
                self._send_runs_but(self._finishes)
            elif kind is c.PutWith and joins_calls(cast(c.PutWith, command)):
                self._send_runs_but(self._calls)
            elif kind not in ONE_JOB_RESERVES:
                self._send_turn()
            self._dispatch(command, passing)
            budget -= 1
        if self.turn_stats is not None:
            self._send_stats()
        self._send_turn()
        if self._push is not None:
            self._push.take_early()  # for the credits a delete-many freed, as the turn left them
        self._turn = False
        self._puts = self._calls = self._deletes = self._finishes = None
        flow.set_reading(read_on)
        self._maybe_close()

    def _send_stats(self) -> bool:
        """Send the turn's run of stats; whether the connection is now held until they are
        answered: their read starts later (whole-namespace reads are spaced, one at a time:
        tubeq.server.ops), and the commands behind them must not run before it, as a stats
        never shows what its connection did after it (beanstalkd answers them in order)."""
        read, self.turn_stats = self.turn_stats, None
        assert read is not None
        read.send()
        if read.answer.done() or not ops.namespace_counts_start_later(self.ctx):
            return False
        self.hold(read.answer, _nothing_to_give_up)
        return True

    def _send_runs_but(self, keep: PutRun | CallRun | DeleteRun | FinishRun | None) -> None:
        """Send the turn's open run of another kind than ``keep``'s: a put, call, delete or
        finish keeps its place among the others (one run at a time is open)."""
        for run in (self._puts, self._calls, self._deletes, self._finishes):
            if run and run is not keep:
                run.send()

    def _send_turn(self) -> None:
        """Send the turn's run of puts, deletes or finishes (one at a time is open), then its
        reserves' first tries, each as one store call. Sending those deletes or finishes
        before reserves that came first changes nothing: they passed the reserves with
        ``passing`` 0 (whatever the reserves do, they cannot see the jobs deleted); a put never
        passes a reserve. The reserves still answer in their own order."""
        self._send_runs_but(None)
        reserves = self.reserves
        if reserves.untried:
            reserves.send_untried()

    def hold(self, reply: asyncio.Future[bytes], give_up: Callable[[], None]) -> None:
        self._held_by = (reply, give_up)
        reply.add_done_callback(self._release)

    def _release(self, reply: asyncio.Future[bytes]) -> None:
        self._held_by = None
        if not self._lost:
            self.schedule_pump()

    def schedule_pump(self) -> None:
        """Dispatch parsed commands again soon (call_soon), once however often asked."""
        self._flow.throttled = False
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    def _dispatch(self, command: c.Command, passing: int = 0) -> None:
        """Run ``command``'s handler and queue its reply; ``passing``: the number of the first
        unanswered reserve it was let past (see :meth:`ReserveQueue.passing`)."""
        handlers = self.handlers
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
        if passing and not isinstance(reply, bytes):  # Redis may defer it
            reply = self.reserves.sent_past(command, reply)
        self._replies.append(reply)
        kind = type(command)
        asked = self._asked
        if asked is not None:  # metrics: counted as it leaves (_flush)
            asked.append(kind)
        since = self._asked_since
        if isinstance(reply, bytes):
            if since is not None:
                since.append(UNTIMED)
            self._schedule_flush()
        elif kind not in RESERVES:  # a reserve's reply: ReserveQueue writes it
            reply.add_done_callback(self.reply_done)
            if self._ends and kind is c.Finish:  # it may end a call of this connection
                self._note_own_finish(cast(c.Finish, command).id, reply)
            if since is not None:  # timed unless its reply waits for a reserve's (passing
                # 0 can let a delete past reserves that it cannot affect: it still waits), or
                # it waits by design itself (wait, put-with wait-ms: it holds the connection)
                since.append(UNTIMED if passing or self.reserves.pending
                             or self._held_by is not None else self._turn_at)
        elif since is not None:
            since.append(UNTIMED)

    def reply_done(self, reply: asyncio.Future[bytes]) -> None:
        """Write ``reply`` (just resolved) once the replies before it are written."""
        # A lone reply (one command in flight: a round-trip-bound client) is written at once;
        # several wait for the end of the tick and leave in one write.
        if len(self._replies) == 1 and self._replies[0] is reply and not self._flush_scheduled:
            self._flush()
        else:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out: list[bytes] = []
        for head in self._replies:
            if isinstance(head, bytes):
                out.append(head)
            elif head.done():
                out.append(reply_bytes(head, self.extended))
            else:
                break
        del self._replies[:len(out)]
        transport = self.transport
        wrote = False
        if out and transport is not None and not self._lost:
            transport.write(b"".join(out))
            wrote = True
        # Counted once written (or dropped with the connection): a fault in the metrics
        # code can cost a count, never a reply.
        if self._asked is not None and out:
            observer = self.ctx.observer
            assert observer is not None
            observer.written(self.token, self._asked, self._asked_since, out)
        if wrote and self._flow.aborted_over_cap(self.parser.buffered,
                                                 self.ctx.max_client_buffer, self.token):
            return
        flow = self._flow
        if flow.throttled and not flow.write_paused:  # replies left: the pump's bound lifts
            self.schedule_pump()
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self._lost or self.transport is None or self._replies or self.reserves.pending \
                or self._ends:
            return
        # Half-close, as beanstalkd: every command received before the EOF runs and answers
        # first, also those a reserve held or the pump left at a bound (it runs again); only
        # then is what is left in the parser an incomplete command that cannot finish.
        answered_to_eof = self._eof and self.reserves.held is None and not self._pump_scheduled \
            and not self._flow.throttled
        if self._quit or answered_to_eof:
            self.transport.close()

    # -- put-with notify-ms -------------------------------------------------------------------

    def notify_end(self, wait: EndWait, frame: asyncio.Future[bytes | None]) -> None:
        """Write the END frame of ``wait``'s job: at once when an end reaches the wait
        (EndWait.told: in the loop turn the finish's reply or the message came in), else from
        ``frame``, the wait's own answer (timed out, not found, an end it read)."""
        if self._ends is None:
            self._ends = set()
        self._ends.add(wait)
        wait.told = functools.partial(self._end_told, wait)
        frame.add_done_callback(functools.partial(self._end_heard, wait))
        if self._eof or self._quit or self._lost:  # a call run after the half-close or quit
            wait.give_up()

    def _note_own_finish(self, job_id: int, reply: asyncio.Future[bytes]) -> None:
        own = self._own_finishes
        if own is None:
            own = self._own_finishes = {}
        own[job_id] = reply
        reply.add_done_callback(functools.partial(self._own_finish_done, job_id))

    def _own_finish_done(self, job_id: int, reply: asyncio.Future[bytes]) -> None:
        own = self._own_finishes
        if own is not None and own.get(job_id) is reply:
            del own[job_id]

    def _end_told(self, wait: EndWait, end: JobEnd) -> None:
        ends = self._ends
        if ends is None or wait not in ends:
            return
        ends.discard(wait)
        wait.told = None
        if self._lost:
            return
        self._end_frame(replies.end_frame(wait.job_id, end.how, end.data), wait.job_id)
        if self._flow.throttled:
            self.schedule_pump()

    def _end_heard(self, wait: EndWait, frame: asyncio.Future[bytes | None]) -> None:
        ends = self._ends
        if ends is None or wait not in ends:
            return  # told at once (_end_told)
        ends.discard(wait)
        wait.told = None
        if self._lost:
            return
        if frame.cancelled() or frame.exception() is not None:
            # The put failed (its reply says so) or the wait did: no frame can say more
            # than timed-out, which the client's own timer says too.
            if not frame.cancelled() and wait.job_id:
                log.warning("notify-ms: waiting for the end failed", job=wait.job_id,
                            error=repr(frame.exception()))
            data = None
            if wait.job_id:
                data = replies.end_frame(wait.job_id, replies.END_TIMED_OUT, b"")
        else:
            data = frame.result()
        if data is not None:
            self._end_frame(data, wait.job_id)
        else:
            self._maybe_close()  # (a half-closed connection waited for this one)
        if self._flow.throttled:
            self.schedule_pump()

    def _end_frame(self, frame: bytes, job_id: int) -> None:
        """An END frame goes before the first reply still unanswered (a wait or a reserve of
        the connection must not hold the ends of its other calls back), after every reply
        already answered: the put that named the job is one of those (the end follows it).
        One exception: the END of job ``job_id`` that this connection's own finish ended
        follows that finish's reply (FINISHED, then the END it caused), which is made in the
        next loop turns."""
        replies_ = self._replies
        own = self._own_finishes
        finish = own.get(job_id) if own else None
        at = -1
        if finish is not None and not finish.done():
            with contextlib.suppress(ValueError):  # (queued until it is made and written)
                at = replies_.index(finish) + 1
        if at < 0:
            at = len(replies_)
            for i, head in enumerate(replies_):
                if not isinstance(head, bytes) and not head.done():
                    at = i
                    break
        replies_.insert(at, frame)
        if self._asked is not None:  # no command's reply: not counted, not timed
            self._asked.insert(at, None)
        if self._asked_since is not None:
            self._asked_since.insert(at, UNTIMED)
        self._schedule_flush()

    def _give_up_ends(self) -> None:
        if self._ends:
            for wait in self._ends:
                wait.give_up()

    # -- reserve (tubeq.server.reserves) ------------------------------------------------------

    def start_reserve(self, timeout_s: int | None, count: int | None = None) -> Reply:
        """Queue a reserve (``count``: a reserve-many's) behind this connection's others; its
        first try goes with the turn's (ReserveQueue.start)."""
        return self.reserves.start(timeout_s, count, self._turn)

    def track_grants(self, call: asyncio.Future[T]) -> asyncio.Future[T]:
        """``call``, the jobs it grants recorded as this connection's (ReserveQueue's)."""
        return self.reserves.track_grants(call)

    def within(self, call: asyncio.Future[T], deadline: float | None) -> Awaitable[T]:
        """``call``'s result, bounded by ``deadline`` as a reserve's (ReserveQueue's)."""
        return self.reserves.within(call, deadline)

    def registration_lost(self) -> None:
        """Redis lost this connection's registrations and they were just restored (watches
        first, on the same Redis connection): a wait under way counts itself in again and
        tries again, as a put may have found no waiter meanwhile."""
        for wait in (self.reserves.wait, None if self._push is None else self._push.wait):
            if wait is not None:
                wait.registration_lost()

    def watches_changed(self) -> None:
        if self._push is not None and self._push.wait is not None:
            self.ctx.registry.rewatch(self._push.wait, self.watched)

    # -- push extension -----------------------------------------------------------------------

    def start_push(self, credits: int, *, cancels: bool = False, quiet: bool = False) -> bytes:
        self.mark_worker()  # a push consumer is a worker, as a reserving one is
        if self._push is None:
            self._push = Push(self, self._flow, self._push_frames)
        self._push.cancels = cancels
        self._push.tell_quiet = quiet
        self._push.start(credits)
        return replies.pushing(credits)

    def quiet(self) -> bool:
        push = self._push
        if push is None or self._lost:
            return False
        push.quiet()
        return True

    def granted_directly(self, job: Reservation) -> bool:
        """A put of this process handed ``job`` straight to this connection's push loop
        (put.lua's direct hand-over): held and sent as its take would; False when no push
        loop takes it (none, stopped, or the connection is going)."""
        push = self._push
        if push is None or self._lost or not push.takes_directly():
            return False
        self.reserves.hold((job,))
        push.send_direct(job)
        return True

    def push_room(self) -> int:
        """How many jobs this connection's push loop may be handed directly now: its free
        credits not promised to a call in flight, while it takes jobs (0: no loop, or it
        takes none now)."""
        push = self._push
        if push is None or self._lost or not push.takes_directly():
            return 0
        return push.room()

    def promise_room(self, wanted: int) -> int:
        """Up to ``wanted`` of :meth:`push_room`, promised to a call from now on until
        :meth:`release_room`."""
        room = min(self.push_room(), wanted)
        if room:
            push = self._push
            assert push is not None
            push.promised += room
        return room

    def release_room(self, room: int) -> None:
        """The call that was promised ``room`` credits is back (the jobs it handed over are
        held by now)."""
        if self._push is not None:
            self._push.release(room)

    def job_cancelled(self, job_id: int) -> None:
        """cancel.lua marked job ``job_id``, which this connection holds: a push connection
        that asked for it (``push ... cancels=1``) is told at once, between whole replies."""
        if self._push is not None and self._push.cancels and job_id in self.reserved:
            self._push_frames(replies.cancelled_notice(job_id))

    def settled(self, *job_ids: int, how: str = "") -> None:
        """Jobs this connection held are no longer its own: free their push credits, if any,
        and end their reservation spans (``how`` they ended)."""
        reserved = self.reserved
        for job_id in job_ids:
            reserved.pop(job_id, None)
        if self.ctx.tracer is not None:
            self.ctx.tracer.ended(self.token, job_ids, how or "settled")
        if self._push is not None:
            self._push.settled(job_ids)

    def settling(self, job_ids: Sequence[int]) -> None:
        """A delete-many of ``job_ids`` was just sent and nothing can defer it: their push
        credits come back now, and the take they allow is sent at the end of the turn, in the
        same Redis write (at once for one sent again outside a turn: a deferred one)."""
        push = self._push
        if push is not None:
            push.settled(job_ids, take_now=True)
            if not self._turn:
                push.take_early()

    def _push_frames(self, frames: bytes) -> None:
        self._replies.append(frames)
        if self._asked is not None:  # no command's reply: not counted, not timed
            self._asked.append(None)
        if self._asked_since is not None:
            self._asked_since.append(UNTIMED)
        self._schedule_flush()


_WATCH_DEFAULT: tuple[str, ...] = ("default",)


def _nothing_to_give_up() -> None:
    """What a connection held by its stats does when the client goes: nothing (the read
    answers whatever the client does; the connection closes once it has)."""


def _peer(transport: asyncio.BaseTransport) -> str | None:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return None if peer is None else str(peer)
