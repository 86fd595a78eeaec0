"""tubeq.server.metrics and the script results that feed it: how long a job waited in ready, how
long its holder held it, how late a delayed job became ready (real Redis, a clock the test
moves)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.store.test_lua import ALICE, BOB, Env, open_env
from tubeq.protocol import commands as c
from tubeq.server.metrics import (
    OTHER_TUBE,
    Histogram,
    Metrics,
    TubeHistograms,
    command_label,
    reply_word,
)
from tubeq.store.records import Reservation


@pytest.fixture
async def env(redis_url: str) -> AsyncIterator[Env]:
    async with open_env(redis_url, 0) as opened:
        opened.store.metrics = Metrics()
        yield opened


def metrics_of(env: Env) -> Metrics:
    assert env.store.metrics is not None
    return env.store.metrics


# -- the plain-Python parts ---------------------------------------------------------------------

def test_a_histogram_counts_each_value_in_the_first_bucket_it_fits() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 1.0, 7.0):
        h.observe(v)
    assert h.counts == [2, 2, 1]  # le 0.1 (0.1 included), le 1.0, +Inf
    assert h.count == 5
    assert h.sum == pytest.approx(8.65)


def test_tube_labels_past_the_cap_are_summed_under_other() -> None:
    family = TubeHistograms((1.0,), max_tubes=2)
    for tube in ("a", "b", "c", "d", "a"):
        family.observe(tube, 0.5)
    assert set(family.by_tube) == {"a", "b", OTHER_TUBE}
    assert family.by_tube["a"].count == 2
    assert family.by_tube[OTHER_TUBE].count == 2  # c and d


def test_reply_words_are_the_outcome() -> None:
    assert reply_word(b"INSERTED 12\r\n") == b"INSERTED"
    assert reply_word(b"NOT_FOUND\r\n") == b"NOT_FOUND"
    assert reply_word(b"RESERVED 1 5\r\nhello\r\n") == b"RESERVED"


def test_command_labels_are_wire_names() -> None:
    assert command_label(c.Put) == "put"
    assert command_label(c.ReserveWithTimeout) == "reserve-with-timeout"
    assert command_label(c.ReserveJob) == "reserve-job"  # not counted by beanstalkd: no stat
    assert command_label(c.KickJob) == "kick-job"


def test_kicked_jobs_are_counted_from_the_replies() -> None:
    m = Metrics()
    m.answered("kick", b"KICKED 7\r\n")
    m.answered("kick-job", b"KICKED\r\n")
    m.answered("kick", b"KICKED 0\r\n")
    assert m.jobs_kicked == 8
    assert m.outcomes[("kick", b"KICKED")] == 2


def test_without_outcomes_nothing_is_counted() -> None:
    m = Metrics(outcomes=False)
    m.answered("put", b"INSERTED 1\r\n")
    assert m.outcomes == {}


def test_the_cap_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Metrics(max_tubes=0)


# -- what the scripts return ----------------------------------------------------------------

async def test_a_reserve_reports_how_long_the_job_was_ready(env: Env) -> None:
    await env.store.change_watches(ALICE, [("+w", "mail")])
    await env.put("mail")
    env.clock.advance(2.5)
    r = await env.reserve()
    assert (r.waited_ms, r.tube) == (2500, "mail")
    h = metrics_of(env).wait.by_tube["mail"]
    assert (h.count, h.sum) == (1, 2.5)


@pytest.mark.parametrize("route", ["release", "timeout", "kick", "promote"])
async def test_the_wait_starts_when_the_job_last_became_ready(env: Env, route: str) -> None:
    s = env.store
    job_id = await env.put(ttr=5, delay=3 if route == "promote" else 0)
    env.clock.advance(4)
    if route == "promote":
        await s.promote()
    else:
        await env.reserve()
        env.clock.advance(1)
        if route == "release":
            assert await s.release(ALICE, job_id, 0, 0)
        elif route == "timeout":
            env.clock.advance(4)  # the 5 s TTR has run out
            await s.expire()
        else:
            assert await s.bury(ALICE, job_id, 0)
            env.clock.advance(1)
            assert await s.kick_job(job_id)
    env.clock.advance(0.75)
    assert (await env.reserve(BOB)).waited_ms == 750


async def test_a_job_handed_to_a_waiting_connection_reports_its_wait(env: Env) -> None:
    s = env.store
    await s.set_waiting(BOB, 1)
    job_id = await env.put()
    env.clock.advance(3)
    handed = await s.set_waiting(BOB, -1, claim=True)
    assert [(r.id, r.waited_ms, r.tube) for r in handed] == [(job_id, 0, "default")]


async def test_reserve_job_of_a_buried_job_reports_no_wait(env: Env) -> None:
    s = env.store
    job_id = await env.put()
    await env.reserve()
    assert await s.bury(ALICE, job_id, 0)
    r = await s.reserve_job(BOB, job_id)
    assert isinstance(r, Reservation) and r.waited_ms == -1
    assert metrics_of(env).wait.by_tube["default"].count == 1  # the first reserve only


async def test_a_delete_reports_how_long_the_holder_held_the_job(env: Env) -> None:
    s = env.store
    await s.change_watches(ALICE, [("+w", "work")])
    job_id = await env.put("work")
    await env.reserve()
    env.clock.advance(4)
    assert await s.touch(ALICE, job_id)  # a touch does not restart the held time
    env.clock.advance(2)
    assert await s.delete(ALICE, job_id)
    h = metrics_of(env).held.by_tube["work"]
    assert (h.count, h.sum) == (1, 6.0)
    ready = await env.put("work")
    assert await s.delete(BOB, ready)  # not reserved: no held time
    assert not await s.delete(BOB, 999)
    assert metrics_of(env).held.by_tube["work"].count == 1


async def test_delete_many_reports_each_held_jobs_hold(env: Env) -> None:
    """delete_many (delete-many, and a connection's turn of deletes) feeds the same metric."""
    s = env.store
    await s.change_watches(ALICE, [("+w", "work")])
    first, second = await env.put("work"), await env.put("work")
    await env.reserve()
    env.clock.advance(1)
    await env.reserve()
    env.clock.advance(2)
    ready = await env.put("work")
    assert await s.delete_many(ALICE, [first, second, ready, 999]) == [True, True, True, False]
    h = metrics_of(env).held.by_tube["work"]
    assert (h.count, h.sum) == (2, 3.0 + 2.0)  # the ready job had no holder


async def test_promotion_reports_each_jobs_lateness(env: Env) -> None:
    await env.put(delay=1)
    await env.put(delay=2)
    env.clock.advance(2.25)
    assert (await env.store.promote())[1] == ["default"]
    late = metrics_of(env).lateness
    assert late.count == 2
    assert late.sum == pytest.approx(1.25 + 0.25)


async def test_jobs_from_before_these_metrics_report_no_wait_or_hold(env: Env) -> None:
    # A job handed over, or reserved, by an older tubeq has no 'ra' (a rolling upgrade).
    s = env.store
    await s.set_waiting(BOB, 1)
    handed = await env.put()
    await env.raw.hdel(env.keys.job(handed), "ra")
    claimed = await s.set_waiting(BOB, -1, claim=True)
    assert [(r.id, r.waited_ms) for r in claimed] == [(handed, -1)]
    await env.raw.hdel(env.keys.job(handed), "ra")
    assert await s.delete(BOB, handed)
    assert "default" not in metrics_of(env).held.by_tube
