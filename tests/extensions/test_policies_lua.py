"""Job policies and deduplicated put in the Lua state machine, on a real Redis with a clock the
test moves: max tries (through TTR timeouts, releases and disconnects), the retry backoff
schedule, TTL expiry in every state, millisecond delays, dedupe keys and their lifetime."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.store.test_lua import ALICE, BOB, Env, open_env
from tubeq.model.events import Event
from tubeq.model.options import Options
from tubeq.model.policies import POLICY_TRANSITIONS, backoff_delay, jitter
from tubeq.model.states import JobState
from tubeq.redisio.client import RedisClient
from tubeq.store.records import HANDED_BACK_EXPIRED, JobInfo, JobPolicies, PutOutcome, Reservation
from tubeq.store.scripts import expand
from tubeq.store.store import Store


@pytest.fixture(params=[1000, 0], ids=["events-on", "events-off"])
async def env(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    async with open_env(redis_url, request.param) as opened:
        yield opened


async def put_with(env: Env, *opts: tuple[str, int | str], tube: str = "default",
                   ttr: int = 1, delay: int = 0) -> int:
    outcome = await env.store.put_with(tube, 0, delay, ttr, b"body", tuple(opts))
    assert outcome.inserted, outcome
    return outcome.id


async def info(env: Env, job_id: int) -> JobInfo:
    job = await env.store.job_info(job_id)
    assert job is not None
    return job


async def policies(env: Env, job_id: int) -> JobPolicies:
    p = await env.store.job_policies(job_id)
    assert p is not None
    return p


async def time_out(env: Env, job_id: int) -> None:
    """Reserve the job (ALICE), let its TTR of 1 s run out, sweep."""
    r = await env.reserve()
    assert r.id == job_id
    env.clock.advance(1)
    await env.store.expire()


async def events(env: Env) -> list[Event]:
    entries = await env.raw.xrange(env.keys.events, "-", "+")
    return [Event.from_entry(sid, fields) for sid, fields in entries]


# -- max tries -----------------------------------------------------------------------------------


async def test_max_tries_reached_through_ttr_timeouts_buries_with_a_reason(env: Env) -> None:
    job_id = await put_with(env, ("max-tries", 2))
    await time_out(env, job_id)
    assert (await info(env, job_id)).state == "ready"
    await time_out(env, job_id)
    job = await info(env, job_id)
    assert (job.state, job.timeouts, job.buries) == ("buried", 2, 1)
    assert await policies(env, job_id) == JobPolicies("max-tries", 2, 2, 0, "")
    assert await env.store.tube_policy_counts("default") == [0, 1, 0, 0, 0, 0, 0]
    _, named = await env.store.server_counts()
    assert named["job-timeouts"] == 2  # still beanstalkd's timeouts
    if env.store.events_maxlen:
        last = (await events(env))[-1]
        assert (last.event, last.reason, last.id) == ("buried", "max-tries", job_id)


async def test_max_tries_reached_through_releases_from_the_tube_setting(env: Env) -> None:
    job_id = await env.put("work")
    # Set after the put: the tube's value is read when the check runs.
    await env.store.set_tube("work", (("max-tries", 2),))
    await env.store.change_watches(ALICE, [("+w", "work")])
    for expected in ("ready", "buried"):
        r = await env.reserve()
        assert r.id == job_id
        assert await env.store.release(ALICE, job_id, 7, 0)  # RELEASED, whatever happened
        job = await info(env, job_id)
        assert job.state == expected
    assert (job.releases, job.pri) == (2, 7)
    assert await policies(env, job_id) == JobPolicies("max-tries", 2, 2, 0, "")
    assert await env.store.tube_policy_counts("work") == [0, 1, 0, 0, 0, 0, 0]


async def test_a_delayed_release_at_max_tries_is_buried_not_delayed(env: Env) -> None:
    job_id = await put_with(env, ("max-tries", 1))
    await env.reserve()
    assert await env.store.release(ALICE, job_id, 0, 30)
    assert (await info(env, job_id)).state == "buried"
    assert await env.raw.zcard(env.keys.delayed("default")) == 0


async def test_a_disconnect_ends_a_try(env: Env) -> None:
    job_id = await put_with(env, ("max-tries", 1))
    await env.reserve()
    assert await env.store.disconnect(ALICE, False, True, [job_id]) == 1
    job = await info(env, job_id)
    assert (job.state, job.timeouts) == ("buried", 0)  # not a timeout in beanstalkd's counters
    assert (await policies(env, job_id)).tries == 1


async def test_a_jobs_own_max_tries_wins_over_its_tubes(env: Env) -> None:
    await env.store.set_tube("default", (("max-tries", 1),))
    unlimited = await put_with(env, ("max-tries", 0))
    await time_out(env, unlimited)
    assert (await info(env, unlimited)).state == "ready"
    assert await policies(env, unlimited) == JobPolicies("", 1, 0, 0, "")
    assert await env.store.delete(ALICE, unlimited)
    limited = await env.put(ttr=1)
    assert (await policies(env, limited)).max_tries == 1  # the tube's, shown
    await time_out(env, limited)
    assert (await info(env, limited)).state == "buried"


async def test_a_kicked_dead_letter_gets_one_more_try(env: Env) -> None:
    job_id = await put_with(env, ("max-tries", 1))
    await time_out(env, job_id)
    assert await env.store.kick_job(job_id)
    await time_out(env, job_id)
    job = await info(env, job_id)
    assert (job.state, job.kicks, job.buries) == ("buried", 1, 2)


# -- retry backoff -------------------------------------------------------------------------------


async def test_backoff_schedule_is_exponential_jittered_and_capped(env: Env) -> None:
    job_id = await put_with(env, ("backoff-ms", 1000), ("backoff-max-ms", 5000), ttr=1)
    for tries in range(1, 7):
        r = await env.reserve()
        assert r.id == job_id
        env.clock.advance(1)
        next_due, woken = await env.store.expire()
        delay = backoff_delay(job_id, tries, 1000, 5000)
        base = min(5000, 1000 * 2 ** (tries - 1))
        assert base // 2 <= delay <= base
        job = await info(env, job_id)
        assert (job.state, job.due_ms) == ("delayed", env.clock.now_ms + delay)
        assert woken == [] and next_due == job.due_ms  # the scheduler wakes for the retry
        env.clock.now_ms += delay - 1
        await env.store.promote()
        assert (await info(env, job_id)).state == "delayed"
        env.clock.now_ms += 1
        await env.store.promote()
        assert (await info(env, job_id)).state == "ready"
    if env.store.events_maxlen:
        retries = [e for e in await events(env) if e.event == "timed-out"]
        assert [(e.delay_ms, e.due_ms - e.time_ms) for e in retries] == [
            (backoff_delay(job_id, n, 1000, 5000),) * 2 for n in range(1, 7)]


async def test_backoff_applies_to_timeouts_and_disconnects_not_releases(env: Env) -> None:
    await env.store.set_tube("default", (("backoff-ms", 500),))
    job_id = await env.put(ttr=1)
    await env.reserve()
    assert await env.store.release(ALICE, job_id, 0, 0)
    assert (await info(env, job_id)).state == "ready"
    await env.reserve()
    await env.store.disconnect(ALICE, False, True, [job_id])
    job = await info(env, job_id)
    assert (job.state, job.due_ms) == (
        "delayed", env.clock.now_ms + backoff_delay(job_id, 2, 500))


async def test_the_lua_jitter_is_the_python_jitter(env: Env) -> None:
    probe = expand('--- @include "keys"\n--- @include "events"\n--- @include "jobs"\n'
                   '--- @include "policies"\n'
                   "local out = {}\n"
                   "for i = 1, #ARGV, 4 do\n"
                   "  out[#out + 1] = tostring(backoff_delay(ARGV[i], tonumber(ARGV[i + 1]),"
                   " tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])))\n"
                   "end\nreturn out")
    cases = [(1, 1, 1000, 0), (7, 3, 250, 0), (123456789012, 40, 1, 0), (2**31 - 1, 2, 100, 150),
             (2**40 + 3, 60, 4_294_967_295_000, 0), (99, 4, 3, 10)]
    flat = [x for case in cases for x in case]
    got = await env.raw.eval(probe, 1, env.keys.root, *flat)
    assert [int(float(v)) for v in got] == [backoff_delay(*case) for case in cases]
    assert len({jitter(i, 1) for i in range(1, 200)}) == 199  # spread, not one value


# -- TTL -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["ready", "delayed", "buried"])
async def test_ttl_expiry_buries_with_reason_expired_in_any_state(env: Env, state: str) -> None:
    job_id = await put_with(env, ("ttl-ms", 1500), delay=60 if state == "delayed" else 0)
    if state == "buried":
        await env.reserve()
        assert await env.store.bury(ALICE, job_id, 0)
    expires = env.clock.now_ms + 1500
    assert (await policies(env, job_id)).expires_at_ms == expires
    env.clock.now_ms = expires - 1
    next_due, _ = await env.store.promote()
    assert (await info(env, job_id)).state == state
    assert next_due == expires
    env.clock.now_ms = expires
    await env.store.promote()
    job = await info(env, job_id)
    assert job.state == "buried"
    p = await policies(env, job_id)
    if state == "buried":  # buried by its worker: it stays as it is
        assert (p.reason, job.buries) == ("", 1)
    else:
        assert (p.reason, p.expires_at_ms, job.buries) == ("expired", 0, 1)
        assert await env.store.tube_policy_counts("default") == [1, 0, 0, 0, 0, 0, 0]
    assert await env.raw.zcard(env.keys.ttl) == 0


@pytest.mark.parametrize("state", ["ready", "delayed", "buried"])
async def test_ttl_expiry_deletes_with_on_expire_delete(env: Env, state: str) -> None:
    await env.store.set_tube("short", (("on-expire", "delete"),))
    job_id = await put_with(env, ("ttl-ms", 100), ("key", "k1"), tube="short",
                            delay=60 if state == "delayed" else 0)
    if state == "buried":
        await env.store.change_watches(ALICE, [("+w", "short")])
        await env.reserve()
        assert await env.store.bury(ALICE, job_id, 0)
    env.clock.advance(0.1)
    await env.store.promote()
    assert await env.store.job_info(job_id) is None
    assert await env.store.peek_key("k1") is None  # the key is free again
    if env.store.events_maxlen:
        last = (await events(env))[-1]
        assert (last.event, last.id, last.tube) == ("expired", job_id, "short")
    assert await env.raw.zcard(env.keys.ttl) == 0


async def test_a_reserved_job_expires_when_its_reservation_ends(env: Env) -> None:
    job_id = await put_with(env, ("ttl-ms", 500), ttr=2)
    await env.reserve()
    env.clock.advance(1)
    await env.store.promote()
    assert (await info(env, job_id)).state == "reserved"  # its worker may still finish it
    assert await env.raw.zcard(env.keys.ttl) == 0  # not swept again and again
    env.clock.advance(1)
    await env.store.expire()
    job = await info(env, job_id)
    assert (job.state, (await policies(env, job_id)).reason) == ("buried", "expired")


async def test_a_reserved_job_past_its_ttl_released_expires(env: Env) -> None:
    job_id = await put_with(env, ("ttl-ms", 500), ("on-expire", "delete"), ttr=5)
    await env.reserve()
    env.clock.advance(1)
    assert await env.store.release(ALICE, job_id, 0, 0)
    assert await env.store.job_info(job_id) is None


@pytest.mark.parametrize("end", ["hand-back", "disconnect at shutdown"])
async def test_a_reservation_that_ends_without_a_try_past_the_ttl_expires(env: Env,
                                                                          end: str) -> None:
    """hand-back and a stopping process's disconnect count no try, but a job past its TTL
    still expires (the sweep skipped it while it was reserved: it would never expire)."""
    job_id = await put_with(env, ("ttl-ms", 500), ("on-expire", "delete"), ttr=5)
    await env.reserve()
    env.clock.advance(1)
    await env.store.promote()  # the TTL sweep: reserved, left to the end of its reservation
    if end == "hand-back":
        assert await env.store.hand_back(ALICE, job_id) == HANDED_BACK_EXPIRED
    else:
        assert await env.store.disconnect(ALICE, False, True, [job_id], shutdown=True) == 1
    assert await env.store.job_info(job_id) is None


async def test_a_reservation_that_ends_without_a_try_counts_none(env: Env) -> None:
    first = await put_with(env, ("max-tries", 1))
    second = await put_with(env, ("max-tries", 1))
    assert (await env.reserve()).id == first
    assert await env.store.hand_back(ALICE, first) == 1
    assert (await env.reserve()).id == first
    assert (await env.reserve()).id == second
    assert await env.store.disconnect(ALICE, False, True, [first, second], shutdown=True) == 2
    for job_id in (first, second):
        assert ((await info(env, job_id)).state, (await policies(env, job_id)).tries) == (
            "ready", 0)


async def test_the_tubes_ttl_is_read_at_put_time(env: Env) -> None:
    before = await env.put("ttl-tube")
    await env.store.set_tube("ttl-tube", (("ttl-ms", 1000),))
    after = await env.put("ttl-tube")
    assert (await policies(env, before)).expires_at_ms == 0
    assert (await policies(env, after)).expires_at_ms == env.clock.now_ms + 1000
    env.clock.advance(1)
    await env.store.promote()
    assert [(await info(env, j)).state for j in (before, after)] == ["ready", "buried"]


async def test_deleting_a_job_drops_its_ttl_entry(env: Env) -> None:
    job_id = await put_with(env, ("ttl-ms", 1000))
    assert await env.store.delete(ALICE, job_id)
    assert await env.raw.zcard(env.keys.ttl) == 0
    env.clock.advance(2)
    next_due, _ = await env.store.promote()
    assert next_due == -1  # the 'x:' timer went with the sweep that found nothing
    assert await env.raw.zcard(env.keys.timers) == 0


# -- millisecond delays --------------------------------------------------------------------------


async def test_delay_ms_is_exact_to_the_millisecond(env: Env) -> None:
    job_id = await put_with(env, ("delay-ms", 250))
    job = await info(env, job_id)
    assert (job.state, job.delay, job.due_ms) == ("delayed", 0, env.clock.now_ms + 250)
    env.clock.now_ms += 249
    next_due, _ = await env.store.promote()
    assert next_due == job.due_ms
    assert (await info(env, job_id)).state == "delayed"
    env.clock.now_ms += 1
    assert (await env.store.promote())[1] == ["default"]
    assert (await env.reserve()).id == job_id
    longer = await put_with(env, ("delay-ms", 2500))
    assert (await info(env, longer)).delay == 2  # stats-job's delay: whole seconds


# -- dedupe --------------------------------------------------------------------------------------


async def test_a_duplicate_put_answers_the_living_jobs_id_and_enqueues_nothing(env: Env) -> None:
    first = await put_with(env, ("key", "order:42"), tube="orders")
    again = await env.store.put_with("other", 5, 0, 9, b"other", (("key", "order:42"),))
    assert again == PutOutcome(first, inserted=False)
    assert await env.store.peek_key("order:42") == (first, b"body")
    assert await env.put() == first + 1  # no id was used up by the duplicate
    assert await env.raw.exists(env.keys.tube("other")) == 0  # nor a tube made
    assert await env.store.tube_policy_counts("orders") == [0, 0, 1, 0, 0, 0, 0]
    assert (await policies(env, first)).key == "order:42"
    if env.store.events_maxlen:
        dedup = [e for e in await events(env) if e.event == "deduplicated"]
        assert [(e.id, e.tube) for e in dedup] == [(first, "orders")]


async def test_the_key_is_freed_when_the_job_is_deleted_not_when_buried(env: Env) -> None:
    first = await put_with(env, ("key", "k"), ("max-tries", 1))
    await time_out(env, first)  # dead-lettered: it still lives
    assert not (await env.store.put_with("default", 0, 0, 1, b"x", (("key", "k"),))).inserted
    assert await env.store.delete(ALICE, first)
    assert await env.store.peek_key("k") is None
    second = await put_with(env, ("key", "k"))
    assert second != first
    assert await env.store.peek_key("k") == (second, b"body")


async def test_two_processes_racing_the_same_key_insert_once(env: Env, redis_url: str) -> None:
    clients = [await RedisClient.connect(redis_url) for _ in range(2)]
    try:
        stores = [Store(c, env.keys, f"racer{i}", env.clock) for i, c in enumerate(clients)]
        keyed: Options = (("key", "race"),)
        outcomes = await asyncio.gather(*(
            s.put_with("default", 0, 0, 1, b"x", keyed) for s in stores for _ in range(20)))
    finally:
        for c in clients:
            await c.close()
    inserted = [o for o in outcomes if o.inserted]
    assert len(inserted) == 1
    assert {o.id for o in outcomes} == {inserted[0].id}
    assert await env.raw.zcard(env.keys.ready("default")) == 1


async def test_a_put_with_no_options_is_a_put(env: Env) -> None:
    outcome = await env.store.put_with("default", 3, 0, 1, b"x", ())
    job = await info(env, outcome.id)
    assert (outcome.inserted, job.state, job.pri) == (True, "ready", 3)
    assert await policies(env, outcome.id) == JobPolicies("", 0, 0, 0, "")
    assert await env.store.job_policies(outcome.id + 1) is None
    assert await env.store.peek_key("nothing") is None


async def test_a_put_with_job_is_handed_to_a_waiting_connection(env: Env) -> None:
    await env.store.set_waiting(BOB, 1)
    job_id = await put_with(env, ("max-tries", 1), ("ttl-ms", 60_000))
    claimed = await env.store.set_waiting(BOB, -1, claim=True)
    assert [r.id for r in claimed] == [job_id]
    assert isinstance(claimed[0], Reservation)


# -- the transition table ------------------------------------------------------------------------


async def _job_in(env: Env, state: JobState, *opts: tuple[str, int | str]) -> int:
    """A job with ``opts`` in ``state`` (reserved by ALICE, TTR 1 s)."""
    job_id = await put_with(env, *opts, delay=60 if state is JobState.DELAYED else 0)
    if state in (JobState.RESERVED, JobState.BURIED):
        assert (await env.reserve()).id == job_id
    if state is JobState.BURIED:
        assert await env.store.bury(ALICE, job_id, 0)
    return job_id


@pytest.mark.parametrize(("before", "what"), list(POLICY_TRANSITIONS))
async def test_policy_transition_table(env: Env, before: JobState, what: str) -> None:
    s = env.store
    if "max-tries" in what:
        job_id = await _job_in(env, before, ("max-tries", 1))
    elif "backoff" in what:
        job_id = await _job_in(env, before, ("backoff-ms", 100))
    else:
        on_expire = "delete" if "delete" in what else "bury"
        job_id = await _job_in(env, before, ("ttl-ms", 500), ("on-expire", on_expire))
        env.clock.advance(0.5)
    if what.startswith("timeout"):
        env.clock.advance(1)
        await s.expire()
    elif what.startswith("release"):
        assert await s.release(ALICE, job_id, 0, 0)
    elif what.startswith("disconnect"):
        assert await s.disconnect(ALICE, False, True, [job_id]) == 1
    else:
        await s.promote()
    after = POLICY_TRANSITIONS[(before, what)]
    assert await env.state(job_id) == after
