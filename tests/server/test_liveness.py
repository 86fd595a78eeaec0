"""When a tubeq process may take another for dead (tubeq.server.scheduler): only after hearing its
own heartbeats answered without a gap for REAP_AFTER_MS, so a silence that was Redis's never
counts; and a heartbeat that finds the process unregistered restores its registrations.

Pure logic against a fake store whose clock the test moves.
"""

from __future__ import annotations

from typing import cast

from tubeq.server.scheduler import BEAT_GAP_MS, HEARTBEAT_MS, REAP_AFTER_MS, Scheduler
from tubeq.server.waiters import WaiterRegistry
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
