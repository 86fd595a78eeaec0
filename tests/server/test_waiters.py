"""The waiters' light primitives: Signal (a flag waited on with a bound) and CoarseTimer (many
imprecise timeouts on one loop timer); and the registry's routing of a hand-over to a token.
Bounds here are generous: they only tell "fired" from "never fired"; none asserts a duration."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from tubeq.server.reserve_wait import Wait
from tubeq.server.waiters import CoarseTimer, Deadlines, Signal, Waiter, WaiterRegistry
from tubeq.store.base import JobStore
from tubeq.store.records import NoJob, Reservation

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


def test_a_hint_wakes_the_oldest_waiter_of_its_tube_across_watch_lists() -> None:
    """Waiters in lines by watch list: a tube's hint wakes the one that registered first among
    those not awake, whichever line it is in; lines leave their tubes with their last waiter."""
    registry = WaiterRegistry()
    both = ("a", "b")
    first, alone, second = Waiter(both, "t:1"), Waiter(("a",), "t:2"), Waiter(both, "t:3")
    for waiter in (first, alone, second):
        registry.register(waiter)
    assert registry.count() == 3
    woken = []
    for _ in range(3):
        registry.wake_one("a")
        woken += [w for w in (first, alone, second) if w.woken and w not in woken]
    assert woken == [first, alone, second]
    registry.wake_one("a")  # everyone is awake: nothing more to wake
    registry.unregister(first, consumed=True)
    registry.unregister(alone, consumed=True)
    second.rearm()
    registry.wake_one("b")
    assert second.woken
    registry.unregister(second, consumed=True)
    assert registry.count() == 0 and not registry._by_tube and not registry._lines


def test_a_wake_up_not_used_passes_to_the_next_waiter_of_another_line() -> None:
    registry = WaiterRegistry()
    gone, waiting = Waiter(("a", "b"), "t:1"), Waiter(("b",), "t:2")
    registry.register(gone)
    registry.register(waiting)
    registry.wake_one("b")
    assert gone.woken and not waiting.woken
    registry.unregister(gone, consumed=False)  # its client went away before it tried
    assert waiting.woken


def test_a_waiter_that_watches_anew_is_woken_by_its_new_tubes_in_its_old_place() -> None:
    """rewatch (a push connection's watch or ignore while its loop waits): the waiter leaves
    its old line for the new list's, keeping its arrival order."""
    registry = WaiterRegistry()
    first, second = Waiter(("a",), "t1"), Waiter(("b",), "t2")
    registry.register(first)
    registry.register(second)
    registry.rewatch(first, ("a", "b"))
    registry.wake_one("b")
    assert (first.woken, second.woken) == (True, False)  # it came first
    registry.rewatch(first, ("b",))
    first.rearm()
    registry.wake_one("a")  # it watches a no more: nobody to wake
    assert not first.woken and not second.woken
    assert registry.count() == 2


def test_the_first_waiter_of_any_line_is_woken_first() -> None:
    """wake_first (the scheduler's guess as a sweep goes out): the waiter that registered
    first among those not awake, whatever its tubes; then the next one."""
    registry = WaiterRegistry()
    first, second, third = Waiter(("b",), "t:1"), Waiter(("a",), "t:2"), Waiter(("b",), "t:3")
    for waiter in (first, second, third):
        registry.register(waiter)
    registry.wake_first()
    assert [w.woken for w in (first, second, third)] == [True, False, False]
    registry.wake_first()
    assert [w.woken for w in (first, second, third)] == [True, True, False]
    for waiter in (first, second, third):
        registry.unregister(waiter, consumed=True)
    registry.wake_first()  # nobody waits: nothing to wake


def test_a_hint_with_a_count_wakes_that_many_waiters_and_passes_deaf_ones_by() -> None:
    """wake(tube, n), a hint that the tube has n jobs ready: up to n waiters not awake, in
    arrival order, a deaf one (a push loop with no credit) passed by; wake_first too."""
    registry = WaiterRegistry()
    deaf, first, second, third = (Waiter(("a",), f"t:{i}") for i in range(4))
    deaf.deaf = True
    for waiter in (deaf, first, second, third):
        registry.register(waiter)
    registry.wake("a", 2)
    assert [w.woken for w in (deaf, first, second, third)] == [False, True, True, False]
    registry.wake("a", 5)  # more than wait: each once
    assert [w.woken for w in (deaf, first, second, third)] == [False, True, True, True]
    for waiter in (first, second, third):
        registry.unregister(waiter, consumed=True)
    registry.wake_first()
    registry.wake("a", 0)  # a hint from a tubeq that sent no count: one
    assert not deaf.woken


def test_a_wait_that_leaves_with_a_job_passes_on_a_hint_its_try_did_not_see() -> None:
    """A hint that came while the wait's last try was out (the try re-armed it as it went) was
    not used by that try, even one that took a job: leaving, the wait passes it on."""
    registry = WaiterRegistry()
    store = cast(JobStore, object())  # not counted in: leave sends nothing
    wait, behind = Wait(registry, store, "t:1", ("a",)), Waiter(("a",), "t:2")
    registry.register(behind)
    wait.rearm()  # its try goes out
    registry.wake_one("a")  # a second job's hint, while the try is out: it lands on the wait
    assert wait.woken and not behind.woken
    assert wait.leave(consumed=True) is None  # the try took a job
    assert behind.woken
    registry.unregister(behind, consumed=True)


def test_a_wait_woken_by_its_own_connection_passes_nothing_on() -> None:
    """A wake-up by the wait's own connection (a job in its pool, a hand-over) is not a hint:
    a wait that leaves with a job after one wakes nobody else."""
    registry = WaiterRegistry()
    head = Wait(registry, cast(JobStore, object()), "t:1", ("a", "b", "c"))
    others = [Waiter((tube,), f"t:{i}") for i, tube in enumerate("abc", 2)]
    for waiter in others:
        registry.register(waiter)
    head.rearm()
    head.wake()  # the reserve queue: a later reserve's try granted a job, the head takes it
    head.leave(consumed=True)
    assert not any(w.woken for w in others)
    for waiter in others:
        registry.unregister(waiter, consumed=True)


# --- a waiter woken on a guess: the hint of its tube is still its own -----------------------------

def _guessed_pair() -> tuple[WaiterRegistry, Wait, Waiter]:
    """The older waiter watching a and b, woken by the scheduler's guess (its try not sent);
    a younger one watching b alone, asleep."""
    registry = WaiterRegistry()
    older = Wait(registry, cast(JobStore, object()), "t:1", ("a", "b"))
    younger = Waiter(("b",), "t:2")
    registry.register(younger)
    registry.wake_first()
    assert older.woken and older.guessed and not younger.woken
    return registry, older, younger


def _job(tube: str) -> asyncio.Future[Reservation]:
    done: asyncio.Future[Reservation] = asyncio.get_running_loop().create_future()
    done.set_result(Reservation(1, 60, b"x", 0, 0, tube))
    return done


def test_a_hint_goes_to_its_oldest_waiter_even_one_a_guess_woke() -> None:
    """Its try, not sent yet, sees the hint's job: a younger waiter woken as well would race
    it for the job (and win over a wait across shards, which looks before it takes)."""
    registry, older, younger = _guessed_pair()
    registry.wake_one("b")
    assert older.owed == "b" and not younger.woken
    registry.wake_one("b")  # a second job's hint: the older's one try is taken already
    assert younger.woken
    registry.unregister(younger, consumed=True)


def test_a_guess_is_no_jobs_a_guessed_wait_that_leaves_with_a_job_passes_nothing_on() -> None:
    """(The sweep's own PUBLISH wakes waiters for the jobs it made ready.)"""
    _, older, younger = _guessed_pair()
    older.leave(consumed=True)
    assert not younger.woken


def test_a_try_out_and_a_hint_owed_since_are_both_passed_on_when_the_wait_leaves() -> None:
    """Its try went out for b's hint; a guess and a hint of a came while it was out; the
    connection goes away before either is settled: a and b each go to their next waiter."""
    registry, older, younger = _guessed_pair()
    other = Waiter(("a",), "t:3")
    registry.register(other)
    registry.wake_one("b")
    older.rearm()  # its try goes out, for b
    registry.wake_first()  # asleep while its try is out: guessed again
    registry.wake_one("a")
    assert (older.trying_for, older.owed) == ("b", "a")
    older.leave(consumed=True)
    assert younger.woken and other.woken


async def test_a_try_that_raised_leaves_its_hint_to_the_next_try_or_the_next_waiter() -> None:
    registry, older, younger = _guessed_pair()
    registry.wake_one("b")
    older.rearm()
    failed: asyncio.Future[NoJob] = asyncio.get_running_loop().create_future()
    failed.set_exception(ConnectionError("Redis went away"))
    with pytest.raises(ConnectionError):
        await older.took(failed)
    assert older.hinted and older.trying_for is None  # the next try is for it
    older.leave(consumed=False)  # or none comes: the next waiter has it
    assert younger.woken


def test_a_hand_over_passes_on_a_hint_owed() -> None:
    """The next try takes the handed job: b's ready job goes to the younger waiter (no wake-up
    was published for the handed one)."""
    registry, older, younger = _guessed_pair()
    registry.wake_one("b")
    registry.handed_over(older.token)
    assert older.woken and older.owed is None and younger.woken
    registry.wake_one("b")  # nor does the handed-to wait take on another hint
    assert older.owed is None


def test_a_wait_that_stops_watching_the_owed_tube_passes_its_hint_on() -> None:
    registry, older, younger = _guessed_pair()
    registry.wake_one("b")
    registry.rewatch(older, ("a",))
    assert older.owed is None and younger.woken


def test_a_count_hint_counts_a_guessed_waiter_once() -> None:
    registry, older, younger = _guessed_pair()
    third = Waiter(("b",), "t:3")
    registry.register(third)
    registry.wake("b", 2)
    assert older.owed == "b" and younger.woken and not third.woken


async def test_a_guessed_try_that_took_the_hints_job_passes_nothing_on() -> None:
    registry, older, younger = _guessed_pair()
    registry.wake_one("b")
    older.rearm()  # its try goes out
    assert older.trying_for == "b" and older.owed is None
    await older.took(_job("b"))
    assert older.trying_for is None
    older.leave(consumed=True)
    assert not younger.woken


async def test_a_guessed_try_that_found_nothing_passes_nothing_on() -> None:
    """The try went out after the hint's job was ready: nothing found, another took it."""
    registry, older, younger = _guessed_pair()
    registry.wake_one("b")
    older.rearm()
    nothing: asyncio.Future[NoJob] = asyncio.get_running_loop().create_future()
    nothing.set_result(NoJob())
    await older.took(nothing)
    assert not younger.woken and older.trying_for is None


async def test_a_guessed_try_that_took_another_tubes_job_passes_the_hint_on() -> None:
    registry, older, younger = _guessed_pair()
    registry.wake_one("b")
    older.rearm()
    await older.took(_job("a"))  # a better job of a: b's job is still ready
    assert older.hinted and not younger.woken  # as a hint that came while the try was out
    older.leave(consumed=True)
    assert younger.woken


async def test_a_list_grant_without_the_hints_tube_passes_it_on() -> None:
    registry, older, younger = _guessed_pair()
    registry.wake_one("b")
    older.rearm()
    jobs: asyncio.Future[list[Reservation]] = asyncio.get_running_loop().create_future()
    jobs.set_result([(await _job("a"))])
    await older.took(jobs)
    older.leave(consumed=True)
    assert younger.woken


def test_a_guessed_wait_that_leaves_untried_passes_the_hint_on() -> None:
    """With a job of its own (a later reserve's try granted it) or with none."""
    for consumed in (True, False):
        registry, older, younger = _guessed_pair()
        registry.wake_one("b")
        older.leave(consumed=consumed)
        assert younger.woken, consumed


def test_a_wait_whose_try_is_out_when_it_leaves_passes_the_hint_on() -> None:
    """Its try went out and its outcome never came (the reserve was overdue): it may not have
    taken the hint's job."""
    registry, older, younger = _guessed_pair()
    registry.wake_one("b")
    older.rearm()
    older.leave(consumed=False)
    assert younger.woken


def test_a_guessed_wait_gone_deaf_passes_the_hint_on() -> None:
    """A push loop whose credit went before its try: pass_on hands the hint it took on."""
    registry, older, younger = _guessed_pair()
    registry.wake_one("b")
    older.deaf = True
    older.pass_on()
    assert younger.woken and older.owed is None


async def test_a_hint_whose_try_took_another_tubes_job_is_passed_on() -> None:
    """A waiter of a and b woken by b's hint (asleep, no guess) whose try took an a job (a's
    own hint found it awake and nobody else): b's job goes to b's next waiter."""
    registry = WaiterRegistry()
    both = Wait(registry, cast(JobStore, object()), "t:1", ("a", "b"))
    only_b = Waiter(("b",), "t:2")
    registry.register(only_b)
    registry.wake_one("b")
    assert both.woken and both.owed == "b" and not only_b.woken
    registry.wake_one("a")  # nobody else waits on a
    both.rearm()
    await both.took(_job("a"))
    both.leave(consumed=True)
    assert only_b.woken
