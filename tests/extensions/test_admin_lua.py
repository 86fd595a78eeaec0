"""The admin verbs and figures (issue 10 parts 6 and 7) at the Lua level: each script against a
real Redis with a clock the test moves (tests/store/test_lua.py's Env), events on and off.

clear_tube, list_jobs (and its cursor under concurrent puts and deletes), change_pri,
change_delay (re-arming the tube's delay timer), tube_pause (no end, resume, tube lifetime) and
tube_figures (delay histogram, oldest ready age).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from tests.store.test_events import Recorder
from tests.store.test_lua import ALICE, Env, open_env
from tubeq.model import admin
from tubeq.model.events import EventName
from tubeq.model.states import JobState
from tubeq.store.records import NoJob, Reservation
from tubeq.store.store import PAUSE_FOREVER_MS


@pytest.fixture(params=[1000, 0], ids=["events-on", "events-off"])
async def env(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    async with open_env(redis_url, request.param) as opened:
        yield opened


@pytest.fixture
async def events_env(redis_url: str) -> AsyncIterator[Env]:
    async with open_env(redis_url, 1000) as opened:
        yield opened


async def one_of_each(env: Env, tube: str = "default") -> dict[JobState, int]:
    """A job in each state in ``tube`` (the reserved one held by ALICE through reserve-job)."""
    ready = await env.put(tube, pri=5)
    delayed = await env.put(tube, delay=30)
    buried = await env.put(tube)
    reserved = await env.put(tube)
    assert isinstance(await env.store.reserve_job(ALICE, buried), Reservation)
    assert await env.store.bury(ALICE, buried, 0)
    assert isinstance(await env.store.reserve_job(ALICE, reserved), Reservation)
    return {JobState.READY: ready, JobState.DELAYED: delayed, JobState.BURIED: buried,
            JobState.RESERVED: reserved}


async def listed(env: Env, tube: str, state: str, count: int = 1000) -> list[int]:
    page = await env.store.list_jobs(tube, state, None, count)
    assert page is not None
    return [job.id for job in page.jobs]


# -- clear_tube ---------------------------------------------------------------------------------


async def test_clear_all_deletes_every_job_but_the_reserved_and_fixes_the_indexes(
        env: Env) -> None:
    jobs = await one_of_each(env)
    assert await env.store.clear_tube("default", ("ready", "delayed", "buried")) == 3
    for state, job_id in jobs.items():
        expected = JobState.RESERVED if state is JobState.RESERVED else None
        assert await env.state(job_id) is expected
    assert await env.raw.zcard(env.keys.ready_tubes) == 0
    assert await env.raw.zscore(env.keys.timers, "d:default") is None
    counts = await env.store.tube_counts("default")
    assert counts is not None and counts[1:5] == [0, 1, 0, 0]  # ready, reserved, delayed, buried
    # The worker still holds its job and finishes it as usual.
    assert await env.store.delete(ALICE, jobs[JobState.RESERVED])


@pytest.mark.parametrize("state", [JobState.READY, JobState.DELAYED, JobState.BURIED])
async def test_clear_one_state_leaves_the_others(env: Env, state: JobState) -> None:
    jobs = await one_of_each(env)
    assert await env.store.clear_tube("default", (state.value,)) == 1
    for other, job_id in jobs.items():
        assert await env.state(job_id) is (None if other is state else other)


async def test_clear_writes_deleted_with_reason_cleared(events_env: Env) -> None:
    env = events_env
    jobs = await one_of_each(env)
    record = await Recorder.start(env)
    await env.store.clear_tube("default", ("ready", "delayed", "buried"))
    events = await record.new()
    assert sorted(e.id for e in events) == sorted(
        jobs[s] for s in (JobState.READY, JobState.DELAYED, JobState.BURIED))
    assert {(e.event, e.reason, e.tube) for e in events} == {
        (EventName.DELETED.value, "cleared", "default")}


async def test_clear_goes_in_batches_until_the_states_are_empty(env: Env) -> None:
    for _ in range(5):
        await env.put("big")
    assert await env.store.clear_tube_batch("big", ("ready",), limit=2) == (2, False)
    assert await env.store.clear_tube_batch("big", ("ready",), limit=2) == (2, False)
    assert len(await listed(env, "big", "ready")) == 1
    assert await env.store.clear_tube_batch("big", ("ready",), limit=2) == (1, True)
    more = await asyncio.gather(*(env.put("big") for _ in range(admin.CLEAR_BATCH + 300)))
    assert await env.store.clear_tube("big", ("ready",)) == len(more)
    assert "big" not in await env.store.list_tubes()  # nothing references it any more


async def test_clear_a_batch_takes_the_jobs_in_reserve_order(env: Env) -> None:
    low = await env.put("order", pri=9)
    high = await env.put("order", pri=1)
    mid = await env.put("order", pri=5)
    assert await env.store.clear_tube_batch("order", ("ready",), limit=2) == (2, False)
    assert await listed(env, "order", "ready") == [low]
    assert await env.state(high) is None and await env.state(mid) is None


async def test_clear_lets_an_unreferenced_tube_go_and_refuses_a_missing_one(env: Env) -> None:
    await env.put("brief", delay=5)
    assert "brief" in await env.store.list_tubes()
    assert await env.store.clear_tube("brief", ("delayed",)) == 1
    assert "brief" not in await env.store.list_tubes()
    assert await env.store.clear_tube("brief", ("ready",)) is None
    assert await env.store.clear_tube_batch("nowhere", ("ready",)) == (-1, True)


async def test_clear_an_empty_state_of_an_existing_tube_is_zero(env: Env) -> None:
    await env.put(pri=1)
    assert await env.store.clear_tube("default", ("buried",)) == 0


# -- list_jobs ---------------------------------------------------------------------------------


async def test_list_ready_in_reserve_order_with_pages(env: Env) -> None:
    a = await env.put(pri=3)
    b = await env.put(pri=1)
    c = await env.put(pri=3)
    d = await env.put(pri=2)
    page = await env.store.list_jobs("default", "ready", None, 3)
    assert page is not None
    assert [(j.id, j.pri, j.due_ms) for j in page.jobs] == [(b, 1, 0), (d, 2, 0), (a, 3, 0)]
    assert page.next == (3, a)
    rest = await env.store.list_jobs("default", "ready", page.next, 3)
    assert rest == admin.JobPage((admin.ListedJob(c, 3, 0),), None)
    # Exactly one page's worth: no next cursor either.
    whole = await env.store.list_jobs("default", "ready", None, 4)
    assert whole is not None and whole.next is None and len(whole.jobs) == 4


async def test_list_delayed_by_due_time_with_pri_and_due(env: Env) -> None:
    late = await env.put(pri=7, delay=20)
    soon = await env.put(pri=8, delay=10)
    now = env.clock.now_ms
    page = await env.store.list_jobs("default", "delayed", None, 10)
    assert page == admin.JobPage((admin.ListedJob(soon, 8, now + 10_000),
                                  admin.ListedJob(late, 7, now + 20_000)), None)


async def test_list_buried_in_bury_order_and_reserved_of_this_tube_only(env: Env) -> None:
    first, second, elsewhere = await env.put(pri=4), await env.put(pri=2), await env.put("x")
    for job_id in (first, second):
        assert isinstance(await env.store.reserve_job(ALICE, job_id), Reservation)
    assert isinstance(await env.store.reserve_job(ALICE, elsewhere), Reservation)
    assert await env.store.bury(ALICE, second, 2)
    assert await env.store.bury(ALICE, first, 4)
    assert await listed(env, "default", "buried") == [second, first]
    assert await env.store.kick("default", 10) == 2
    assert isinstance(await env.store.reserve_job(ALICE, first), Reservation)
    env.clock.advance(1)
    assert isinstance(await env.store.reserve_job(ALICE, second), Reservation)
    page = await env.store.list_jobs("default", "reserved", None, 10)
    assert page is not None and page.next is None
    deadline = env.clock.now_ms + 60_000
    assert page.jobs == (admin.ListedJob(first, 4, deadline - 1000),
                         admin.ListedJob(second, 2, deadline))
    assert await listed(env, "x", "reserved") == [elsewhere]


async def test_list_reserved_pages_examine_a_bounded_part_of_the_index(env: Env) -> None:
    budget = admin.LIST_SCAN_BUDGET
    others = await asyncio.gather(*(env.put("other") for _ in range(budget)))
    mine = await env.put("mine")
    for job_id in [*others, mine]:
        assert isinstance(await env.store.reserve_job(ALICE, job_id), Reservation)
    # The first page walks the other tube's reservations only: short, with a cursor.
    page = await env.store.list_jobs("mine", "reserved", None, 10)
    assert page is not None and page.jobs == () and page.next is not None
    rest = await env.store.list_jobs("mine", "reserved", page.next, 10)
    assert rest is not None and [j.id for j in rest.jobs] == [mine] and rest.next is None


async def test_a_cursor_survives_the_deletion_of_its_own_job(env: Env) -> None:
    ids = [await env.put(pri=1) for _ in range(6)]
    page = await env.store.list_jobs("default", "ready", None, 3)
    assert page is not None and page.next == (1, ids[2])
    assert await env.store.delete(ALICE, ids[2])
    assert await env.store.delete(ALICE, ids[3])
    rest = await env.store.list_jobs("default", "ready", page.next, 10)
    assert rest is not None and [j.id for j in rest.jobs] == ids[4:]


async def test_list_of_a_missing_tube_is_none(env: Env) -> None:
    assert await env.store.list_jobs("nowhere", "ready", None, 10) is None


@pytest.mark.parametrize("state", ["ready", "delayed", "buried"])
async def test_the_cursor_under_concurrent_puts_and_deletes(events_env: Env, state: str) -> None:
    """A walk while jobs come and go: no job twice, and every job that was there throughout
    (never deleted) is listed."""
    env = events_env
    rng = random.Random(f"cursor-{state}")

    async def new_job() -> int:
        pri = rng.choice([0, 5, 5, 5, 1024, 4294967295])
        job_id = await env.put("walk", pri=pri, delay=rng.choice([1, 2, 3]) * 60
                               if state == "delayed" else 0)
        if state == "buried":
            assert isinstance(await env.store.reserve_job(ALICE, job_id), Reservation)
            assert await env.store.bury(ALICE, job_id, pri)
        return job_id

    alive = [await new_job() for _ in range(120)]
    throughout = set(alive)
    seen: list[int] = []
    cursor: tuple[int, int] | None = None
    while True:
        page = await env.store.list_jobs("walk", state, cursor, 7)
        assert page is not None
        seen += [job.id for job in page.jobs]
        for _ in range(rng.randint(0, 4)):  # churn between pages
            if rng.random() < 0.5 and alive:
                gone = alive.pop(rng.randrange(len(alive)))
                throughout.discard(gone)
                assert await env.store.delete(ALICE, gone)
            else:
                alive.append(await new_job())
        cursor = page.next
        if cursor is None:
            break
    assert len(seen) == len(set(seen))
    assert throughout <= set(seen)


# -- change_pri --------------------------------------------------------------------------------


async def test_change_pri_reorders_reserves_and_the_ready_index(events_env: Env) -> None:
    env = events_env
    first = await env.put(pri=10)
    second = await env.put(pri=20)
    record = await Recorder.start(env)
    assert await env.store.change_pri(second, 5)
    assert await env.raw.zrange(env.keys.ready_tubes, 0, -1, withscores=True) == [
        (_entry(second).encode(), 5.0)]
    (event,) = await record.new()
    assert (event.event, event.id, event.pri) == (EventName.REPRIORITIZED.value, second, 5)
    assert (await env.reserve()).id == second
    # Demoting the head hands the index to the job now best.
    third = await env.put(pri=15)
    assert await env.store.change_pri(first, 99)
    assert (await env.reserve()).id == third
    assert (await env.reserve()).id == first
    info = await env.store.job_info(first)
    assert info is not None and info.pri == 99


def _entry(job_id: int) -> str:
    digits = str(job_id)
    return chr(64 + len(digits)) + digits + ":default"


async def test_change_pri_of_delayed_buried_and_reserved_jobs_applies_when_ready(
        env: Env) -> None:
    jobs = await one_of_each(env)  # the ready one has pri 5, the others 0
    for state in (JobState.DELAYED, JobState.BURIED, JobState.RESERVED):
        assert await env.store.change_pri(jobs[state], 7)
    # Delayed: comes due with the new priority; buried: kicked with it; reserved: back with it.
    env.clock.advance(31)
    await env.store.promote()
    assert await env.store.kick("default", 1) == 1
    env.clock.advance(60)
    await env.store.expire()
    order = [(await env.reserve()).id for _ in range(4)]
    assert order == [jobs[JobState.READY], *sorted(
        jobs[s] for s in (JobState.DELAYED, JobState.BURIED, JobState.RESERVED))]


async def test_change_pri_wakes_waiters_when_it_touches_the_best_job(
        env: Env) -> None:
    pubsub = env.raw.pubsub()
    await pubsub.psubscribe(env.keys.wake_pattern)
    await pubsub.get_message(timeout=1)
    head = await env.put(pri=1)
    other = await env.put(pri=2)
    await env.store.pause("default", 60)
    await env.store.set_waiting(ALICE, 1)
    assert await env.store.change_pri(head, 3)  # other is now the best: a wake-up
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["channel"] == env.keys.wake_channel("default").encode()
    assert await env.store.change_pri(head, 4)  # neither was nor is the best: none
    assert await pubsub.get_message(timeout=0.2) is None
    assert await env.store.change_pri(other, 0)  # the best, still the best: a wake-up
    assert await pubsub.get_message(timeout=2) is not None
    await env.store.set_waiting(ALICE, -1)
    await pubsub.aclose()


async def test_change_pri_of_a_missing_job_is_false(env: Env) -> None:
    assert not await env.store.change_pri(424242, 1)


# -- change_delay ------------------------------------------------------------------------------


async def test_change_delay_rearms_the_tube_timer_earlier_and_later(env: Env) -> None:
    job_id = await env.put(delay=100)
    now = env.clock.now_ms
    assert await env.raw.zscore(env.keys.timers, "d:default") == now + 100_000
    assert await env.store.change_delay(job_id, 2500) == now + 2500
    assert await env.raw.zscore(env.keys.timers, "d:default") == now + 2500
    env.clock.now_ms = now + 2499
    await env.store.promote()
    assert await env.state(job_id) is JobState.DELAYED
    # Postponed: the timer follows the (new) earliest due job.
    other = await env.put(delay=10)
    assert await env.store.change_delay(job_id, 60_000) == env.clock.now_ms + 60_000
    assert await env.raw.zscore(env.keys.timers, "d:default") == env.clock.now_ms + 10_000
    env.clock.advance(10)
    await env.store.promote()
    assert await env.state(other) is JobState.READY
    assert await env.state(job_id) is JobState.DELAYED
    assert await env.raw.zscore(env.keys.timers, "d:default") == env.clock.now_ms + 50_000
    env.clock.advance(50)
    await env.store.promote()
    assert await env.state(job_id) is JobState.READY
    assert await env.raw.zscore(env.keys.timers, "d:default") is None


async def test_change_delay_sets_stats_job_delay_and_time_left(env: Env) -> None:
    job_id = await env.put(delay=100)
    await env.store.change_delay(job_id, 7_500)
    info = await env.store.job_info(job_id)
    assert info is not None and (info.delay, info.due_ms) == (7, env.clock.now_ms + 7_500)
    await env.store.change_delay(job_id, 999)
    info = await env.store.job_info(job_id)
    assert info is not None and info.delay == 0


async def test_change_delay_to_zero_makes_the_job_ready_at_once(events_env: Env) -> None:
    env = events_env
    job_id = await env.put(pri=3, delay=100)
    record = await Recorder.start(env)
    assert await env.store.change_delay(job_id, 0) == -1
    assert await env.state(job_id) is JobState.READY
    assert await env.raw.zscore(env.keys.timers, "d:default") is None
    rescheduled, promoted = await record.new()
    now = env.clock.now_ms
    assert (rescheduled.event, rescheduled.delay_ms, rescheduled.due_ms) == (
        EventName.RESCHEDULED.value, 0, now)
    assert (promoted.event, promoted.pri, promoted.due_ms) == (EventName.PROMOTED.value, 3, now)
    assert (await env.reserve()).id == job_id


async def test_change_delay_writes_rescheduled(events_env: Env) -> None:
    env = events_env
    job_id = await env.put(delay=100)
    record = await Recorder.start(env)
    await env.store.change_delay(job_id, 1234)
    (event,) = await record.new()
    assert (event.event, event.id, event.delay_ms, event.due_ms) == (
        EventName.RESCHEDULED.value, job_id, 1234, env.clock.now_ms + 1234)


async def test_change_delay_of_a_job_not_delayed_is_refused(env: Env) -> None:
    jobs = await one_of_each(env)
    for state in (JobState.READY, JobState.BURIED, JobState.RESERVED):
        assert await env.store.change_delay(jobs[state], 5) == 0
        assert await env.state(jobs[state]) is state
    assert await env.store.change_delay(424242, 5) == 0


# -- tube_pause --------------------------------------------------------------------------------


async def test_a_pause_with_no_end_holds_reserves_until_resumed(env: Env) -> None:
    job_id = await env.put()
    assert await env.store.tube_pause("default", forever=True)
    assert await env.store.reserve(ALICE) == NoJob()
    assert await env.raw.zscore(env.keys.timers, "p:default") is None
    env.clock.advance(10 * 365 * 86400)  # ten years
    await env.store.promote()
    assert await env.store.reserve(ALICE) == NoJob()
    counts = await env.store.tube_counts("default")
    assert counts is not None
    assert counts[11] == 2**32 - 1
    assert counts[12] - env.clock.now_ms == (2**32) * 1000  # shown as 4294967295 s left
    assert await env.store.tube_pause("default", forever=False)
    assert (await env.reserve()).id == job_id


async def test_pause_tube_replaces_a_pause_with_no_end_and_the_reverse(env: Env) -> None:
    job_id = await env.put()
    assert await env.store.tube_pause("default", forever=True)
    assert await env.store.pause("default", 5) == env.clock.now_ms + 5000
    env.clock.advance(5)
    await env.store.promote()
    assert (await env.reserve()).id == job_id
    await env.store.pause("default", 5)
    assert await env.store.tube_pause("default", forever=True)
    assert await env.raw.zscore(env.keys.timers, "p:default") is None
    env.clock.advance(6)
    await env.store.promote()
    await env.store.release(ALICE, job_id, 0, 0)
    assert await env.store.reserve(ALICE) == NoJob()
    assert await env.store.pause("default", 0) == -1  # pause-tube 0 resumes it too
    assert (await env.reserve()).id == job_id


async def test_a_tube_paused_with_no_end_outlives_its_last_job_until_resumed(env: Env) -> None:
    job_id = await env.put("held")
    assert await env.store.tube_pause("held", forever=True)
    assert await env.store.delete(ALICE, job_id)
    assert "held" in await env.store.list_tubes()  # beanstalkd would have destroyed it
    assert await env.raw.hget(env.keys.tube("held"), "pause_until") == str(
        PAUSE_FOREVER_MS).encode()
    assert await env.store.tube_pause("held", forever=False)
    assert "held" not in await env.store.list_tubes()
    # pause-tube 0 ends such a pause too, and lets the tube go as tube-resume does.
    job_id = await env.put("held")
    assert await env.store.tube_pause("held", forever=True)
    assert await env.store.delete(ALICE, job_id)
    assert await env.store.pause("held", 0) == -1
    assert "held" not in await env.store.list_tubes()
    # A timed pause does not keep a tube (beanstalkd's rule, unchanged).
    job_id = await env.put("timed")
    await env.store.pause("timed", 100)
    assert await env.store.delete(ALICE, job_id)
    assert "timed" not in await env.store.list_tubes()


async def test_resume_of_a_tube_not_paused_is_harmless_and_a_missing_tube_is_false(
        env: Env) -> None:
    job_id = await env.put()
    assert await env.store.tube_pause("default", forever=False)
    assert (await env.reserve()).id == job_id
    assert not await env.store.tube_pause("nowhere", forever=True)
    assert not await env.store.tube_pause("nowhere", forever=False)


# -- tube_figures ------------------------------------------------------------------------------


async def test_delay_histogram_counts_by_time_left(env: Env) -> None:
    minute, hour, day = 60, 3600, 86400
    delays = [1, 59, minute, 9 * minute, 10 * minute, 45 * minute, 2 * hour, 12 * hour,
              3 * day, 8 * day, 30 * day, 40 * day, 4294967295]
    for delay in delays:
        await env.put("hist", delay=delay)
    figures = await env.store.tube_figures("hist")
    assert figures is not None
    assert dict(zip(admin.FIGURE_KEYS, figures.delayed, strict=False)) == {
        "delayed-under-1m": 2, "delayed-1m-10m": 2, "delayed-10m-30m": 1, "delayed-30m-1h": 1,
        "delayed-1h-6h": 1, "delayed-6h-1d": 1, "delayed-1d-7d": 1, "delayed-7d-30d": 1,
        "delayed-over-30d": 3}
    # Time passes: the same jobs are closer to due (an overdue one stays in the first bucket).
    env.clock.advance(2 * hour)
    figures = await env.store.tube_figures("hist")
    assert figures is not None and figures.delayed == (7, 0, 0, 0, 0, 1, 1, 2, 2)
    assert sum(figures.delayed) == len(delays)


async def test_oldest_ready_age_looks_past_the_most_urgent_job(env: Env) -> None:
    assert (await env.store.tube_figures("default")) == admin.TubeFigures((0,) * 9, None)
    start = env.clock.now_ms
    await env.put(pri=100)  # the oldest, but the least urgent
    env.clock.advance(5)
    await env.put(pri=1)
    await env.put(pri=50)
    env.clock.advance(2.5)
    figures = await env.store.tube_figures("default")
    assert figures is not None and figures.oldest_ready_ms == start
    assert figures.stats_keys(env.clock.now_ms)[-1] == ("oldest-ready-age-ms", 7500)
    assert await env.store.tube_figures("nowhere") is None


async def test_oldest_ready_age_visits_at_most_the_configured_levels(env: Env) -> None:
    levels = admin.OLDEST_READY_LEVELS
    oldest = env.clock.now_ms
    await env.put(pri=levels + 1)  # beyond the levels visited
    env.clock.advance(1)
    for pri in range(levels):
        await env.put(pri=pri)
    figures = await env.store.tube_figures("default")
    assert figures is not None and figures.oldest_ready_ms == oldest + 1000
