"""What the connections of one namespace share, and what handlers may touch of a connection.

Owns: :class:`ServerContext` (a namespace's store, waiters, scheduler, counters and limits),
:class:`Capacity` (``--max-connections``), :class:`Gate` (which namespace a token or client
certificate enters), the two per-connection limits' defaults, the :data:`Reply` a handler
returns (:func:`reply_bytes`: a finished one's bytes), and :class:`Session`, the members of a
connection the handlers (tubeq.server.handlers), its push loop (tubeq.server.push), its reserve
queue (tubeq.server.reserves) and the process (tubeq.server.process) use.

Rules: imports nothing of tubeq.server.connection, .reserves or .handlers. The handlers are
typed against :class:`Session`, not the Connection class, so the connection imports the
handlers and nothing imports back (no ring, not even of type imports); a fake session is
enough to call a handler.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import structlog

from tubeq.protocol import replies
from tubeq.redisio.client import ran
from tubeq.redisio.futures import OneReadAtATime, SentLater, discard
from tubeq.server.access import AccessConfig
from tubeq.server.end_waits import EndWait, EndWaits
from tubeq.server.metrics import Metrics
from tubeq.server.reserve_wait import Wait
from tubeq.server.runs import CallRun, DeleteRun, FinishRun, PutRun
from tubeq.server.scheduler import Scheduler
from tubeq.server.stats import CommandCounters, ServerIdentity
from tubeq.server.tracing import JobTracer
from tubeq.server.using import UseLedger
from tubeq.server.waiters import WaiterRegistry
from tubeq.store.base import JobStore
from tubeq.store.records import Reservation

log = structlog.get_logger(__name__)

T = TypeVar("T")

# What a handler answers: the reply's bytes, or a future of them (a store call in flight).
Reply = bytes | asyncio.Future[bytes]


def reply_bytes(f: asyncio.Future[bytes], extended: bool) -> bytes:
    """A reply future's bytes; a failed store call is INTERNAL_ERROR, saying whether the
    command ran to a connection that has used an extension (replies.internal_error)."""
    if f.cancelled():
        return replies.internal_error(None, extended)
    exc = f.exception()
    if exc is not None:
        log.warning("store call failed", error=repr(exc))
        return replies.internal_error(ran(exc), extended)
    return f.result()


# A restore of this process's registrations that failed (Redis went away) is tried again
# after this pause.
RESTORE_RETRY_S = 1.0

# Commands of one connection parsed and not yet answered (replies not yet written), past which
# the connection stops reading. beanstalkd keeps one; 128 is twice the deepest pipeline any bench
# or bundled-client load keeps (64), so pipelining clients keep their throughput, and it bounds
# what one connection can queue in front of everyone else's commands on the shared Redis link.
DEFAULT_MAX_IN_FLIGHT = 128
# The hard cap on what one connection may hold in the server: unsent reply bytes plus received,
# unparsed bytes. With the bounds above a client that does not read holds at most about
# max_in_flight replies plus the transport's high-water mark (64 KiB): 128 peeks of 64 KiB jobs
# are 8 MiB. Redis's own limit for pub/sub clients is 32 MiB; so is this one, by default.
DEFAULT_MAX_CLIENT_BUFFER = 32 * 1024 * 1024
# Tubes one connection may watch (an HTTP long poll may name). A reserve that finds nothing
# ready in its tubes looks at each of them once in its Redis call (lua/includes/picking.lua):
# measured, 20,000 watched tubes held Redis for 110 ms per reserve, so one connection pipelining
# reserves could stall every other client past --redis-timeout. At 1,024 (1,023 watched, 20,000
# other tubes ready) it held Redis for 3.4 ms (9 ms at 999 on a busy host), and --max-in-flight
# of them for 0.4-1.2 s: others wait, but under the 2 s timeout. 1,024 and not 1,000: a client
# watches its tubes before it ignores "default", so 1,000 tubes need 1,001 for a moment (the
# bench's 1000-tube row does just that).
DEFAULT_MAX_WATCH = 1024
# How long a job's end (its result) is kept for waits that come after it (--result-ttl).
DEFAULT_RESULT_TTL_MS = 3_600_000


# A connection refused at a cap is logged at most this often: any client can open them by the
# thousand, and the log would carry one line each.
REFUSALS_LOGGED_EVERY_S = 1.0


@dataclass(eq=False)
class Capacity:
    """Connections open at once against a cap: the process's protocol connections across its
    namespaces (``--max-connections``), or the HTTP listener's (``--http-max-connections``);
    and how often its refusals are logged."""

    limit: int = 0  # 0: no limit
    open: int = 0
    clock: Callable[[], float] = time.monotonic
    _log_again_at: float = field(default=float("-inf"), repr=False)
    _unlogged: int = field(default=0, repr=False)  # refusals since the last one logged

    def take(self) -> bool:
        """Count one more connection, or False when the process is full."""
        if self.limit and self.open >= self.limit:
            return False
        self.open += 1
        return True

    def refusal_to_log(self) -> int | None:
        """After a refusal: None when it goes unlogged (one was logged less than
        REFUSALS_LOGGED_EVERY_S ago: it is counted instead), else how many went unlogged
        before it, which its log line says."""
        now = self.clock()
        if now < self._log_again_at:
            self._unlogged += 1
            return None
        unlogged, self._unlogged = self._unlogged, 0
        self._log_again_at = now + REFUSALS_LOGGED_EVERY_S
        return unlogged


@dataclass
class ServerContext:
    """What every connection of one tubeq process shares."""

    store: JobStore
    registry: WaiterRegistry
    scheduler: Scheduler
    counters: CommandCounters
    using: UseLedger
    identity: ServerIdentity
    max_job_size: int
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_client_buffer: int = DEFAULT_MAX_CLIENT_BUFFER
    max_watch: int = DEFAULT_MAX_WATCH  # 0: no limit
    result_ttl_ms: int = DEFAULT_RESULT_TTL_MS  # --result-ttl
    # --max-result-size; without it, any result the parser takes (-z bounds every body)
    max_result_size: int = 1 << 30
    # Connections waiting for jobs to end (wait), woken by the ended channel.
    end_waits: EndWaits = field(default_factory=EndWaits)
    draining: bool = False
    # The process is stopping (Server.stop): push loops take no more jobs, and the push
    # connections that asked are told QUIET (tubeq.server.push).
    stopping: bool = False
    # The namespace held --max-jobs jobs or more at its last count (Server._watch_job_count):
    # puts answer OUT_OF_MEMORY until a count finds room.
    full: bool = False
    connections: dict[str, Session] = field(default_factory=dict)  # by token
    # Connections whose connect.lua was sent and whose disconnect.lua was not yet: what
    # restore_registrations puts back in Redis.
    registered: dict[str, Session] = field(default_factory=dict)
    # The HTTP API's reservation tokens and the tubes each watches (tubeq.http.reservations),
    # restored with the connections.
    reservation_watches: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Their long polls' waits while counted or about to be: a reap counts them out (reap.lua
    # finds them in {p}:waiting), so after the restore each counts itself in again.
    reservation_waits: dict[str, Wait] = field(default_factory=dict)
    # With an access file: the gate between the listener and the namespaces (tubeq.server.access).
    gate: Gate | None = None
    capacity: Capacity = field(default_factory=Capacity)  # shared by the process's namespaces
    # Outcomes and slow commands (tubeq.server.metrics); None when neither is looked at.
    observer: Metrics | None = None
    # Spans of traced jobs (tubeq.server.tracing); None unless the process exports traces.
    tracer: JobTracer | None = None
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    extra_keys_always: bool = False  # --extra-keys always: every connection is extended
    # Whole-namespace reads, one call out at a time per namespace, shared by the callers that
    # came while it was out (tubeq.server.ops.namespace_counts and tube_overview).
    shared_reads: dict[object, OneReadAtATime[Any]] = field(default_factory=dict)
    # The last stats read and the reply rendered from it (tubeq.server.handlers).
    last_stats_reply: tuple[object, bytes] | None = None
    _restore_scheduled: bool = False

    def next_token(self) -> str:
        return f"{self.store.instance_id}:{next(self._seq)}"

    def quiet_consumers(self, scope: str, target: str = "") -> int:
        """``quiet``: the push connections of this process in ``scope`` ("all"; "tube": those
        watching tube ``target``; "conn": the one whose token is ``target``) stop taking
        jobs, and those that asked are told. How many push connections it reached."""
        return sum(conn.quiet() for conn in list(self.connections.values())
                   if scope == "all" or (scope == "conn" and conn.token == target)
                   or (scope == "tube" and target in conn.watched))

    def direct_room(self, tube: str, wanted: int) -> list[tuple[str, int]]:
        """The push loops of this process that wait on ``tube`` alone, each with how many
        jobs it may be handed of a run of ``wanted``: its free credits, at most ``wanted``,
        promised from now on until :meth:`release_room` (two runs in flight together do not
        count the same credits). What a run of calls may hand each directly
        (tubeq.server.runs.CallRun, put_many.lua's 'w')."""
        room = []
        for waiter in self.registry.alone_on(tube):
            conn = self.connections.get(waiter.token)
            free = conn.promise_room(wanted) if conn is not None else 0
            if free > 0:
                room.append((waiter.token, free))
        return room

    def release_room(self, room: list[tuple[str, int]]) -> None:
        """The run that :meth:`direct_room` promised ``room`` is back."""
        for token, free in room:
            conn = self.connections.get(token)
            if conn is not None:
                conn.release_room(free)

    def deliver_direct(self, token: str, job: Reservation, pri: int) -> None:
        """The store's ``direct_grants``: a put of this process handed ``job`` (priority
        ``pri``) straight to connection ``token``'s push loop (put.lua). It goes there; when
        that loop takes jobs no more (stopped, the connection going), it is given back to
        ready at once, as a release would, not left reserved until its TTR."""
        conn = self.connections.get(token)
        if conn is None or not conn.granted_directly(job):
            self.store.release(token, job.id, pri, 0).add_done_callback(discard)

    def restore_registrations(self) -> None:
        """This process was found unregistered in Redis (reaped after a pause, or Redis lost
        its data: tubeq.server.scheduler): put back what its live connections need, once per loop
        turn however many shards said so. Every step is idempotent."""
        if not self._restore_scheduled:
            self._restore_scheduled = True
            asyncio.get_running_loop().call_soon(self._restore)

    def _restore(self) -> None:
        self._restore_scheduled = False
        conns = list(self.registered.values())
        gauges = (len(conns), sum(conn.producer for conn in conns),
                  sum(conn.worker for conn in conns))
        tokens = [(conn.token, True, conn.watched) for conn in conns]
        tokens += [(token, False, tubes) for token, tubes in self.reservation_watches.items()]
        restored = self.store.restore(tokens, gauges)
        restored.add_done_callback(functools.partial(self._restored, len(conns)))
        resent = self.using.resend()
        if resent is not None:
            resent.add_done_callback(discard)
        for conn in conns:  # after the watches, on the same Redis connection
            conn.registration_lost()
        for wait in list(self.reservation_waits.values()):
            wait.registration_lost()

    def _restored(self, connections: int, f: asyncio.Future[int]) -> None:
        if f.cancelled() or f.exception() is not None:
            log.warning("restoring registrations failed; trying again",
                        error=None if f.cancelled() else repr(f.exception()))
            asyncio.get_running_loop().call_later(RESTORE_RETRY_S, self.restore_registrations)
        else:
            log.warning("registrations restored", connections=connections, watches=f.result())


@dataclass(eq=False)
class Gate:
    """Which namespace (its context) a token or a client certificate enters."""

    config: AccessConfig
    namespaces: dict[str, ServerContext]

    def by_token(self, token: str) -> ServerContext | None:
        name = self.config.namespace_of_token(token)
        return None if name is None else self.namespaces[name]

    def by_certificate(self, peercert: Any) -> ServerContext | None:
        """The namespace of a verified client certificate's subject common name, if any."""
        if not peercert:
            return None
        for rdn in peercert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    name = self.config.namespace_of_certificate(value)
                    if name is not None:
                        return self.namespaces[name]
        return None


class Session(Protocol):
    """What handlers, the push loop and the process may touch of one client connection
    (tubeq.server.connection.Connection is the one implementation)."""

    ctx: ServerContext  # the namespace it is in (it changes once, on ``auth``)
    store: JobStore  # ctx.store
    token: str  # its reservation token in Redis
    used: str  # the tube ``use`` chose
    watched: tuple[str, ...]  # the watch list, in watch order
    reserved: dict[int, int]  # job id -> TTR deadline (ms)
    extended: bool  # asked for the extended keys (or --extra-keys always)
    producer: bool  # has put (the stats gauge)
    worker: bool  # has reserved (the stats gauge)
    passing: int  # the reserves the command being handled passed (0: none)
    # The counts read of the run of stats being dispatched (sent when the run ends), or None.
    turn_stats: SentLater[Any] | None
    replaying: bool  # the command is a deferred one, replayed
    # The parts of a put-many whose last part is still to come (handlers._put_many), or None.
    batch_parts: list[Any] | None

    @property
    def authenticated(self) -> bool: ...

    # The turn's runs a put, a call, a delete or a finish joins (tubeq.server.runs), or None:
    # go alone.
    @property
    def puts(self) -> PutRun | None: ...

    @property
    def deletes(self) -> DeleteRun | None: ...

    @property
    def calls(self) -> CallRun | None: ...

    @property
    def finishes(self) -> FinishRun | None: ...

    def enter(self, ctx: ServerContext) -> None: ...

    def auth_failed(self) -> None: ...

    def mark_producer(self) -> None: ...

    def mark_worker(self) -> None: ...

    def quit(self) -> None: ...

    def start_reserve(self, timeout_s: int | None, count: int | None = None) -> Reply: ...

    def track_grants(self, call: asyncio.Future[T]) -> asyncio.Future[T]: ...

    def start_push(self, credits: int, *, cancels: bool = False, quiet: bool = False,
                   ) -> bytes: ...

    def job_cancelled(self, job_id: int) -> None: ...

    def quiet(self) -> bool:
        """Stop pushing jobs to this connection (as ``push 0``); tell it ``QUIET`` if it asked
        (``push ... quiet=1``). False (nothing done) for a connection that does not push."""
        ...

    def granted_directly(self, job: Reservation) -> bool:
        """A put of this process handed ``job`` straight to this connection's push loop
        (put.lua's direct hand-over): hold it and send it; False when no push loop takes it
        (stopped, or the connection is going), and the caller gives it back."""
        ...

    def push_room(self) -> int:
        """How many jobs this connection's push loop may be handed directly now (its free
        credits not promised; 0 without a loop taking jobs)."""
        ...

    def promise_room(self, wanted: int) -> int:
        """Up to ``wanted`` of push_room, promised to a call until release_room."""
        ...

    def release_room(self, room: int) -> None: ...

    def hold(self, reply: asyncio.Future[bytes], give_up: Callable[[], None]) -> None:
        """Run no command after this one until ``reply`` is settled (a blocking command:
        ``wait``); ``give_up`` ends it early when the client half-closes or goes."""
        ...

    def notify_end(self, wait: EndWait, frame: asyncio.Future[bytes | None]) -> None:
        """put-with notify-ms: send ``frame`` (None: none) between whole replies once it is
        ready; ``wait`` answers at once (timed out) when the client half-closes or goes. It
        counts as an unanswered command until then (flow control)."""
        ...

    def settled(self, *job_ids: int, how: str = "") -> None:
        """Jobs it held are no longer its own; ``how``: the reply's word in lower case
        (deleted, released, ...), for the reservation spans (tubeq.server.tracing)."""
        ...

    def settling(self, job_ids: Sequence[int]) -> None: ...

    def registration_lost(self) -> None: ...

    def watches_changed(self) -> None:
        """Its watch list changed (watch, ignore): a push loop's wait follows it here (Redis
        follows it in change_watches)."""
        ...

    def close(self, *, stopping: bool = False) -> None:
        """Close the connection; ``stopping``: its process is stopping (the jobs it held go
        back with no try counted)."""
        ...

    async def wait_closed(self) -> None: ...
