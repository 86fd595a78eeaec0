"""The scheduler: time-driven transitions, run when they are due, never on a fixed period.

It sleeps until the earliest of: the next delayed job or pause end (``timers``), the next TTR
deadline (``reserved``), the next recurring schedule's tick (``schedules``, see
:func:`tick_schedules`), and this process's next heartbeat. Anything in this process that
creates an earlier due instant (a delayed put, a reserve, a pause) calls :meth:`note_due`,
which cuts the sleep short. Due instants created by other tubeq processes are theirs to serve;
this process only learns them at its next wake-up, which bounds how late a job can be when the
process that scheduled it dies (the heartbeat period), or sooner when the script that created
them announces them on the due channel (a schedule's next tick, a rate window's end), which
the server turns into :meth:`Scheduler.note_due`. The scripts are atomic, so several
processes sweeping the same due jobs never promote or expire one twice.

Liveness: each process heart-beats; one silent for REAP_AFTER_MS is taken for dead by the next
reap of any process (reap.lua). Two rules keep a live process from being lost that way:

* a process reaps only once its own heartbeats have been answered without a gap for
  REAP_AFTER_MS, so a silence that was Redis's (down, restarting, stalled: every process's
  beats stopped) is never taken for the others' death;
* a process that was reaped anyway (it was paused past the limit: a VM pause, swapping), or
  whose Redis came back empty, learns it from its next heartbeat (heartbeat.lua answers that it
  was not registered) and calls ``on_registration_lost``, which restores what its live
  connections need (tubeq.server.context.ServerContext.restore_registrations).

Timeline of a pause, processes A and B:
    t0  A's last beat        t0+5 s  B's reap: A is dead (B beat every second since)
    t0+6 s  A wakes, beats: "not registered"  ->  A restores its connections' watches, their
            waits and its gauges; its connections are served again from here on

A namespace split into shards (tubeq.store.shards) has one Scheduler per shard, run as one by
:class:`ShardSchedulers`: the store knows no scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from tubeq.model import recurring
from tubeq.server.fine_timer import FineTimer
from tubeq.server.waiters import WaiterRegistry
from tubeq.store.shards import ShardedStore
from tubeq.store.store import SWEEP_LIMIT, Store

log = structlog.get_logger(__name__)

# A process heart-beats this often; one silent for REAP_AFTER_MS is taken for dead and its tube
# references and gauges are reaped. Three missed beats: long enough for a stalled loop or a GC
# pause, short enough that stats stop counting a dead process's connections within seconds.
HEARTBEAT_MS = 1000
REAP_AFTER_MS = 3 * HEARTBEAT_MS
# Heartbeats answered further apart than this (or one that took longer than HEARTBEAT_MS to
# answer) break the continuity a process needs before it may reap others.
BEAT_GAP_MS = 2 * HEARTBEAT_MS
# On a Redis error the sweep is retried after this pause instead of spinning.
ERROR_BACKOFF_S = 0.5


# What a due instant is for, so a sweep runs only the scripts whose instants have come: promote.lua
# (delayed jobs, pause ends, rate windows, TTLs), expire.lua (TTRs), schedule_due.lua
# (recurring ticks). A note that does not say (ANY) counts for all three.
DELAYED, TTR, TICK = 0, 1, 2
ANY = -1
_KINDS = (DELAYED, TTR, TICK)
NONE_DUE = -1  # the scripts' "nothing due"
UNKNOWN = -2  # not known here: the script runs at the next sweep


def _earliest(due: int, other: int) -> int:
    """The sooner of a kind's next instant and ``other`` (UNKNOWN stays: it runs anyway;
    NONE_DUE is later than any instant)."""
    if other == NONE_DUE or due == UNKNOWN or (due != NONE_DUE and due <= other):
        return due
    return other


class Scheduler:
    def __init__(self, store: Store, registry: WaiterRegistry) -> None:
        self.store = store
        self.registry = registry
        self.on_registration_lost: Callable[[], None] | None = None
        self._beat_ms: int | None = None  # when the last heartbeat was answered
        self._up_since_ms: int | None = None  # heartbeats answered without a gap since then
        self._target_ms: int | None = None  # when the current sleep ends; None while sweeping
        # Each kind's next instant as this process knows it (its script's last answer, lowered
        # by notes; NONE_DUE or UNKNOWN), and the notes that came while a sweep was out (the
        # sweep's answers would otherwise overwrite them: it may have run before their change).
        self._dues = [UNKNOWN] * len(_KINDS)
        self._noted: list[int | None] = [None] * len(_KINDS)
        # When a sweep may make a job ready: the current sleep's end, when that is a delayed
        # job's, a TTR's or a noted instant (not a heartbeat's or a schedule's tick alone, whose
        # put hands its job over itself); None: none. A sweep a note starts sooner (its instant
        # is still ahead) makes nothing ready.
        self._readies_at: int | None = 0
        self._nudge = asyncio.Event()

    def note_due(self, due_ms: int, kind: int = ANY) -> None:
        """Something of ``kind`` (DELAYED, TTR, TICK; ANY: not said) falls due at ``due_ms``:
        wake up in time for it, and run that kind's script then.

        While a sweep is in flight the note is kept beside it (the sweep may have run before
        the change that created it) and only lowers the next sleep's target; re-sweeping at
        once for every note would spin under load, where every reserve notes its TTR deadline.
        """
        kinds = _KINDS if kind == ANY else (kind,)
        if self._target_ms is None:
            noted = self._noted
            for k in kinds:
                held = noted[k]
                noted[k] = due_ms if held is None or due_ms < held else held
            return
        dues = self._dues
        for k in kinds:
            dues[k] = _earliest(dues[k], due_ms)
        if due_ms < self._target_ms:
            if self._readies_at is None or due_ms < self._readies_at:
                self._readies_at = due_ms  # the sweep guesses if this instant has come
            self._nudge.set()

    async def _heartbeat(self, sent_ms: int) -> None:
        unregistered = await self.store.heartbeat()
        answered_ms = self.store.clock()
        if (self._beat_ms is None or answered_ms - self._beat_ms > BEAT_GAP_MS
                or answered_ms - sent_ms > HEARTBEAT_MS):
            self._up_since_ms = answered_ms
        self._beat_ms = answered_ms
        if unregistered and self.on_registration_lost is not None:
            log.warning("this process was not registered in Redis (taken for dead after a "
                        "pause, or Redis lost its data): restoring its connections")
            self.on_registration_lost()

    def when_registration_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when a heartbeat finds this process unregistered."""
        self.on_registration_lost = callback

    def may_reap(self, now_ms: int) -> bool:
        """Whether this process has heard Redis answer its heartbeats without a gap for long
        enough to tell others' silence from Redis's own."""
        return self._up_since_ms is not None and now_ms - self._up_since_ms >= REAP_AFTER_MS

    async def run(self) -> None:
        timer = FineTimer(self._nudge.set)
        try:
            await self._run(timer)
        finally:
            timer.close()

    async def _run(self, timer: FineTimer) -> None:
        next_heartbeat = 0
        while True:
            try:
                now = self.store.clock()
                if now >= next_heartbeat:
                    await self._heartbeat(now)
                    if self.may_reap(now):
                        reaped = await self.store.reap(now - REAP_AFTER_MS)
                        if reaped:
                            log.warning("reaped silent tubeq processes", count=reaped)
                    trimmed = self.store.trim_events()  # the event stream's cap, once a beat
                    if trimmed is not None:
                        await trimmed
                    next_heartbeat = now + HEARTBEAT_MS
                    self._dues = [UNKNOWN] * len(_KINDS)  # others' instants: learn them
                self._nudge.clear()
                await self._sweep(now)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("scheduler sweep failed", error=repr(exc))
                await asyncio.sleep(ERROR_BACKOFF_S)
                continue
            dues = self._dues
            target = min(t for t in (*dues, next_heartbeat) if t >= 0)
            self._target_ms = target
            self._readies_at = target if target in (dues[DELAYED], dues[TTR]) else None
            # Aimed at the due instant itself, not a whole-ms sleep from a floored clock (which
            # made deliveries up to 1 ms later), on a timer finer than the loop's (uvloop counts
            # whole ms: tubeq.server.fine_timer). Its end sets the nudge, as note_due does.
            delay = (target - self.store.exact_ms()) / 1000
            if delay > 0:
                timer.arm(delay)
                await self._nudge.wait()
                timer.cancel()
            self._target_ms = None

    async def _sweep(self, now: int) -> None:
        """Run the scripts whose instants have come (each kind's, or not known), and keep
        the next instant each answers; a note that came meanwhile is kept beside them."""
        dues = self._dues
        self._take_notes()  # those since the last sweep went out count for this one
        run = [due == UNKNOWN or (due != NONE_DUE and due <= now) for due in dues]
        store = self.store
        calls: list[Awaitable[Any]] = []
        if run[DELAYED]:
            calls.append(store.promote())
        if run[TTR]:
            calls.append(store.expire())
        if run[TICK]:
            calls.append(tick_schedules(store, self.note_due))
        if not calls:
            return
        guessed = ((run[DELAYED] or run[TTR]) and self._readies_at is not None
                   and now >= self._readies_at)
        if guessed:
            # The waiter first in line here tries now, its try sent right behind the sweep's
            # scripts instead of after their reply: a job they make ready comes back with
            # them (a hint; its tube may be another's).
            self.registry.wake_first()
        answers = iter(await asyncio.gather(*calls))
        woken: list[str] = []
        if run[DELAYED]:
            dues[DELAYED], promoted = next(answers)
            woken += promoted
        if run[TTR]:
            dues[TTR], expired = next(answers)
            woken += expired
            # Its next instant is also the earliest retry a backoff delayed (expire.lua).
            dues[DELAYED] = _earliest(dues[DELAYED], dues[TTR])
        if run[TICK]:
            dues[TICK] = next(answers)
        if not guessed:
            # This process's waiters on those tubes need not wait for the PUBLISH to come
            # back through the subscriber (the scripts publish for other processes). After a
            # guess they do: the PUBLISH comes in the same Redis write as this reply, with
            # each tube's ready count, and wakes that many of the waiters not trying yet
            # (WaiterRegistry.wake); a wake-up here as well sent one more waiter to try for
            # nothing, the guessed one's try having taken the job.
            for tube in woken:
                self.registry.wake_one(tube)
        self._take_notes()

    def _take_notes(self) -> None:
        """Fold the notes kept while sweeping into each kind's next instant."""
        dues = self._dues
        for k, due in enumerate(self._noted):
            if due is not None:
                dues[k] = _earliest(dues[k], due)
        self._noted = [None] * len(_KINDS)


async def tick_schedules(store: Store,
                         note_due: Callable[[int, int], None] | None = None) -> int:
    """Run every recurring schedule whose tick is due; return the next tick's due time (-1:
    none). ``note_due`` learns the due time of a delayed job a tick put.

    Each tick is one schedule_tick.lua call with the next due time computed here (Lua has no
    cron library); the script refuses a tick another process already ran, so every process may
    race every tick and exactly one job is put. Timeline of two processes racing tick N::

        A: schedule_due (N due) ... next_due(N) ... schedule_tick(N -> N+1): job put
        B: schedule_due (N due) ........ next_due(N) ....... schedule_tick(N -> N+1): 0

    A crash before A's script ran leaves tick N due for B (or A after its restart); after it,
    tick N is done and N+1 stored: nothing is lost or doubled in between.
    """
    later, due = await store.schedules_due()
    if not due:
        return later
    now = store.clock()
    nexts: list[int] = []
    calls: list[asyncio.Future[Any]] = []
    for tick in due:
        try:
            next_ms = recurring.next_due(tick.kind, tick.spec, tick.due_ms, now)
        except recurring.BadSchedule as exc:  # no future tick left: stop it, never spin on it
            log.warning("schedule has no next tick: removed", tube=tick.tube,
                        schedule=tick.name, error=str(exc))
            calls.append(store.schedule_remove(tick.tube, tick.name))
            continue
        nexts.append(next_ms)
        calls.append(store.schedule_tick(tick, next_ms))
        if tick.delay_ms > 0 and note_due is not None:
            note_due(now + tick.delay_ms, DELAYED)
    await asyncio.gather(*calls)
    # A tick another process won stored the same next due (or, late, its own); either way
    # this process wakes in time and schedule_due tells it the rest.
    if len(due) >= SWEEP_LIMIT:
        return now  # more are due: sweep again at once
    return min(t for t in (later, *nexts) if t >= 0) if nexts or later >= 0 else -1


class ShardSchedulers(Scheduler):
    """One :class:`Scheduler` per shard, as one: due times go to all of them (a due time says
    nothing of the shard it belongs to, and a note only shortens a sleep)."""

    def __init__(self, store: ShardedStore, registry: WaiterRegistry) -> None:
        super().__init__(store.home, registry)
        self.each = [Scheduler(shard, registry) for shard in store.shards]

    def when_registration_lost(self, callback: Callable[[], None]) -> None:
        for scheduler in self.each:  # any shard may find the process unregistered
            scheduler.when_registration_lost(callback)

    def rebind(self, shard: int, store: Store) -> None:
        """Shard ``shard``'s Store was replaced (:meth:`tubeq.store.shards.ShardedStore.rebind`)."""
        self.each[shard].store = store

    def note_due(self, due_ms: int, kind: int = ANY) -> None:
        for scheduler in self.each:
            scheduler.note_due(due_ms, kind)

    async def run(self) -> None:
        await asyncio.gather(*(scheduler.run() for scheduler in self.each))
