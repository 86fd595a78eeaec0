"""The waiters' light primitives: Signal (a flag waited on with a bound) and CoarseTimer (many
imprecise timeouts on one loop timer); the registry's routing of a hand-over to a token; and a
Wait taking a job given from a script's reply (no Redis: a store that records its calls).
Bounds here are generous: they only tell "fired" from "never fired"; none asserts a duration."""

from __future__ import annotations

import asyncio
from typing import Any

from tubeq.server.wait import Wait
from tubeq.server.waiters import CoarseTimer, Deadlines, Signal, Waiter, WaiterRegistry
from tubeq.store.store import NoJob, Reservation

# Long enough that a timeout cannot have fired by accident, short enough to keep tests quick.
NEVER_S = 60.0
BOUND_S = 5.0


async def test_a_set_signal_answers_at_once() -> None:
    signal = Signal()
    signal.set()
    assert signal.wait(NEVER_S).done()
    assert signal.is_set()


async def test_set_ends_a_wait_early_and_its_timeout_is_gone() -> None:
    signal, coarse = Signal(), CoarseTimer(resolution_s=0.05)
    waiting = signal.wait(NEVER_S, coarse)
    assert len(coarse) == 1
    asyncio.get_running_loop().call_soon(signal.set)
    await asyncio.wait_for(waiting, BOUND_S)
    assert signal.is_set() and len(coarse) == 0


async def test_a_precise_timeout_ends_the_wait_with_the_flag_clear() -> None:
    signal = Signal()
    await asyncio.wait_for(signal.wait(0.01), BOUND_S)
    assert not signal.is_set()


async def test_a_coarse_timeout_fires_within_one_step_and_leaves_nothing_behind() -> None:
    signal, coarse = Signal(), CoarseTimer(resolution_s=0.05)
    await asyncio.wait_for(signal.wait(0.1, coarse), BOUND_S)
    assert not signal.is_set() and len(coarse) == 0


async def test_coarse_buckets_fire_in_order_and_rearm_for_the_later_ones() -> None:
    coarse = CoarseTimer(resolution_s=0.05)
    loop = asyncio.get_running_loop()
    late: asyncio.Future[None] = loop.create_future()
    early: asyncio.Future[None] = loop.create_future()
    coarse.add(late, 0.3)
    coarse.add(early, 0.05)  # earlier than the armed bucket: the timer is re-armed for it
    await asyncio.wait_for(early, BOUND_S)
    assert not late.done()
    await asyncio.wait_for(late, BOUND_S)
    assert len(coarse) == 0


async def test_a_bucket_emptied_early_lets_its_timer_fire_harmlessly() -> None:
    coarse = CoarseTimer(resolution_s=0.05)
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()
    kept: asyncio.Future[None] = loop.create_future()
    coarse.remove(coarse.add(gone, 0.05), gone)
    coarse.add(kept, 0.2)
    await asyncio.wait_for(kept, BOUND_S)
    assert not gone.done() and len(coarse) == 0


async def test_deadlines_call_back_once_due_and_not_when_discarded() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(resolution_s=0.01)
    fired: list[str] = []
    deadlines.add("due", loop.time() + 0.02, fired.append)
    deadlines.add("discarded", loop.time() + 0.02, fired.append)
    deadlines.add("later", loop.time() + 60, fired.append)
    deadlines.discard("discarded")
    for _ in range(200):  # bounded: the first is due within a few resolutions
        if fired:
            break
        await asyncio.sleep(0.01)
    assert fired == ["due"]
    deadlines.discard("later")


def test_a_hand_over_wakes_every_wait_of_its_token_and_only_while_registered() -> None:
    registry = WaiterRegistry()
    reserve, push, other = Waiter(("a",), "t:1"), Waiter(("b",), "t:1"), Waiter(("a",), "t:2")
    for waiter in (reserve, push, other):
        registry.register(waiter)
    registry.handed_over("t:1")
    assert reserve.woken and push.woken and not other.woken
    registry.unregister(reserve, consumed=True)
    push.rearm()
    registry.handed_over("t:1")
    assert push.woken and not other.woken
    registry.unregister(push, consumed=True)
    registry.unregister(other, consumed=True)
    registry.handed_over("t:1")  # nobody waits under it: nothing to wake, nothing kept
    assert registry.count() == 0 and not registry._by_token


# -- a job given from a script's reply (promote.lua's hand-over; tubeq.server.scheduler) ---------

class _Owner:
    """A connection as a Wait sees it: grants pass through, ``granting`` set by the test."""

    def __init__(self) -> None:
        self.granting = False

    def track_grants(self, call: asyncio.Future[Any]) -> asyncio.Future[Any]:
        return call

    async def within(self, call: asyncio.Future[Any], deadline: float | None) -> Any:
        return await asyncio.shield(call)


class _Store:
    """Records the calls a Wait makes; each answers at once with nothing granted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def _answer(self, name: str, arg: int, result: Any) -> asyncio.Future[Any]:
        self.calls.append((name, arg))
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(result)
        return done

    def set_waiting(self, token: str, delta: int, *, claim: bool = False) -> asyncio.Future[Any]:
        return self._answer("set_waiting", delta, [])

    def reserve(self, token: str, *, counted_waiting: bool = False) -> asyncio.Future[Any]:
        return self._answer("reserve", 1, NoJob())

    def reserve_many(self, token: str, count: int, *,
                     counted_waiting: bool = False) -> asyncio.Future[Any]:
        return self._answer("reserve_many", count, [])


JOB = Reservation(7, 60, b"x", 1_000, 0, "a")


def _wait(registry: WaiterRegistry, owner: _Owner, store: _Store, *,
          handover: bool = True) -> Wait:
    return Wait(registry, store, "t:1", ("a",), owner=owner,  # type: ignore[arg-type]
                handover=handover)


async def test_a_given_job_answers_the_next_try_claim_or_leave_without_redis() -> None:
    registry, owner, store = WaiterRegistry(), _Owner(), _Store()
    wait = _wait(registry, owner, store)
    assert not registry.given("t:1", JOB)  # not counted in: Redis cannot have handed it one
    await wait.count_in()
    for end in ("take", "take_many", "claim", "leave"):
        wait.rearm()
        assert registry.given("t:1", JOB)
        assert wait.woken and not wait.counted and wait.given is JOB
        if end == "take":
            assert await wait.take() is JOB
        elif end == "take_many":
            assert await wait.take(8) == [JOB]
        elif end == "claim":
            assert await wait.claim() == [JOB]
        else:
            left = wait.leave(consumed=True)
            assert left is not None and await left == [JOB]
            break
        assert wait.given is None
        await wait.count_in()
    assert store.calls == [("set_waiting", 1)] * 4  # the count-ins: nothing else went to Redis


async def test_a_given_job_is_refused_where_redis_may_hand_it_again() -> None:
    """Refused (the token's waits are woken instead, and its next try claims the job from
    Redis): while the owner has a call in flight that may claim it, by a wait that takes no
    given job, by a token that waits twice (a blocked reserve and its push loop)."""
    registry, owner, store = WaiterRegistry(), _Owner(), _Store()
    wait = _wait(registry, owner, store)
    await wait.count_in()
    owner.granting = True
    assert not registry.given("t:1", JOB)
    assert wait.woken and wait.counted and wait.given is None
    owner.granting = False
    plain = _wait(WaiterRegistry(), owner, store, handover=False)
    await plain.count_in()
    assert not plain.give(JOB) and plain.counted
    wait.rearm()
    push = Waiter(("a",), "t:1")
    registry.register(push)
    assert not registry.given("t:1", JOB)
    assert wait.woken and push.woken and wait.given is None
