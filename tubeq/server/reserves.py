"""One connection's reserve queue: its unanswered reserves and the commands pipelined behind them.

Owns: :class:`ReserveQueue`, which a connection (tubeq.server.connection) holds one of for its
life: the reserves sent and not yet answered, in order; the jobs their store calls granted and
no reserve has answered with yet (the pool); the head reserve's wait for a job; the command the
pump holds behind reserves; the commands Redis deferred, to be sent again; and the grants a
disconnect must hand back. Also the rules' constants: the DEADLINE_SOON safety margin, a
reserve-with-timeout's grace over a stalled Redis, and when the map of held jobs is pruned.

Rule 1: everything that decides the order of a reserve and of the commands behind it lives
here. The connection's pump asks whether a command may pass the reserves before it
(:meth:`ReserveQueue.may_pass`) and which reserve it tells Redis it passes
(:meth:`ReserveQueue.passing`), and hands the reply of one that passed to
:meth:`ReserveQueue.sent_past`; it keeps none of that state, only carries ``passing`` to the
handler while it runs (Session.passing). The held-job map this reads for DEADLINE_SOON and
prunes as it grows is the connection's (Session.reserved).

Rules:
* Reserves answer in the order they came, with the jobs granted in the order granted, as if
  they had run one at a time (beanstalkd runs a connection's commands one by one). A reserve's
  first try goes to Redis at once; the first reserve that finds nothing waits
  (tubeq.server.reserve_wait) and holds the reserves behind it.
* A job granted to this connection is its own whatever becomes of the reserve that asked
  (:meth:`ReserveQueue.track_grants`): one granted after its reserve answered goes to the next
  reserve, or back to ready when the connection goes (disconnect.lua) or by TTR.
* What may overtake an unanswered reserve: further reserves, and delete, bury or touch (or
  delete-many) of jobs the connection holds, with the number of the first reserve they pass;
  Redis defers such a command if one of those reserves waits, and it is sent again once they
  have answered (protocol.md, "Commands behind a reserve"). Every other command waits in the
  connection until the reserves before it have answered.
* A reserve-with-timeout answers TIMED_OUT at most RESERVE_GRACE_S after its timeout, however
  long Redis takes; a reserve answers DEADLINE_SOON while a job the connection holds is within
  SAFETY_MARGIN_MS of its TTR and nothing is reservable.
* Thousands of connections each hold one queue: it keeps slots, and its occasional lists
  (untried, grants, deferred) exist only while they hold something.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import structlog

from tubeq.protocol import commands as c
from tubeq.protocol import replies
from tubeq.redisio.futures import chain
from tubeq.server.context import Reply, Session, reply_bytes
from tubeq.server.reserve_wait import Wait
from tubeq.server.scheduler import TTR
from tubeq.store.records import Deferred, NoJob, Reservation

log = structlog.get_logger(__name__)

# beanstalkd's safety margin: a reserved job whose TTR ends within this many ms makes a reserve
# answer DEADLINE_SOON (the worker should finish or touch it instead of taking more work).
SAFETY_MARGIN_MS = 1000

# A reserve-with-timeout answers TIMED_OUT at most this long after its timeout, whatever Redis
# does: a try or a count still in flight then is not waited for (a job it grants later goes to
# the connection's next reserve, or back to ready by TTR or when the connection closes).
RESERVE_GRACE_S = 0.25

# Past this many held jobs, a new reservation first drops the ones whose TTR ran out, so a
# worker that lets jobs time out does not grow the map forever.
PRUNE_RESERVED_AT = 64

# Command classes by what may overtake a reserve (exact types: a set lookup beats isinstance
# with a union on this path, which every command behind a reserve takes).
RESERVES: frozenset[type[c.Command]] = frozenset({c.Reserve, c.ReserveWithTimeout,
                                                  c.ReserveMany})  # batches: reserve-many
_ON_HELD_JOBS: frozenset[type[c.Command]] = frozenset({c.Delete, c.Bury, c.Touch, c.Finish,
                                                      c.Fail, c.ReportProgress})
ONE_JOB_RESERVES: frozenset[type[c.Command]] = frozenset({c.Reserve, c.ReserveWithTimeout})

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


class ReserveOwner(Session, Protocol):
    """A connection as its reserve queue sees it (tubeq.server.connection.Connection)."""

    # The handler table the connection dispatches through: a deferred command is sent again
    # through it.
    handlers: dict[type[c.Command], Callable[[Session, Any], Reply | None]]

    def reply_done(self, reply: asyncio.Future[bytes]) -> None:
        """Write ``reply`` (just resolved) once the replies before it are written."""
        ...

    def schedule_pump(self) -> None:
        """Dispatch parsed commands again soon: those held behind the reserves may go now."""
        ...


class ReserveQueue:
    """One connection's unanswered reserves, in order, and what waits behind them."""

    # Slots: one queue per connection, thousands of them idle.
    __slots__ = (
        "_conn", "_deferred", "_eof", "_lost", "_numbered", "_pool", "_prune_at", "blocking",
        "grants", "held", "pending", "untried", "wait",
    )

    def __init__(self, conn: ReserveOwner) -> None:
        self._conn = conn
        # Unanswered reserves, in order. The same list for the queue's life: the connection's
        # pump reads it once per command.
        self.pending: list[PendingReserve] = []
        self._pool: list[Reservation] = []  # granted, not yet handed to a reserve
        self.held: c.Command | None = None  # parsed, waiting for the reserves before it
        self._numbered = 0  # reserves so far (PendingReserve.number)
        # Commands sent past a reserve that Redis deferred (tubeq.store.records.Deferred): each
        # with its reply and the number of the last reserve before it; sent again once those
        # reserves have answered (_replay_deferred). None while there are none.
        self._deferred: list[tuple[c.Command, asyncio.Future[bytes], int]] | None = None
        # The reserves of the connection's current turn whose first tries are still to go, as
        # one store call when the turn ends (send_untried); None while there are none.
        self.untried: list[PendingReserve] | None = None
        # Store calls that may grant jobs; None while there are none (most of an idle life).
        self.grants: list[asyncio.Future[Any]] | None = None
        self.blocking: asyncio.Task[bytes] | None = None  # the head reserve's wait
        self.wait: Wait | None = None  # the head reserve's, while it waits
        self._prune_at = PRUNE_RESERVED_AT  # see hold
        self._eof = False  # the client half-closed
        self._lost = False  # the connection is gone

    # -- what the connection tells it ---------------------------------------------------------

    def eof_received(self) -> None:
        """The client half-closed: a blocked reserve answers TIMED_OUT."""
        self._eof = True
        if self.wait is not None:
            self.wait.wake()

    def connection_lost(self) -> None:
        """The connection is gone: nothing more is answered or sent again."""
        self._lost = True

    # -- reserves -----------------------------------------------------------------------------

    def start(self, timeout_s: int | None, count: int | None,
              in_turn: bool) -> asyncio.Future[bytes]:
        """Send this reserve's first try now, or with its turn's others (``in_turn``: the
        connection's pump is taking a read's commands); it answers in order (see
        :meth:`_advance`). With ``count`` (reserve-many) it takes up to that many jobs,
        answered as one BATCH."""
        conn = self._conn
        conn.mark_worker()
        self._numbered += 1
        pending = PendingReserve(timeout_s, asyncio.get_running_loop().create_future(),
                                 self._numbered, count=count)
        self.pending.append(pending)
        if len(self.pending) == 1:
            pending.started = asyncio.get_running_loop().time()
        if count is None and in_turn:
            if self.untried is None:
                self.untried = []
            self.untried.append(pending)  # tried with the turn's others (send_untried)
        else:
            attempt: asyncio.Future[Any] = conn.store.reserve(conn.token, number=self._numbered) \
                if count is None else conn.store.reserve_many(conn.token, count,
                                                              number=self._numbered)
            self.track_grants(attempt)
            attempt.add_done_callback(functools.partial(self._tried, [pending]))
        if timeout_s is not None:  # answers TIMED_OUT if its first try is still out by then
            conn.ctx.registry.overdue.add(
                pending, asyncio.get_running_loop().time() + timeout_s + RESERVE_GRACE_S,
                self._first_try_overdue)
        return pending.reply

    def send_untried(self) -> None:
        """Send the turn's reserves' first tries as one store call; they still answer in
        their own order."""
        untried = self.untried
        if not untried:
            return
        self.untried = None
        conn = self._conn
        first = untried[0]
        attempt: asyncio.Future[Any]
        if len(untried) == 1:
            attempt = self.track_grants(conn.store.reserve(conn.token, number=first.number))
        else:
            attempt = self.track_grants(conn.store.reserve_many(
                conn.token, len(untried), number=first.number, each=True))
        attempt.add_done_callback(functools.partial(self._tried, untried))

    def _first_try_overdue(self, pending: PendingReserve) -> None:
        """A reserve-with-timeout whose first try Redis has not answered by its timeout: it
        answers TIMED_OUT if it is next to answer (a later one waits for the calls before it,
        which the Redis client's own bound ends)."""
        if pending.tried or self._lost or not self.pending or self.pending[0] is not pending:
            return
        pending.tried = True
        self.pending.pop(0)
        self._answer(pending, replies.TIMED_OUT)
        self._advance()

    def track_grants(self, call: asyncio.Future[T]) -> asyncio.Future[T]:
        """Record the jobs a store call grants as this connection's, whatever becomes of the
        command that asked (a disconnect must hand them back)."""
        if self.grants is None:
            self.grants = []
        self.grants.append(call)
        call.add_done_callback(self._granted)
        return call

    def _granted(self, f: asyncio.Future[Any]) -> None:
        assert self.grants is not None
        self.grants.remove(f)
        if not self.grants:
            self.grants = None
        if f.cancelled() or f.exception() is not None:
            return
        result = f.result()
        if isinstance(result, list):
            if result:
                self.hold(result)
        elif isinstance(result, Reservation):
            self.hold((result,))

    def hold(self, jobs: Sequence[Reservation]) -> None:
        """``jobs`` (one store call's grants, or a put's direct hand-over) are this
        connection's until settled."""
        conn = self._conn
        if len(conn.reserved) >= self._prune_at:
            # Jobs whose TTR ran out are no longer ours (expire.lua requeued them, or will).
            now = conn.store.clock()
            conn.reserved = {j: d for j, d in conn.reserved.items() if d > now}
            # The next pruning waits until the map has doubled: a connection that really holds
            # many jobs (reserve-many, push with many credits) would otherwise copy the whole
            # map for every job it takes; this way it costs O(1) per job, amortized.
            self._prune_at = max(PRUNE_RESERVED_AT, 2 * len(conn.reserved))
        reserved = conn.reserved
        for job in jobs:
            reserved[job.id] = job.deadline_ms
        conn.ctx.scheduler.note_due(min(job.deadline_ms for job in jobs), TTR)
        if conn.ctx.tracer is not None:
            conn.ctx.tracer.reserved(conn.store, conn, jobs)

    def _tried(self, pendings: list[PendingReserve],
               f: asyncio.Future[Reservation | NoJob | list[Reservation]]) -> None:
        """The first try of ``pendings`` (consecutive reserves) came back: what it granted
        goes to the pool, which answers them in order."""
        failed = f.cancelled() or f.exception() is not None
        overdue = self._conn.ctx.registry.overdue
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
            if self._pool and self.wait is not None:
                self.wait.wake()  # the blocked head takes it
        self._advance()

    def _pool_ready(self) -> bool:
        """Whether a granted job waits in the pool, once those whose TTR ran out meanwhile are
        dropped: expire.lua gave them back (another connection may have them now), so they
        are this connection's no more. A job granted by a call that outlived its reserve can
        wait here that long."""
        if self._pool:
            now = self._conn.store.clock()
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
        while self.pending and self.blocking is None and not self._lost:
            head = self.pending[0]
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
                self.blocking = task
                task.add_done_callback(self._waited)  # for head, still pending[0] then
                return
            self.pending.pop(0)
            self._answer(head, answer)
        if self._deferred is not None:
            self._replay_deferred()
        if not self.pending and self.held is not None and not self._lost:
            self._conn.schedule_pump()  # commands held behind them

    def _waited(self, task: asyncio.Task[bytes]) -> None:
        self.blocking = None
        if task.cancelled():
            return  # the connection is gone
        self._answer(self.pending.pop(0), reply_bytes(task, self._conn.extended))
        self._advance()

    def _answer(self, reserve: PendingReserve, answer: bytes) -> None:
        """Resolve a reserve taken off ``pending`` and write its reply like any other (a
        reserve's reply future has no done-callback: one object less per waiting reserve)."""
        reserve.reply.set_result(answer)
        self._conn.reply_done(reserve.reply)  # metrics count it as it is written (connection)

    def _in_margin(self, now: int) -> bool:
        return any(d - SAFETY_MARGIN_MS <= now < d for d in self._conn.reserved.values())

    def _next_margin_s(self, now: int) -> float | None:
        starts = [d - SAFETY_MARGIN_MS for d in self._conn.reserved.values()
                  if d - SAFETY_MARGIN_MS > now]
        return (min(starts) - now) / 1000 if starts else None

    async def _wait_for_job(self, started: float, timeout_s: int | None,
                            count: int | None = None) -> bytes:
        """A reserve whose first try found nothing: register, try, wait with a bound, try
        again (tubeq.server.reserve_wait). ``count``: a reserve-many's."""
        loop = asyncio.get_running_loop()
        conn = self._conn
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
                now = conn.store.clock()
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
                result: Reservation | NoJob | list[Reservation]
                if wait is None:
                    # Registered, then one try that counts the token in when it finds nothing
                    # (where a count-in and a try were two round trips before the sleep).
                    wait = self.wait = Wait(conn.ctx.registry, conn.store, conn.token,
                                            conn.watched, owner=self, deadline=deadline)
                    result = await wait.took(wait.send_take(1 if count is None else count,
                                                            stay=True, direct=False))
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
                    # paused): expire.lua gave it back. Wait on, counted in again, after one
                    # more try: the job went back to ready while the token was counted out, so
                    # no wake-up was published for it.
                    await wait.count_in()
                    wait.wake()
                del result  # not kept alive through the next (long) wait
        except _Overdue:
            return replies.TIMED_OUT
        finally:
            if wait is not None:
                self.wait = None
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
        if self.wait is not None:
            self.wait.wake()
        self._advance()

    async def within(self, call: asyncio.Future[T], deadline: float | None) -> T:
        """``call``'s result; with a ``deadline`` (loop time), _Overdue once it has passed by
        RESERVE_GRACE_S (Redis stalled): then what the call grants goes to the next reserves."""
        if deadline is None:
            return await asyncio.shield(call)
        # What asyncio.shield plus asyncio.timeout_at do, without the timeout's own loop timer
        # (5-6 us per await, measured): the registry's Deadlines bound it.
        ended = asyncio.get_running_loop().create_future()
        settle = functools.partial(_settle, ended)
        call.add_done_callback(settle)
        overdue = self._conn.ctx.registry.overdue
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

    # -- commands behind reserves -------------------------------------------------------------

    def may_pass(self, command: c.Command) -> bool:
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
        if kind in RESERVES:
            return True
        if self.blocking is not None or not self._conn.store.defers_behind_reserves:
            return False
        if kind in _ON_HELD_JOBS:
            return cast(c.Delete | c.Bury | c.Touch, command).id in self._conn.reserved
        if kind is c.DeleteMany:  # batches: only when every id is a job this connection holds
            reserved = self._conn.reserved
            return all(i in reserved for i in cast(c.DeleteMany, command).ids)
        return False

    def passing(self, command: c.Command) -> int:
        """For a command let past unanswered reserves: the number of the first of them, which
        it tells Redis (it is deferred if one of them waits), or 0 when it cannot change what
        any of them returns, whatever they do: a delete or touch of jobs whose TTR cannot reach
        its safety margin before every reserve ahead has ended, even waiting to its timeout.
        (A bury always tells: another connection's kick could hand the job to the reserve.)
        A pipelining consumer with a long TTR and a short reserve timeout so pays nothing."""
        kind = type(command)
        if kind in RESERVES:
            return 0
        first = self.pending[0].number
        if kind is c.Bury:
            return first
        conn = self._conn
        horizon = conn.store.clock()
        for reserve in self.pending:
            if reserve.timeout_s is None:
                return first
            horizon += reserve.timeout_s * 1000 + int(RESERVE_GRACE_S * 1000)
        ids = cast(c.DeleteMany, command).ids if kind is c.DeleteMany else (
            cast(c.Delete | c.Touch, command).id,)
        reserved = conn.reserved
        if all(reserved.get(i, 0) - SAFETY_MARGIN_MS > horizon for i in ids):
            return 0
        return first

    def sent_past(self, command: c.Command,
                  outcome: asyncio.Future[bytes]) -> asyncio.Future[bytes]:
        """The reply of ``command``, sent past the unanswered reserves (:meth:`passing` not
        0) as ``outcome``: ``outcome``'s, or if Redis deferred it, that of the command sent
        again once those reserves have answered."""
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        outcome.add_done_callback(functools.partial(
            self._passed, command, reply, self.pending[-1].number))
        return reply

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
        conn = self._conn
        while deferred and not self._lost and (
                not self.pending or self.pending[0].number > deferred[0][2]):
            command, reply, _ = deferred.pop(0)
            conn.replaying = True
            try:
                outcome = conn.handlers[type(command)](conn, command)
            except Exception:
                log.exception("handler failed", command=type(command).__name__)
                outcome = replies.INTERNAL_ERROR
            finally:
                conn.replaying = False
            if outcome is None or isinstance(outcome, bytes):
                reply.set_result(outcome or replies.INTERNAL_ERROR)
            else:
                outcome.add_done_callback(functools.partial(chain, target=reply))
        if not deferred:
            self._deferred = None


def _reserved(job: Reservation) -> bytes:
    return replies.reserved(job.id, job.body)


def _settle(ended: asyncio.Future[None], *_: object) -> None:
    if not ended.done():
        ended.set_result(None)


class _Overdue(Exception):
    """A reserve-with-timeout's Redis call outlived its timeout (ReserveQueue.within)."""
