"""The push extension of one connection: RESERVED frames for ready jobs, unasked.

Owns: :class:`Push`, a connection's push loop, its credits and the jobs pushed and not yet
settled. After ``push <credits>`` (tubeq only) the connection receives RESERVED frames for
ready jobs of its watched tubes without asking, at most ``credits`` unsettled at a time, taken
several per script call; each delete/release/bury of a pushed job (or its TTR running out) frees
a credit. The frames join the connection's reply stream between whole replies (``send``).

Rules:
* The loop waits as a blocked reserve does (tubeq.server.reserve_wait), registered for its
  whole life. A take that finds nothing counts it in as waiting in the same script
  (``reserve_many(stay=True)``), where a take, a count-in and a take again were three
  scripts. While it is counted in, a credit coming back does not wake it: puts hand it
  their jobs, or wake it, as they come.
* It takes no jobs while the client is not taking its replies (FlowControl.write_paused), nor
  once its process is stopping (ServerContext.stopping).
* ``quiet`` (an admin's, or the process stopping) sets its credits to 0, as ``push 0`` does,
  and tells a connection that asked (``push ... quiet=1``) with a ``QUIET`` frame.
* Credits a delete-many frees as it is sent (:meth:`Push.settled` with ``take_now``) start the
  next take at once when the loop sleeps for want of credit: the take leaves in the same Redis
  write as the deletes, and its jobs in the same client write as their replies.
* With no credit left it stops waiting in Redis, so puts stop handing jobs over to it; a job a
  put handed over while credit was free is still sent.
* Credits promised to a run of calls in flight (``promised``: that run's put_many may hand the
  loop that many jobs directly, tubeq.server.runs.CallRun) are not free for its takes; when
  the run is back, what it did not use is free again and the loop looks again (``release``).
* A pushed job whose TTR ran out before its frame was written is not sent: expire.lua gave it
  back, so it is the connection's no more.
* A store call that fails (Redis lost or stalled) does not end the loop: it logs, counts the
  token in again and tries again after RETRY_S, or sooner when a reconnect wakes it. (Jobs a
  take reserved whose answer was lost come back at their TTR, or when the connection goes.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol

import structlog

from tubeq.protocol import replies
from tubeq.redisio.futures import discard
from tubeq.server.context import Session
from tubeq.server.flow import FlowControl
from tubeq.server.reserve_wait import GrantOwner, Wait
from tubeq.store.records import Reservation

# The push extension takes at most this many jobs per script call, however many credits a
# client grants: one call must not hold Redis's single thread for long.
log = structlog.get_logger(__name__)

PUSH_BATCH_MAX = 64
# After a store call of the loop failed (Redis away or stalled), it tries again this much later
# (a reconnect wakes it sooner): the loop outlives an outage, so the connection is not starved.
RETRY_S = 0.5


class PushingSession(Session, GrantOwner, Protocol):
    """A connection as its push loop sees it: the jobs it is granted are its own."""


class Push:
    """One connection's push loop, from its first ``push`` until the connection goes."""

    __slots__ = ("_early", "_flow", "_loop", "_parked", "_send", "_session", "_take_due",
                 "cancels", "credits", "promised", "pushed", "task", "tell_quiet", "wait")

    def __init__(self, session: PushingSession, flow: FlowControl,
                 send: Callable[[bytes], None]) -> None:
        self._session = session
        self._flow = flow
        self._send = send  # frames into the connection's reply stream, between whole replies
        self.credits = 0
        self.cancels = False  # push ... cancels=1: CANCELLED <id> frames for held jobs
        self.tell_quiet = False  # push ... quiet=1: a QUIET frame when asked to stop taking
        self.pushed: dict[int, None] = {}  # the pushed jobs' ids, unsettled (an ordered set)
        # Credits a run of calls in flight may use (its put_many may hand it that many jobs
        # directly: tubeq.server.context.ServerContext.direct_room): no take counts them free
        # until the run is back (release)
        self.promised = 0
        self.task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the task's, once it runs
        self.wait: Wait | None = None  # the loop's, while it runs
        self._parked = False  # the loop sleeps (for credit, jobs, or a TTR to run out)
        self._early: asyncio.Future[list[Reservation]] | None = None  # a take sent for the loop
        self._take_due = False  # a delete-many freed credits this turn: take_early sends

    def start(self, credits: int) -> None:
        """``push <credits>``: start the loop, or let it look at its new credits."""
        self.credits = credits
        if self.task is None:
            loop = self._loop = asyncio.get_running_loop()
            self.task = loop.create_task(self._run())
        else:
            self.nudge()

    def quiet(self) -> None:
        """The server asks this consumer to stop taking jobs (``quiet``, or the process
        stopping): no more deliveries, as after ``push 0`` (a job a put handed over already is
        still sent); a connection that asked is told ``QUIET``, between whole replies. A later
        ``push <credits>`` takes jobs again, unless the process is stopping."""
        self.credits = 0
        if self.tell_quiet:
            self._send(replies.QUIET)
        self.nudge()

    def nudge(self) -> None:
        """Look again now: a credit came back, or the client takes its replies again."""
        if self.wait is not None:
            self.wait.event.set()

    def settled(self, job_ids: Iterable[int], *, take_now: bool = False) -> None:
        """Jobs the connection held are no longer its own: free their credits, if they had
        any, and look again once; ``take_now``: send that look's take now (see the rules)."""
        pushed, freed = self.pushed, False
        for job_id in job_ids:
            if job_id in pushed:
                del pushed[job_id]
                freed = True
        wait = self.wait
        if freed and (wait is None or not wait.counted):
            # (A loop counted in as waiting had credit left and found nothing: puts hand it
            # their jobs or wake it; a credit back finds nothing more.)
            if take_now:
                self._take_due = True  # sent at the end of the connection's turn: take_early
            self.nudge()

    def take_early(self) -> None:
        """At the end of the connection's turn (at once for a delete-many sent again outside
        one): the take that a delete-many's freed credits allow (``settled`` with
        ``take_now``). It leaves in the deletes' Redis write (written at the end of the loop's
        tick) unless a full Redis batch of the turn's calls came between, and it is sized by
        the credits as the turn left them: a ``push`` read after the delete-many counts."""
        if not self._take_due:
            return
        self._take_due = False
        wait = self.wait
        # Not while the loop is to count in again first (Redis lost its registration: the
        # loop's own order keeps Redis and ``wait.counted`` agreeing).
        if wait is None or not self._parked or self._early is not None or wait.recount:
            return
        free = self.room()
        if free > 0:
            # A staying take, as the loop's own: one that finds nothing (the tube emptied
            # before the credits came back) leaves the loop counted in as waiting, so the next
            # put hands it its job or wakes it. A plain one left it waiting uncounted, deaf to
            # puts until its periodic re-check (RECHECK_S).
            self._early = wait.send_take(min(free, PUSH_BATCH_MAX), stay=True)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _run(self) -> None:
        """Deliver ready jobs while credits allow; sleep on the waiter registry otherwise."""
        session = self._session
        wait = self.wait = Wait(session.ctx.registry, session.store, session.token,
                                session.watched, owner=session)
        try:
            while True:
                try:
                    await self._step(wait)
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # Redis lost or stalled: go on once it is back
                    log.warning("push: a store call failed; trying again", conn=session.token,
                                error=repr(error))
                    wait.recount = True  # Redis may have lost the count-in: count in again
                    await asyncio.sleep(RETRY_S)
        finally:
            self.wait = None
            stopped = wait.leave(consumed=True, claim=False)
            if stopped is not None:
                stopped.add_done_callback(discard)

    async def _step(self, wait: Wait) -> None:
        """One turn of the loop: send what the credits allow, or sleep until woken."""
        session, pushed = self._session, self.pushed
        store = session.store
        if self._early is None:  # (with a take out, after it: it may count the loop in or out)
            await wait.count_in_again()
        now = store.clock()
        expired = [j for j in pushed if session.reserved.get(j, 0) <= now]
        if expired:
            session.settled(*expired, how="ttr")  # their TTR ran out: queued again
        free = self.room()  # 0 while the client takes no frames or this process stops
        early, self._early = self._early, None
        if early is not None or free > 0:
            jobs = await wait.took(early if early is not None else wait.send_take(
                min(free, PUSH_BATCH_MAX), stay=True))
            if jobs:
                self._send_jobs(jobs)
                return  # look again: more may have come meanwhile (jobs in one take each)
            # None: counted in by the same script, so a put hands it a job or wakes it from
            # now on; unless the credits went (push 0, quiet, a stop) while a take sent
            # early was out: then count out, as below.
            if early is not None and wait.counted and not self.room():
                self._send_jobs(await wait.claim())
                now = store.clock()
        elif wait.counted:
            # No credit left (push 0, or credits lowered): stop waiting, so puts stop handing
            # jobs over; one a put handed over while credit was free is sent.
            self._send_jobs(await wait.claim())
            now = store.clock()
        # Wake when a pushed job's TTR runs out: its credit comes back.
        reserved = session.reserved
        deadlines = [reserved[j] for j in pushed if j in reserved]
        self._parked = True
        wait.deaf = not wait.counted and not self.room()  # it takes nothing: hints pass it by
        if wait.deaf:
            wait.pass_on()  # a hint that woke it while it could take nothing: the next one's
        try:
            await wait.sleep((min(deadlines) - now) / 1000 if deadlines else None,
                             loop=self._loop)
        finally:
            self._parked = False
            wait.deaf = False
        if self._early is None or not wait.woken:
            # (After an early take, which re-armed the wait as it was sent, a hint that came
            # since stays: the loop tries once more.)
            wait.event.clear()

    def takes_directly(self) -> bool:
        """Whether the loop runs, so a put's direct hand-over to it is its own (a put sent
        while it was counted in as waiting with mode 'p': lua/includes/handing.lua)."""
        return self.wait is not None

    def room(self) -> int:
        """Its free credits not promised yet: how many more jobs it may be handed directly
        (0 while the client takes no frames, or once this process stops)."""
        if self._flow.write_paused or self._session.ctx.stopping:
            return 0
        return max(0, self.credits - len(self.pushed) - self.promised)

    def release(self, room: int) -> None:
        """A run of calls that was promised ``room`` credits is back (the jobs it handed over
        are held by now): what it did not use is free again, so the loop looks again."""
        self.promised = max(0, self.promised - room)
        self.nudge()

    def send_direct(self, job: Reservation) -> None:
        """A put of this process handed ``job`` straight to this loop (the connection holds it
        already): sent as a take's jobs are. The loop stays counted in as waiting, so puts go
        on handing it jobs; once its credit is used up (or the client takes no frames), it is
        woken to count itself out."""
        self._send_jobs([job])
        if self._flow.write_paused or len(self.pushed) >= self.credits:
            self.nudge()

    def _send_jobs(self, jobs: list[Reservation]) -> None:
        """Send ``jobs`` as RESERVED frames, but those whose TTR ran out on the way here."""
        now = self._session.store.clock()
        pushed, frames = self.pushed, []
        for job in jobs:
            if job.deadline_ms > now:
                pushed[job.id] = None
                frames.append(replies.reserved(job.id, job.body))
        if frames:
            self._send(b"".join(frames))
