"""When a tubeq process may take another for dead (tubeq.server.scheduler): only after hearing its
own heartbeats answered without a gap for REAP_AFTER_MS, so a silence that was Redis's never
counts; and a heartbeat that finds the process unregistered restores its registrations. And
whom a sweep wakes before its reply: the first waiter, when the sweep may make a job ready.

Pure logic against a fake store whose clock the test moves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from tubeq.server import scheduler as scheduler_module
from tubeq.server.scheduler import (
    BEAT_GAP_MS,
    DELAYED,
    HEARTBEAT_MS,
    REAP_AFTER_MS,
    TTR,
    Scheduler,
)
from tubeq.server.waiters import Waiter, WaiterRegistry
from tubeq.store.store import Store


class BeatingStore:
    """heartbeat() takes ``answer_ms`` of the fake clock and answers ``unregistered``."""

    def __init__(self) -> None:
        self.now = 1_000_000
        self.answer_ms = 1
        self.unregistered = False

    def clock(self) -> int:
        return self.now

    async def heartbeat(self) -> bool:
        self.now += self.answer_ms
        return self.unregistered


def _scheduler() -> tuple[Scheduler, BeatingStore, list[str]]:
    store = BeatingStore()
    scheduler = Scheduler(cast(Store, store), WaiterRegistry())
    lost: list[str] = []
    scheduler.when_registration_lost(lambda: lost.append("lost"))
    return scheduler, store, lost


async def _beat(scheduler: Scheduler, store: BeatingStore) -> None:
    await scheduler._heartbeat(store.now)


async def test_a_process_reaps_only_after_hearing_itself_for_the_reap_limit() -> None:
    scheduler, store, _ = _scheduler()
    await _beat(scheduler, store)
    assert not scheduler.may_reap(store.now)  # just started: it knows nothing yet
    for _ in range(REAP_AFTER_MS // HEARTBEAT_MS):
        store.now += HEARTBEAT_MS
        await _beat(scheduler, store)
    assert scheduler.may_reap(store.now)


async def test_a_gap_in_its_own_heartbeats_restarts_the_count() -> None:
    """Redis down or restarting: this process's beats stopped too, so the others' silence
    over the same stretch says nothing about them."""
    scheduler, store, _ = _scheduler()
    for _ in range(5):
        await _beat(scheduler, store)
        store.now += HEARTBEAT_MS
    assert scheduler.may_reap(store.now)
    store.now += BEAT_GAP_MS + 1  # no heartbeat answered for longer than the gap
    await _beat(scheduler, store)
    assert not scheduler.may_reap(store.now)
    for _ in range(REAP_AFTER_MS // HEARTBEAT_MS - 1):
        store.now += HEARTBEAT_MS
        await _beat(scheduler, store)
        assert not scheduler.may_reap(store.now)
    store.now += HEARTBEAT_MS
    await _beat(scheduler, store)
    assert scheduler.may_reap(store.now)


async def test_a_heartbeat_that_redis_held_restarts_the_count() -> None:
    """Redis stalled: the beat was answered, but only after longer than a beat."""
    scheduler, store, _ = _scheduler()
    for _ in range(5):
        await _beat(scheduler, store)
        store.now += HEARTBEAT_MS
    store.answer_ms = HEARTBEAT_MS + 1
    await _beat(scheduler, store)
    assert not scheduler.may_reap(store.now)


async def test_an_unregistered_heartbeat_restores_the_registrations() -> None:
    scheduler, store, lost = _scheduler()
    await _beat(scheduler, store)
    assert lost == []
    store.unregistered = True
    await _beat(scheduler, store)
    assert lost == ["lost"]


def test_the_reap_limit_is_past_the_gap_and_the_heartbeat() -> None:
    assert HEARTBEAT_MS < BEAT_GAP_MS < REAP_AFTER_MS
    never_beat = Scheduler(cast(Store, BeatingStore()), WaiterRegistry())
    assert not never_beat.may_reap(10**12)


class SweepingStore(BeatingStore):
    """The sweep's scripts, each answered by hand: what was sent, and when."""

    def __init__(self) -> None:
        super().__init__()
        self.promotes: list[asyncio.Future[tuple[int, list[str]]]] = []
        self.expires: list[int] = []  # when each expire() was sent (answered at once)
        self.expire_answer: tuple[int, list[str]] = (-1, [])
        self.schedule_reads = 0

    def exact_ms(self) -> float:
        return float(self.now)

    def trim_events(self) -> None:
        return None

    def promote(self) -> asyncio.Future[tuple[int, list[str]]]:
        call = asyncio.get_running_loop().create_future()
        self.promotes.append(call)
        return call

    def expire(self) -> asyncio.Future[tuple[int, list[str]]]:
        self.expires.append(self.now)
        call = asyncio.get_running_loop().create_future()
        call.set_result(self.expire_answer)
        return call

    def schedules_due(self) -> asyncio.Future[tuple[int, list[Any]]]:
        self.schedule_reads += 1
        call = asyncio.get_running_loop().create_future()
        call.set_result((-1, []))
        return call


async def test_a_sweep_that_may_make_a_job_ready_wakes_the_first_waiter_before_its_reply(
        ) -> None:
    """A sweep at a delayed job's instant wakes the waiter first in line as it goes out (its
    try follows the sweep to Redis); one at a heartbeat's instant with nothing else due
    wakes nobody."""
    store = SweepingStore()
    registry = WaiterRegistry()
    scheduler = Scheduler(cast(Store, store), registry)
    waiter = Waiter(("a",), "t:1")
    registry.register(waiter)
    run = asyncio.ensure_future(scheduler.run())
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(store.promotes) == 1 and waiter.woken  # woken before promote answers
        waiter.rearm()
        store.promotes[0].set_result((-1, ["a"]))  # nothing delayed left: next, a heartbeat
        for _ in range(20):
            await asyncio.sleep(0)
        waiter.rearm()  # (promote's reply woke the tube's first waiter, as it always did)
        store.now += HEARTBEAT_MS
        scheduler._nudge.set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(store.promotes) == 2 and not waiter.woken
        store.promotes[1].set_result((store.now + 500, []))  # a delayed job due in 0.5 s
        for _ in range(20):
            await asyncio.sleep(0)
        store.now += 500
        scheduler._nudge.set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(store.promotes) == 3 and waiter.woken
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


async def _turns() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def _asleep_until_the_beat() -> AsyncIterator[tuple[Scheduler, SweepingStore, Waiter]]:
    """A running scheduler whose first sweep found nothing delayed (it sleeps until the next
    heartbeat), and a waiter registered after that sweep."""
    store = SweepingStore()
    registry = WaiterRegistry()
    scheduler = Scheduler(cast(Store, store), registry)
    run = asyncio.ensure_future(scheduler.run())
    try:
        await _turns()
        store.promotes[0].set_result((-1, []))
        await _turns()
        waiter = Waiter(("a",), "t:1")
        registry.register(waiter)
        yield scheduler, store, waiter
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


async def test_a_note_ahead_of_its_instant_runs_no_script_until_then() -> None:
    """A delayed put due sooner than the current sleep nudges the scheduler, which only
    aims its sleep at the new instant (nothing can be due yet: no script runs, no waiter is
    woken); at the instant the sweep runs promote alone and wakes the first waiter."""
    async with _asleep_until_the_beat() as (scheduler, store, waiter):
        store.now += 10
        scheduler.note_due(store.now + HEARTBEAT_MS // 2, DELAYED)  # a delayed put, in 0.5 s
        await _turns()
        assert len(store.promotes) == 1 and not waiter.woken
        assert scheduler._target_ms == store.now + HEARTBEAT_MS // 2
        expires, reads = len(store.expires), store.schedule_reads
        store.now += HEARTBEAT_MS // 2
        scheduler._nudge.set()
        await _turns()
        assert len(store.promotes) == 2 and waiter.woken
        assert (len(store.expires), store.schedule_reads) == (expires, reads)


async def test_a_failed_sweep_runs_its_scripts_again_and_keeps_the_notes_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A promote that fails (Redis away) leaves its kind due: the sweep after the back-off
    sends it again; a TTR noted during the back-off runs expire with it."""
    monkeypatch.setattr(scheduler_module, "ERROR_BACKOFF_S", 0.05)
    async with _asleep_until_the_beat() as (scheduler, store, _):
        scheduler.note_due(store.now, DELAYED)
        await _turns()
        assert len(store.promotes) == 2
        expires = len(store.expires)
        store.promotes[1].set_exception(ConnectionError("redis away"))
        await _turns()
        scheduler.note_due(store.now, TTR)  # while it backs off
        for _ in range(100):
            if len(store.promotes) == 3:
                break
            await asyncio.sleep(0.01)
        assert len(store.promotes) == 3 and len(store.expires) == expires + 1


async def test_a_sweep_runs_what_is_due_and_a_beat_runs_all() -> None:
    """Each script runs at its own instants: a TTR noted runs expire alone; a heartbeat runs
    all three (other processes' instants are learned there); an instant expire answers
    (a retry a backoff delayed) runs promote too."""
    async with _asleep_until_the_beat() as (scheduler, store, _):
        assert (len(store.promotes), len(store.expires), store.schedule_reads) == (1, 1, 1)
        store.expire_answer = (store.now + 100, [])
        scheduler.note_due(store.now, TTR)
        await _turns()
        assert (len(store.promotes), len(store.expires), store.schedule_reads) == (1, 2, 1)
        store.expire_answer = (-1, [])
        store.now += 100
        scheduler._nudge.set()
        await _turns()
        assert (len(store.promotes), len(store.expires), store.schedule_reads) == (2, 3, 1)
        store.promotes[1].set_result((-1, []))
        await _turns()
        store.now += HEARTBEAT_MS
        scheduler._nudge.set()
        await _turns()
        assert (len(store.promotes), len(store.expires), store.schedule_reads) == (3, 4, 2)


async def test_a_note_of_an_instant_already_come_makes_its_sweep_guess() -> None:
    """A note whose instant has come by the time its sweep runs (a TTR noted late, a clock
    read a moment after) makes that sweep one that may make a job ready: it wakes the first
    waiter as it goes out."""
    async with _asleep_until_the_beat() as (scheduler, store, waiter):
        scheduler.note_due(store.now)  # due now (a note that does not say: every script)
        await _turns()
        assert len(store.promotes) == 2 and waiter.woken
