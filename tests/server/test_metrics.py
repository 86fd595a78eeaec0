"""tubeq.server.metrics and the script results that feed it: how long a job waited in ready, how
long its holder held it, how late a delayed job became ready (real Redis, a clock the test
moves)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from time import perf_counter

import pytest

from tests.store.test_lua import ALICE, BOB, Env, open_env
from tubeq.protocol import commands as c
from tubeq.server.metrics import (
    JOB_BUCKETS,
    LATENESS_BUCKETS,
    OTHER_TUBE,
    PENDING_MAX,
    RTT_BUCKETS,
    UNTIMED,
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


# -- replies counted as they are written (Metrics.written) --------------------------------------

Asked = tuple[list[type[c.Command] | None], list[float] | None]


def asked_for(m: Metrics, *kinds: type[c.Command] | None, since: float = UNTIMED) -> Asked:
    """What a connection records as it queues replies to ``kinds`` (one turn at ``since``)."""
    asked, started = m.asked_lists()
    for kind in kinds:
        asked.append(kind)
        if started is not None:
            started.append(since)
    return asked, started


def written(m: Metrics, asked: Asked, out: list[bytes]) -> None:
    m.written("t:1", *asked, out)


def test_written_replies_are_counted_by_command_and_first_word() -> None:
    m = Metrics()
    asked = asked_for(m, c.Put, c.Put, None, c.ReserveWithTimeout, c.Delete, c.Delete, c.Kick,
                      c.KickJob, c.ReserveMany)
    written(m, asked, [b"INSERTED 1\r\n", b"INSERTED 2\r\n", b"PUSHED 1\r\n"])
    assert m.outcomes == {("put", b"INSERTED"): 2}  # the push frame is no command's reply
    assert len(asked[0]) == 6  # the rest wait for their writes
    reserved = b"RESERVED 1 100\r\n" + b"a b\r\n" * 20 + b"\r\n"  # longer than a head
    written(m, asked, [reserved, b"DELETED\r\n", b"NOT_FOUND\r\n", b"KICKED 3\r\n",
                       b"KICKED\r\n", b"BATCH 0\r\n"])
    assert m.outcomes == {("put", b"INSERTED"): 2, ("reserve-with-timeout", b"RESERVED"): 1,
                          ("delete", b"DELETED"): 1, ("delete", b"NOT_FOUND"): 1,
                          ("kick", b"KICKED"): 1, ("kick-job", b"KICKED"): 1,
                          ("reserve-many", b"BATCH"): 1}
    assert m.jobs_kicked == 4
    assert asked == ([], [])


def test_the_http_apis_outcomes_add_to_the_connections() -> None:
    m = Metrics()
    written(m, asked_for(m, c.Put, c.KickJob), [b"INSERTED 1\r\n", b"KICKED\r\n"])
    m.answered("put", b"INSERTED 2\r\n")
    m.answered("kick", b"KICKED 2\r\n")
    assert m.outcomes == {("put", b"INSERTED"): 2, ("kick-job", b"KICKED"): 1,
                          ("kick", b"KICKED"): 1}
    assert m.jobs_kicked == 3


def test_a_reply_written_past_the_bound_after_its_turn_is_a_slow_command() -> None:
    m = Metrics(slow_ms=50)
    now = perf_counter()
    kinds, since = asked_for(m, c.Put, since=now - 0.2)  # its turn began 200 ms ago
    assert since is not None
    kinds.append(c.Delete)
    since.append(now)  # a command of a later turn: 0 ms
    kinds.append(c.ReserveWithTimeout)
    since.append(UNTIMED)  # a reserve, or one that passed a waiting reserve
    written(m, (kinds, since), [b"INSERTED 1\r\n", b"DELETED\r\n", b"TIMED_OUT\r\n"])
    assert m.slow_commands == 1
    written(m, asked_for(m, c.Put, since=perf_counter()), [b"INSERTED 2\r\n"])
    assert m.slow_commands == 1


def test_without_the_slow_log_nothing_is_timed() -> None:
    m = Metrics(slow_ms=0)
    asked = asked_for(m, c.Put)
    assert asked[1] is None
    written(m, asked, [b"INSERTED 1\r\n"])
    assert (m.slow_commands, m.outcomes) == (0, {("put", b"INSERTED"): 1})


def test_the_slow_log_alone_counts_no_outcomes() -> None:
    m = Metrics(slow_ms=50, outcomes=False)
    written(m, asked_for(m, c.Put, since=perf_counter() - 1), [b"INSERTED 1\r\n"])
    assert (m.slow_commands, m.outcomes) == (1, {})


def test_whole_milliseconds_land_where_their_seconds_would() -> None:
    """The hooks bucket the scripts' whole milliseconds as Histogram.observe buckets seconds,
    and sum them exactly: a histogram fed N known values has their count, sum and buckets."""
    values = [*range(0, 4000), 9_999, 10_000, 10_001, 299_999, 3_600_000, 3_600_001, 10**9]
    rtt = Histogram(RTT_BUCKETS)  # bounds under a millisecond too
    by_rtt_seconds = Histogram(RTT_BUCKETS)
    for ms in values:
        rtt.observe_ms(ms)
        by_rtt_seconds.observe(ms / 1000)
    assert rtt.counts == by_rtt_seconds.counts
    m = Metrics()
    for ms in values:
        m.job_reserved("t", ms)
        m.job_deleted("t", ms)
    m.job_reserved("t", -1)  # not from ready: no observation
    m.job_deleted("t", -1)
    by_seconds = Histogram(JOB_BUCKETS)
    for ms in values:
        by_seconds.observe(ms / 1000)
    for family in (m.wait, m.held):
        h = family.by_tube["t"]
        assert h.counts == by_seconds.counts
        assert h.count == len(values)
        assert h.sum_ms == sum(values)
        assert h.sum == sum(values) / 1000
    lateness = Histogram(LATENESS_BUCKETS)
    m.jobs_promoted([-5, 0, 1, 2, 3, 5000, 6000])
    for ms in (0, 0, 1, 2, 3, 5000, 6000):
        lateness.observe(ms / 1000)
    assert m.lateness.counts == lateness.counts and m.lateness.count == 7
    assert m.lateness.sum == pytest.approx(11.006)


@pytest.mark.parametrize("out", [
    [b"INSERTED 1\r\n", b"INSERTED 2\r\n", b"INTERNAL_ERROR\r\n"],
    [b"INSERTED 1\r\n", b"INSERTED\r\n", b"INSERTED 3\r\n"],
    [b"INSERTED 1\r\n", b"INSERTEDX 2\r\n", b"INSERTED 3\r\n"],
    [b"DELETED\r\n", b"DELETED\r\n", b"NOT_FOUND\r\n"],
    [b"DELETED\r\n", b"DELETED\r\n", b"DELETED\r\n"],
    [b"RESERVED 1 9\r\nINSERTED \r\n", b"TIMED_OUT\r\n", b"RESERVED 2 1\r\nx\r\n"],
])
def test_a_writes_replies_count_each_by_its_own_word(out: list[bytes]) -> None:
    """The one-command-and-one-word shortcut of a write counts what the reply-by-reply cut
    counts, whatever the replies' words."""
    shortcut, each = Metrics(), Metrics()
    written(shortcut, asked_for(shortcut, *[c.Put] * len(out)), out)
    for reply in out:
        written(each, asked_for(each, c.Put), [reply])
    assert shortcut.outcomes == each.outcomes
    assert sum(shortcut.outcomes.values()) == len(out)
    mixed = Metrics()  # the same with another command's reply first: no shortcut
    written(mixed, asked_for(mixed, c.Delete, *[c.Put] * len(out)), [b"NOT_FOUND\r\n", *out])
    assert mixed.outcomes == {**each.outcomes, ("delete", b"NOT_FOUND"): 1}


def test_a_tube_named_as_redis_sent_it_is_the_same_tube() -> None:
    m = Metrics(max_tubes=3)
    m.job_deleted(b"work", 3)  # what delete.lua returns: the name's bytes
    m.job_deleted(b"work", 2000)
    m.job_deleted("work", 5)  # decoded
    m.job_deleted(b"other", 1)
    h = m.held.by_tube["work"]
    assert (h.count, h.sum_ms) == (3, 2008)
    assert h.counts[:2] == [0, 2] and h.counts[JOB_BUCKETS.index(2.5)] == 1
    assert set(m.held.by_tube) == {"work", "other"}


def test_the_tube_cap_counts_tubes_not_the_names_they_came_by() -> None:
    """A tube named by its bytes and by its text is one tube of --metrics-max-tubes: the
    next tube still gets a histogram of its own, and past the cap every other tube's goes to
    OTHER_TUBE, whichever name it came by."""
    m = Metrics(max_tubes=2)
    m.job_deleted(b"a", 1)
    m.job_deleted("a", 1)
    m.job_deleted(b"b", 1)
    m.job_deleted(b"c", 1)
    m.job_deleted("d", 1)
    m.job_deleted(b"a", 1)
    counts = {name: h.count for name, h in m.held.by_tube.items()}
    assert counts == {"a": 3, "b": 1, OTHER_TUBE: 2}
    assert m.held.by_tube is m.held.by_tube  # read as it is kept: no copy per read


def test_a_batchs_observations_count_as_one_at_a_time() -> None:
    """jobs_reserved / jobs_deleted (a reserve-many's reservations, a delete_many's replies)
    observe what job_reserved / job_deleted would, one job at a time; a not-deleted id (0) and
    a job not from ready or not reserved (-1) are not observed."""
    waits = [0, 0, 3, 1500, -1, 70_000]
    helds = [[2, b"work"], 0, [2, b"work"], [-1, b"work"], [9_000, b"mail"]]
    batch, each = Metrics(), Metrics()
    batch.jobs_reserved([Reservation(i, 60, b"", 0, ms, "work") for i, ms in enumerate(waits)])
    batch.jobs_deleted(helds)
    for ms in waits:
        each.job_reserved("work", ms)
    for reply in helds:
        if reply:
            each.job_deleted(reply[1], reply[0])
    for family in ("wait", "held"):
        got, want = getattr(batch, family).by_tube, getattr(each, family).by_tube
        assert set(got) == set(want)
        for tube, h in want.items():
            assert (got[tube].counts, got[tube].sum_ms) == (h.counts, h.sum_ms)
    assert batch.wait.by_tube["work"].count == 5
    assert (batch.held.by_tube["work"].count, batch.held.by_tube["mail"].count) == (2, 1)


def test_pending_observations_are_bounded_and_none_is_lost() -> None:
    """Observations wait unfolded up to PENDING_MAX; past it they are folded in at once, and a
    read folds the rest: every one is counted, however many tubes and values."""
    m = Metrics(max_tubes=4)
    total = 0
    for n in range(3 * PENDING_MAX + 5):
        m.job_deleted(f"t{n % 6}", n % 2000)
        total += n % 2000
        assert len(m.held.pending) < PENDING_MAX
    counts = {name: h.count for name, h in m.held.by_tube.items()}
    assert not m.held.pending
    assert sum(counts.values()) == 3 * PENDING_MAX + 5
    assert set(counts) == {"t0", "t1", "t2", "t3", OTHER_TUBE}
    assert sum(h.sum_ms for h in m.held.by_tube.values()) == total
