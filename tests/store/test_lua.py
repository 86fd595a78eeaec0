"""Layer (c): every Lua script against a real Redis, with a clock the test moves.

Walks ``tubeq.model.states.TRANSITIONS``: for each row, a job is brought into the "before" state,
the operation's script runs, and the job's state in Redis must be the "after" state. Then the
finer points of each script: ordering, ownership, counters, tube lifetime, timers, wake-ups.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions

from tests.support.client_support import eventually
from tubeq.model.states import TRANSITIONS, JobState
from tubeq.redisio.client import RedisClient, RedisReplyError
from tubeq.redisio.process import RedisProcess
from tubeq.store.keys import JobField, Keys
from tubeq.store.records import FINISHED_HERE, PARENT_LIVING, JobEnd, NoJob, Reservation
from tubeq.store.scripts import expand
from tubeq.store.shards import ShardedStore, shard_of_tube
from tubeq.store.store import Store

ALICE = "inst:1"
BOB = "inst:2"
CAROL = "inst:3"


@dataclass
class FakeClock:
    now_ms: int = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)


@dataclass
class Env:
    store: Store
    clock: FakeClock
    raw: redis.asyncio.Redis
    keys: Keys

    async def state(self, job_id: int) -> JobState | None:
        info = await self.store.job_info(job_id)
        return None if info is None else JobState(info.state)

    async def put(self, tube: str = "default", pri: int = 0, delay: int = 0, ttr: int = 60,
                  body: bytes = b"x") -> int:
        return await self.store.put(tube, pri, delay, ttr, body)

    async def reserve(self, token: str = ALICE) -> Reservation:
        r = await self.store.reserve(token)
        assert isinstance(r, Reservation), r
        return r


@asynccontextmanager
async def open_env(redis_url: str, events_maxlen: int, functions: bool = True,
                   ) -> AsyncIterator[Env]:
    """A store of instance "inst" with connections ALICE and BOB, on a fake clock; its scripts
    called as the library's functions (FCALL), or each by EVALSHA (``functions=False``)."""
    clock = FakeClock()
    client = await RedisClient.connect(redis_url)
    keys = Keys("test")
    store = Store(client, keys, "inst", clock, events_maxlen=events_maxlen, functions=functions)
    assert await store.load_scripts() is functions  # the private Redis is 7.x
    await store.heartbeat()
    for token in (ALICE, BOB):
        await store.connect(token)
    raw = redis.asyncio.Redis.from_url(redis_url)
    try:
        yield Env(store, clock, raw, keys)
    finally:
        await raw.aclose()
        await client.close()


# Every script test runs with lifecycle events on and off: writing them must change nothing
# else (what they write is tests/store/test_events.py's business). And every one runs as a function
# of the library (FCALL, the default) and as a script by EVALSHA (the fallback, and the path of
# a Redis before 7.0): the two bind the same text differently (tubeq.store.scripts).
@pytest.fixture(params=[(1000, True), (0, True), (1000, False), (0, False)],
                ids=["events-on", "events-off", "events-on-evalsha", "events-off-evalsha"])
async def env(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    async with open_env(redis_url, *request.param) as opened:
        yield opened


async def put_after(env: Env, *parents: int, delay_ms: int = 0) -> int:
    """A job put with after= ``parents`` (its parents' ends kept an hour)."""
    opts: tuple[tuple[str, int | str], ...] = (
        ("after", ",".join(map(str, parents))), ("after-keep", 3_600_000))
    if delay_ms:
        opts = (("delay-ms", delay_ms), *opts)
    outcome = await env.store.put_with("default", 0, 0, 60, b"child", opts)
    assert outcome.inserted, outcome
    return outcome.id


async def bring_to(env: Env, state: JobState | None) -> int:
    """A job in ``state`` (reserved by ALICE when reserved; held after a ready parent)."""
    if state is JobState.HELD:
        return await put_after(env, await env.put())
    if state is JobState.DELAYED:
        return await env.put(delay=10)
    job_id = await env.put()
    if state is JobState.READY:
        return job_id
    r = await env.reserve()
    assert r.id == job_id
    if state is JobState.BURIED:
        assert await env.store.bury(ALICE, job_id, 0)
    return job_id


async def perform(env: Env, op: str, job_id: int) -> None:
    s = env.store
    if op == "promote":
        env.clock.advance(11)
        await s.promote()
    elif op == "expire":
        env.clock.advance(61)
        await s.expire()
    elif op == "reserve":
        assert (await env.reserve()).id == job_id
    elif op == "reserve_job":
        assert isinstance(await s.reserve_job(BOB, job_id), Reservation)
    elif op == "release":
        assert await s.release(ALICE, job_id, 5, 0)
    elif op == "release delay>0":
        assert await s.release(ALICE, job_id, 5, 3)
    elif op == "bury":
        assert await s.bury(ALICE, job_id, 5)
    elif op == "touch":
        assert await s.touch(ALICE, job_id)
    elif op == "kick":
        assert await s.kick("default", 10) == 1
    elif op == "kick_job":
        assert await s.kick_job(job_id)
    elif op == "disconnect":
        assert await s.disconnect(ALICE, False, False, [job_id]) == 1
    elif op == "disconnect at shutdown":
        assert await s.disconnect(ALICE, False, False, [job_id], shutdown=True) == 1
    elif op == "hand-back":
        assert await s.hand_back(ALICE, job_id) == 1
    elif op == "delete":
        assert await s.delete(ALICE, job_id)
    elif op == "cancel":
        assert await s.cancel(job_id) == 1
    elif op.startswith(("last parent finished", "a parent failed")):  # parent: job_id - 1
        parent = job_id - 1
        if op == "a parent failed":
            assert await s.delete(BOB, parent)  # deleted unrun: not finished
        else:
            assert (await env.reserve()).id == parent
            assert await s.finish(ALICE, parent, b"done", 3_600_000) is not False
        assert (await s.tell_children())[0] == 1
    else:
        raise AssertionError(op)


@pytest.mark.parametrize("failed", [False, True])
async def test_a_held_job_with_a_delay_is_delayed_when_its_parent_finishes(
        env: Env, failed: bool) -> None:
    parent = await env.put()
    child = await put_after(env, parent, delay_ms=5000)
    assert (await env.reserve()).id == parent
    if failed:
        assert await env.store.bury(ALICE, parent, 0)
    else:
        assert await env.store.finish(ALICE, parent, b"ok", 3_600_000) is not False
    assert (await env.store.tell_children())[1] == (0 if failed else env.clock.now_ms + 5000)
    assert await env.state(child) is TRANSITIONS[
        (JobState.HELD, "a parent failed" if failed else "last parent finished delay>0")]


async def test_put_after_states(env: Env) -> None:
    parent = await env.put()
    assert await env.state(await put_after(env, parent)) is \
        TRANSITIONS[(None, "put after=living parent")]
    assert await env.store.delete(BOB, parent)  # gone unfinished, its end kept (it was waited)
    assert await env.state(await put_after(env, parent)) is \
        TRANSITIONS[(None, "put after=failed parent")]


@pytest.mark.parametrize(("before", "op"), [k for k in TRANSITIONS if k[0] is not None])
async def test_transition_table(env: Env, before: JobState, op: str) -> None:
    if op == "last parent finished delay>0":  # a held job with a delay of its own
        job_id = await put_after(env, await env.put(), delay_ms=5000)
    else:
        job_id = await bring_to(env, before)
    assert await env.state(job_id) is before
    await perform(env, op, job_id)
    assert await env.state(job_id) is TRANSITIONS[(before, op)]


async def test_put_states(env: Env) -> None:
    assert await env.state(await env.put()) is TRANSITIONS[(None, "put")]
    assert await env.state(await env.put(delay=1)) is TRANSITIONS[(None, "put delay>0")]


async def test_ids_are_sequential_and_burned_ids_are_skipped(env: Env) -> None:
    assert await env.put() == 1
    assert await env.store.burn_id() == 2
    assert await env.put() == 3


async def test_reserve_orders_by_priority_then_id_across_tubes(env: Env) -> None:
    await env.store.change_watches(ALICE, [("+w", "a"), ("+w", "b")])
    ids = [await env.put("a", 5), await env.put("b", 1), await env.put("a", 1),
           await env.put("default", 3)]
    order = [(await env.reserve()).id for _ in ids]
    assert order == [ids[1], ids[2], ids[3], ids[0]]
    assert isinstance(await env.store.reserve(ALICE), NoJob)


async def test_reserve_only_from_watched_tubes(env: Env) -> None:
    await env.put("other")
    assert await env.store.reserve(ALICE) == NoJob()


@pytest.mark.parametrize("unwatched_ready", [0, 1, 5, 35, 60])
async def test_reserve_across_many_watched_tubes(env: Env, unwatched_ready: int) -> None:
    # 40 watched tubes: reserve walks the ready-tube index, its head alone and then pages of
    # 32 (0: found at the head; 1 and 5: on the second page; 35: on the third), falling back
    # to per-tube lookups when the index is crowded with tubes the connection does not watch
    # (60: more than the 40 it watches).
    await env.store.change_watches(ALICE, [("+w", f"t{i}") for i in range(40)])
    for i in range(unwatched_ready):
        await env.put(f"other{i}", 0)
    low = await env.put("t7", 9)
    best = await env.put("t30", 4)
    tie = await env.put("t2", 4)
    assert [(await env.reserve()).id for _ in range(3)] == [best, tie, low]
    assert isinstance(await env.store.reserve(ALICE), NoJob)


async def test_ids_compare_numerically_not_as_strings(env: Env) -> None:
    for _ in range(9):
        await env.put(pri=7)
    ten = await env.put(pri=7)
    assert ten == 10
    assert [(await env.reserve()).id for _ in range(10)] == list(range(1, 11))


async def test_paused_tube_is_skipped_then_resumes_on_time(env: Env) -> None:
    job_id = await env.put()
    until = await env.store.pause("default", 2)
    assert until == env.clock.now_ms + 2000
    assert await env.store.reserve(ALICE) == NoJob()
    env.clock.advance(2)
    next_due, woken = await env.store.promote()
    assert woken == ["default"] and next_due == -1
    assert (await env.reserve()).id == job_id


async def test_pause_of_missing_tube_is_not_found_and_creates_nothing(env: Env) -> None:
    assert await env.store.pause("nosuch", 5) == 0
    assert "nosuch" not in await env.store.list_tubes()


async def test_delayed_jobs_become_ready_in_due_order_then_id(env: Env) -> None:
    late = await env.put(delay=5)
    early_b = await env.put(delay=2, pri=9)
    early_a = await env.put(delay=2, pri=1)
    assert (await env.store.peek_state("delayed", "default")) == (early_b, b"x")
    env.clock.advance(2)
    next_due, woken = await env.store.promote()
    assert woken == ["default"]
    assert next_due == env.clock.now_ms + 3000
    assert (await env.reserve()).id == early_a
    assert (await env.reserve()).id == early_b
    assert await env.state(late) is JobState.DELAYED


async def test_expire_counts_a_timeout_and_the_owner_loses_the_job(env: Env) -> None:
    job_id = await env.put(ttr=1)
    await env.reserve()
    env.clock.advance(1)
    next_due, woken = await env.store.expire()
    assert woken == ["default"] and next_due == -1
    info = await env.store.job_info(job_id)
    assert info is not None and (info.state, info.timeouts, info.reserves) == ("ready", 1, 1)
    assert not await env.store.release(ALICE, job_id, 0, 0)
    _, named = await env.store.server_counts()
    assert named["job-timeouts"] == 1


async def test_only_the_owner_may_touch_release_bury_or_delete(env: Env) -> None:
    job_id = await env.put()
    await env.reserve(ALICE)
    s = env.store
    assert not await s.release(BOB, job_id, 0, 0)
    assert not await s.bury(BOB, job_id, 0)
    assert await s.touch(BOB, job_id) == 0
    assert not await s.delete(BOB, job_id)
    assert isinstance(await s.reserve_job(BOB, job_id), NoJob)
    assert await s.delete(ALICE, job_id)


async def test_touch_gives_a_full_ttr_from_now(env: Env) -> None:
    job_id = await env.put(ttr=10)
    await env.reserve()
    env.clock.advance(8)
    assert await env.store.touch(ALICE, job_id) == env.clock.now_ms + 10_000
    env.clock.advance(8)
    await env.store.expire()
    assert await env.state(job_id) is JobState.RESERVED


async def test_release_and_bury_count_and_set_priority(env: Env) -> None:
    job_id = await env.put(pri=1)
    await env.reserve()
    assert await env.store.release(ALICE, job_id, 7, 0)
    await env.reserve()
    assert await env.store.bury(ALICE, job_id, 9)
    info = await env.store.job_info(job_id)
    assert info is not None
    assert (info.pri, info.releases, info.buries, info.reserves) == (9, 1, 1, 2)


async def test_kick_takes_buried_before_delayed_and_never_both(env: Env) -> None:
    buried = []
    for _ in range(2):
        await env.put()
        r = await env.reserve()
        await env.store.bury(ALICE, r.id, 0)
        buried.append(r.id)
    delayed = await env.put(delay=100)
    assert await env.store.peek_state("buried", "default") == (buried[0], b"x")
    assert await env.store.kick("default", 1) == 1
    assert await env.state(buried[0]) is JobState.READY
    assert await env.store.kick("default", 10) == 1
    assert await env.state(delayed) is JobState.DELAYED
    assert await env.store.kick("default", 10) == 1
    assert await env.state(delayed) is JobState.READY
    assert await env.store.kick("default", 10) == 0


async def test_kick_job_only_buried_or_delayed(env: Env) -> None:
    ready = await env.put()
    assert not await env.store.kick_job(ready)
    assert not await env.store.kick_job(999)


async def test_disconnect_releases_without_counting(env: Env) -> None:
    job_id = await env.put()
    await env.reserve()
    assert await env.store.disconnect(ALICE, False, False, [job_id]) == 1
    info = await env.store.job_info(job_id)
    assert info is not None and (info.state, info.timeouts, info.releases) == ("ready", 0, 0)


async def test_tube_lives_while_referenced_and_forgets_its_counters(env: Env) -> None:
    s = env.store
    await s.set_using([("t", 1)])
    job_id = await env.put("t")
    await s.pause("t", 100)
    await s.set_using([("t", 0)])
    assert "t" in await s.list_tubes()  # it still has a job
    assert await s.delete(ALICE, job_id)
    assert "t" not in await s.list_tubes()
    await s.change_watches(ALICE, [("+w", "t")])
    counts = await s.tube_counts("t")
    assert counts is not None
    assert counts[5] == 0 and counts[11] == 0 and counts[12] == 0  # total-jobs, pause, pause end


async def test_default_tube_is_never_collected(env: Env) -> None:
    await env.store.set_using([("default", 2)])
    await env.store.set_using([("default", 0), ("x", 2)])
    await env.store.change_watches(ALICE, [("+w", "x"), ("-w", "default")])
    await env.store.change_watches(BOB, [("+w", "x"), ("-w", "default")])
    assert "default" in await env.store.list_tubes()


async def test_using_counts_are_absolute_per_instance_and_summed(env: Env) -> None:
    other = Store(env.store.client, env.keys, "other", env.clock)
    await other.heartbeat()
    await env.store.set_using([("u", 2)])
    await env.store.set_using([("u", 2)])  # sent again (a retry): no double count
    await other.set_using([("u", 3)])
    counts = await env.store.tube_counts("u")
    assert counts is not None and counts[6] == 5  # current-using
    await env.store.set_using([("u", 0)])
    counts = await env.store.tube_counts("u")
    assert counts is not None and counts[6] == 3
    await other.set_using([("u", 0)])
    assert "u" not in await env.store.list_tubes()


async def test_reap_takes_back_a_dead_instance_use_counts(env: Env) -> None:
    ghost = Store(env.store.client, env.keys, "ghost", env.clock)
    await ghost.heartbeat()
    await ghost.set_using([("spooky", 4)])
    assert "spooky" in await env.store.list_tubes()
    env.clock.advance(10)
    await env.store.heartbeat()
    assert await env.store.reap(env.clock.now_ms - 3000) == 1
    assert "spooky" not in await env.store.list_tubes()


async def test_wake_is_published_only_when_someone_waits_and_nobody_took_the_job(
        env: Env) -> None:
    pubsub = env.raw.pubsub()
    await pubsub.psubscribe(env.keys.wake_pattern)
    await pubsub.get_message(timeout=1)  # the subscribe confirmation
    await env.put()
    assert await pubsub.get_message(timeout=0.2) is None
    await env.store.pause("default", 60)  # a waiter cannot take a job from a paused tube
    await env.store.set_waiting(ALICE, 1)
    job_id = await env.put()
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["channel"] == env.keys.wake_channel("default").encode()
    assert await env.state(job_id) is JobState.READY
    assert await env.store.set_waiting(ALICE, -1, claim=True) == []
    counts = await env.store.tube_counts("default")
    assert counts is not None and counts[8] == 0  # current-waiting back to 0
    await pubsub.aclose()


async def _grant_listener(env: Env) -> Any:
    pubsub = env.raw.pubsub()
    await pubsub.subscribe(env.keys.grant_channel("inst"))
    await pubsub.get_message(timeout=1)  # the subscribe confirmation
    return pubsub


async def test_put_hands_the_job_to_the_first_waiting_connection(env: Env) -> None:
    s = env.store
    pubsub = await _grant_listener(env)
    await s.set_waiting(BOB, 1)
    await s.set_waiting(ALICE, 1)
    first = await env.put(body=b"first")
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["data"] == BOB.encode()
    info = await s.job_info(first)
    assert info is not None and (info.state, info.reserves) == ("reserved", 1)
    counts = await s.tube_counts("default")
    assert counts is not None and (counts[1], counts[2], counts[8]) == (0, 1, 1)
    second = await env.put(body=b"second")  # the next waiter in line
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["data"] == ALICE.encode()
    # Each claims its own with its next reserve; nothing else is taken with it.
    third = await env.put(body=b"third")
    bob = await env.reserve(BOB)
    assert (bob.id, bob.body) == (first, b"first")
    alice = await env.reserve(ALICE)
    assert (alice.id, alice.body) == (second, b"second")
    assert await env.state(third) is JobState.READY
    counts = await s.tube_counts("default")
    assert counts is not None and counts[8] == 0
    await pubsub.aclose()


async def test_waiters_of_different_watch_sets_are_served_in_the_order_they_started_waiting(
        env: Env) -> None:
    """Lines (includes/waiter_counts.lua): CAROL watches `default` alone, BOB and ALICE also
    `other` (one line of two). A put on `default` goes to whoever started waiting first across
    the lines, as the per-tube queue did, also after the first line's head has moved on."""
    s = env.store
    pubsub = await _grant_listener(env)
    await s.connect(CAROL)
    for token in (BOB, ALICE):
        await s.change_watches(token, [("+w", "other")])
    await s.set_waiting(BOB, 1)
    await s.set_waiting(CAROL, 1)
    await s.set_waiting(ALICE, 1)
    order = []
    for _ in range(3):
        await env.put()
        message = await pubsub.get_message(timeout=2)
        assert message is not None
        order.append(message["data"].decode())
    assert order == [BOB, CAROL, ALICE]
    for token in (BOB, CAROL, ALICE):  # each got one, and waits no more
        assert len(await s.set_waiting(token, -1, claim=True)) == 1
    assert await env.raw.exists(env.keys.waiters("default"), env.keys.waiters("other")) == 0
    await pubsub.aclose()


async def test_the_first_waiter_is_found_however_many_lines_are_behind_it(env: Env) -> None:
    """40 lines whose first waiters left: the tube still scores each by the seq of the waiter
    that left, ahead of BOB, whose line's one waiter came before every waiter now in them.
    The put goes to BOB (before, first_line settled after 16 raises for a later waiter; a put
    calls it twice, direct_taker then hand_over_in, hence more than 32 lines)."""
    s = env.store
    pubsub = await _grant_listener(env)
    lines = range(40)
    for k in lines:  # line k: default and x<k>; its first waiter, then (later) its second
        for token in (f"inst:a{k}", f"inst:b{k}"):
            await s.change_watches(token, [("+w", "default"), ("+w", f"x{k}")])
    for k in lines:
        await s.set_waiting(f"inst:a{k}", 1)
    await s.set_waiting(BOB, 1)  # default alone
    for k in lines:
        await s.set_waiting(f"inst:b{k}", 1)
    for k in lines:
        await s.set_waiting(f"inst:a{k}", -1)
    await env.put()
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["data"] == BOB.encode()
    await env.put()  # then the second waiters, in the order they came
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["data"] == b"inst:b0"
    await pubsub.aclose()


async def test_leftover_layout_5_waiters_do_not_hide_a_line(env: Env) -> None:
    """A tube's waiters written by layout 5 (tokens, not lines) are dropped as they are met,
    however many come before a line with a waiter: the put is handed over (before, a first_line
    call that dropped 16 of them returned nobody)."""
    s = env.store
    pubsub = await _grant_listener(env)
    await s.set_waiting(BOB, 1)
    await env.raw.zadd(env.keys.waiters("default"), {f"old:{k}": 0 for k in range(40)})
    job_id = await env.put()
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["data"] == BOB.encode()
    assert await env.state(job_id) is JobState.RESERVED
    assert await env.raw.zcard(env.keys.waiters("default")) == 0
    await pubsub.aclose()


async def test_a_count_in_costs_the_same_however_many_tubes_its_line_has_entered(
        env: Env) -> None:
    """A line enters its tubes once, with its first waiter: a second waiter of the same watch
    set of 100 tubes writes nothing per tube, and stats-tube counts both on every tube."""
    s = env.store
    tubes = [f"t{k}" for k in range(100)]
    for token in (BOB, ALICE):
        await s.change_watches(token, [("+w", t) for t in tubes])
    await s.set_waiting(BOB, 1)
    await env.raw.config_resetstat()
    await s.set_waiting(ALICE, 1)
    stats = await env.raw.info("commandstats")
    writes = sum(int(v["calls"]) for k, v in stats.items()
                 if k.split("_", 1)[-1] in ("zadd", "sadd", "hincrby", "zrem", "hset"))
    assert writes <= 4  # the wait's seq, its place in the line, the gauge, (its line, once)
    for t in ("default", "t0", "t99"):
        counts = await s.tube_counts(t)
        assert counts is not None and counts[8] == 2  # current-waiting
    await s.set_waiting(BOB, -1)
    await s.set_waiting(ALICE, -1)
    assert await env.raw.exists(*(env.keys.waiters(t) for t in tubes)) == 0
    counts = await s.tube_counts("t7")
    assert counts is not None and counts[8] == 0


async def test_a_wait_that_ends_claims_the_job_a_put_handed_it(env: Env) -> None:
    s = env.store
    await s.set_waiting(BOB, 1)
    await s.set_waiting(ALICE, 1)
    job_id = await env.put()
    # BOB's reserve timed out at the same instant: counting out claims the job instead, and
    # the put's counting out is not done twice.
    claimed = await s.set_waiting(BOB, -1, claim=True)
    assert [r.id for r in claimed] == [job_id]
    assert await s.set_waiting(BOB, -1, claim=True) == []
    counts = await s.tube_counts("default")
    assert counts is not None and counts[8] == 1  # ALICE still waits
    gauges, _ = await s.server_counts()
    assert gauges[9] == 1  # current-waiting


async def test_a_staying_take_counts_in_when_it_finds_nothing_and_out_when_it_takes(
        env: Env) -> None:
    """reserve_many(stay=True), the push loop's take: one that finds nothing counts the
    connection in as waiting in the same script (a put of another process then hands it the
    job as any hand-over: recorded, its process told), one that takes jobs counts it out."""
    s = env.store
    other = Store(s.client, env.keys, "other", env.clock)
    await other.heartbeat()
    await other.connect("other:1")
    assert await other.reserve_many("other:1", 4, stay=True) == []
    counts = await s.tube_counts("default")
    assert counts is not None and counts[8] == 1  # current-waiting
    handed = await env.put(body=b"handed")  # by "inst": not the waiter's process
    assert await env.state(handed) is JobState.RESERVED
    ready = await env.put(body=b"ready")  # the waiter was counted out with the hand-over
    assert await env.state(ready) is JobState.READY
    taken = await other.reserve_many("other:1", 4, counted_waiting=False, stay=True)
    assert [(r.id, r.body) for r in taken] == [(handed, b"handed"), (ready, b"ready")]
    counts = await s.tube_counts("default")
    assert counts is not None and counts[8] == 0
    assert await other.reserve_many("other:1", 4, stay=True) == []  # nothing: counted in again
    assert await other.reserve_many("other:1", 4, stay=True) == []  # already in: still once
    counts = await s.tube_counts("default")
    assert counts is not None and counts[8] == 1
    assert await other.set_waiting("other:1", -1, claim=True) == []
    gauges, _ = await s.server_counts()
    assert gauges[9] == 0  # current-waiting


async def test_a_blocked_reserves_staying_take_counts_in_to_be_handed_jobs_the_classic_way(
        env: Env) -> None:
    """reserve_many(stay=True, direct=False), a blocked reserve's try: counted in when it
    finds nothing, as the push loop's take, but in mode '1': a put of its own process records
    the hand-over for its claim (the reserve has no push loop to send a job to), never
    answers {id, token}; a try that takes a job counts it out."""
    s = env.store
    direct: list[tuple[str, Reservation, int]] = []
    s.direct_grants = lambda token, job, pri: direct.append((token, job, pri))
    assert await s.reserve_many(BOB, 1, stay=True, direct=False) == []
    assert (await env.raw.hget(env.keys.waiting, BOB))[:1] == b"1"
    counts = await s.tube_counts("default")
    assert counts is not None and counts[8] == 1  # current-waiting
    handed = await env.put(body=b"handed")  # by this process ("inst"), as the waiter's
    assert direct == []
    assert await env.state(handed) is JobState.RESERVED
    assert [r.id for r in await s.set_waiting(BOB, -1, claim=True)] == [handed]
    ready = await env.put(body=b"ready")
    taken = await s.reserve_many(BOB, 1, stay=True, direct=False)
    assert [r.id for r in taken] == [ready]
    assert await env.raw.hget(env.keys.waiting, BOB) is None
    counts = await s.tube_counts("default")
    assert counts is not None and counts[8] == 0
    s.direct_grants = None


async def test_a_put_hands_its_job_straight_to_a_push_loop_of_its_own_process(
        env: Env) -> None:
    """A push loop counted in by its take (mode 'p') that is first in its tube's line, watches
    that tube alone, and finds it without ready jobs: a put of its own process stores the job
    reserved by it, answers {id, token} (the store hands the job to direct_grants) and leaves it
    counted in; the events are a hand-over's. Anyone else in line still gets its turn."""
    s = env.store
    direct: list[tuple[str, Reservation, int]] = []
    s.direct_grants = lambda token, job, pri: direct.append((token, job, pri))
    assert await s.reserve_many(BOB, 8, stay=True) == []
    first = await env.put(pri=7, ttr=30, body=b"first")
    assert direct == [(BOB, Reservation(first, 30, b"first", env.clock.now_ms + 30_000, 0,
                                        "default"), 7)]
    info = await s.job_info(first)
    assert info is not None and (info.state, info.reserves) == ("reserved", 1)
    counts = await s.tube_counts("default")
    assert counts is not None and (counts[1], counts[2], counts[8]) == (0, 1, 1)
    outcome = await s.put_with("default", 0, 0, 60, b"second", (("waited", 1000),))
    assert (outcome.id, outcome.inserted) == (direct[-1][1].id, True)  # still counted in
    await s.set_waiting(ALICE, 1)  # behind BOB in line: BOB, then ALICE, then BOB again
    third = await env.put(body=b"third")
    fourth = await env.put(body=b"fourth")  # the classic hand-over, to ALICE
    fifth = await env.put(body=b"fifth")
    assert [(t, j.id) for t, j, _ in direct[2:]] == [(BOB, third), (BOB, fifth)]
    assert [r.id for r in await s.set_waiting(ALICE, -1, claim=True)] == [fourth]
    assert await s.delete(BOB, first) and await s.finish(BOB, third, b"done", 1000)
    if env.store.events_maxlen:
        events = [(e[b"event"], int(e[b"id"]), e[b"tries"])
                  for _, e in await env.raw.xrange(env.keys.events)]
        assert events[:2] == [(b"put", first, b"0"), (b"reserved", first, b"1")]
    s.direct_grants = None


async def test_a_direct_hand_over_keeps_the_tubes_score_of_the_line_exact(env: Env) -> None:
    """The push loop taken directly goes to the back of its line, and the tube's score of the
    line follows the line's new first seq at once (first_line then finds it exact: the next
    put makes no raise, two Redis calls fewer), so the next in line is still served next."""
    s = env.store
    direct: list[tuple[str, Reservation, int]] = []
    s.direct_grants = lambda token, job, pri: direct.append((token, job, pri))
    assert await s.reserve_many(BOB, 8, stay=True) == []
    await s.set_waiting(ALICE, 1)  # behind BOB, in the same line (both watch default alone)
    first = await env.put(body=b"first")
    assert [(t, j.id) for t, j, _ in direct] == [(BOB, first)]
    lines = await env.raw.zrange(env.keys.waiters("default"), 0, -1, withscores=True)
    assert len(lines) == 1
    line, score = lines[0]
    head = await env.raw.zrange(env.keys.line(line.decode()), 0, 0, withscores=True)
    assert head == [(ALICE.encode(), score)]
    second = await env.put(body=b"second")  # ALICE's turn: the classic hand-over
    assert len(direct) == 1
    assert [r.id for r in await s.set_waiting(ALICE, -1, claim=True)] == [second]
    s.direct_grants = None


async def test_a_direct_hand_over_reads_the_waiters_in_three_calls(env: Env) -> None:
    """What a put reads of the waiters to hand its job to a push loop of its own process:
    the tube's first lines and the first line's first waiters (one ZRANGE each: whether
    others wait too comes with them) and the loop's mode; that it watches the tube alone is
    its line's name (no SCARD), whether anyone waits is the first read (no EXISTS)."""
    s = env.store
    direct: list[tuple[str, Reservation, int]] = []
    s.direct_grants = lambda token, job, pri: direct.append((token, job, pri))
    assert await s.reserve_many(BOB, 8, stay=True) == []
    await env.raw.config_resetstat()
    job_id = await env.put(body=b"one")
    stats = await env.raw.info("commandstats")
    assert [(t, j.id) for t, j, _ in direct] == [(BOB, job_id)]

    def calls(command: str) -> int:
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    assert (calls("exists"), calls("scard"), calls("zcard")) == (0, 0, 0)
    assert (calls("zrange"), calls("hget")) == (2, 1)
    s.direct_grants = None


async def test_a_run_of_calls_hands_a_push_loop_of_its_process_as_many_jobs_as_it_may_take(
        env: Env) -> None:
    """put_many's calls ('w', store.put_calls): each job waited for by this process (the
    record's wait fields, as put-with wait-ms sets them); a ready one goes straight to the push
    loop of this process first in line, at most as many as the budget pairs with its token
    (reserved by it, counted in 'nres'; it stays counted in). Past its budget no hand-over
    gives it more: while it is first in line the job stays ready (its process, which knows its
    credits, takes it or counts the loop out); a waiter behind it is handed one as a put hands
    one over."""
    s = env.store
    direct: list[tuple[str, Reservation, int]] = []
    s.direct_grants = lambda token, job, pri: direct.append((token, job, pri))
    assert await s.reserve_many(BOB, 8, stay=True) == []
    jobs = [(5, 0, 30, body) for body in (b"a", b"b", b"c", b"d")]
    ids = await s.put_calls("default", jobs, 60_000, [(BOB, 2), (ALICE, 9)])
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert [(t, j.id, j.body) for t, j, _ in direct] == [(BOB, ids[0], b"a"), (BOB, ids[1], b"b")]
    for job_id in ids:
        assert await env.raw.hmget(env.keys.job(job_id), "w", "wb") == [b"60000", b"inst"]
    assert [await env.state(i) for i in ids] == [
        JobState.RESERVED, JobState.RESERVED, JobState.READY, JobState.READY]
    counts = await s.tube_counts("default")
    assert counts is not None and (counts[1], counts[2], counts[8]) == (2, 2, 1)
    assert await s.finish(BOB, ids[0], b"ok", 1000) == FINISHED_HERE  # told here only
    assert await s.wait_end(ids[0], 1000) == JobEnd("finished", b"ok")
    assert [r.id for r in await s.reserve_many(BOB, 8, stay=True)] == ids[2:]  # its process
    direct.clear()
    assert await s.reserve_many(BOB, 8, stay=True) == []
    await s.set_waiting(ALICE, 1)  # behind BOB, in its line
    ids = await s.put_calls("default", jobs[:3], 60_000, [(BOB, 1)])
    assert [(t, j.id) for t, j, _ in direct] == [(BOB, ids[0])]  # then BOB is behind ALICE
    assert [r.id for r in await s.set_waiting(ALICE, -1, claim=True)] == [ids[1]]  # granted
    assert await env.state(ids[2]) is JobState.READY  # BOB first again, and given its budget
    s.direct_grants = None


@pytest.mark.parametrize("other_line", [False, True], ids=["one-line", "another-line-waits"])
async def test_a_run_of_calls_turns_the_line_as_one_call_per_job_would(
        redis_url: str, other_line: bool) -> None:
    """put_calls' direct hand-overs read t's line once and write it back once (direct_run),
    and leave every job, the line's order, its seqs and its score on the tube exactly as a
    put per job would (put.lua's direct_taker): two push loops in one line take turns; with
    another line waiting (a reserve that watches two tubes), the run stops once that line may
    come first, that waiter gets its job as a put hands one over, and the loops take the rest
    directly again, each job looking at the waiters itself."""
    async def run(prefix: str, batched: bool) -> tuple[Any, ...]:
        client = await RedisClient.connect(redis_url)
        try:
            keys = Keys(prefix)
            store = Store(client, keys, "inst", FakeClock(), events_maxlen=1000)
            await store.load_scripts()
            await store.heartbeat()
            direct: list[tuple[str, int]] = []
            store.direct_grants = lambda token, job, pri: direct.append((token, job.id))
            for token in (BOB, ALICE, CAROL):
                await store.connect(token)
            assert await store.reserve_many(BOB, 8, stay=True) == []
            assert await store.reserve_many(ALICE, 8, stay=True) == []
            if other_line:
                await store.change_watches(CAROL, [("+w", "other")])
                await store.set_waiting(CAROL, 1)
            jobs = [(0, 0, 60, b"%d" % i) for i in range(6)]
            if batched:
                ids = await store.put_calls("default", jobs, 1000, [(BOB, 9), (ALICE, 9)])
            else:
                ids = [(await store.put_with("default", *job, (("waited", 1000),))).id
                       for job in jobs]
            raw = redis.asyncio.Redis.from_url(redis_url)
            try:
                lines = await raw.zrange(keys.waiters("default"), 0, -1, withscores=True)
                line_of = {line: await raw.zrange(keys.line(line.decode()), 0, -1,
                                                  withscores=True) for line, _ in lines}
                seq = await raw.hget(keys.seqs, "wait")
                owners = [await raw.hmget(keys.job(i), "s", "o") for i in ids]
            finally:
                await raw.aclose()
            claimed = [r.id for r in await store.set_waiting(CAROL, -1, claim=True)]
            return ids, direct, lines, line_of, seq, owners, claimed
        finally:
            await client.close()

    one_by_one = await run(f"turn-single-{other_line}", batched=False)
    batched = await run(f"turn-batched-{other_line}", batched=True)
    assert batched == one_by_one
    assert len(one_by_one[1]) == (5 if other_line else 6)  # the jobs handed directly
    if other_line:  # the reserve's turn came third (its line's score), then the loops' again
        assert one_by_one[6] == [one_by_one[0][2]]


async def test_a_run_of_calls_hands_nothing_directly_without_a_budget_or_to_others(
        env: Env) -> None:
    """No budget for the loop first in line (its process promised its credits to another
    call, or it has none free), or a loop of another process: the calls' jobs go as put_many's
    (the first to the first waiter, granted; the rest ready); a full tube answers 0."""
    s = env.store
    direct: list[tuple[str, Reservation, int]] = []
    s.direct_grants = lambda token, job, pri: direct.append((token, job, pri))
    assert await s.reserve_many(BOB, 8, stay=True) == []
    ids = await s.put_calls("default", [(0, 0, 60, b"a"), (0, 0, 60, b"b")], 1000, [])
    assert direct == []
    assert [r.id for r in await s.set_waiting(BOB, -1, claim=True)] == [ids[0]]
    assert (await env.reserve(ALICE)).id == ids[1]  # it was ready
    other = Store(s.client, env.keys, "other", env.clock)
    await other.heartbeat()
    await other.connect("other:1")
    assert await other.reserve_many("other:1", 8, stay=True) == []
    await s.set_tube("default", (("max-jobs", 3),))
    more = await s.put_calls("default", [(0, 0, 60, b"c"), (0, 0, 60, b"d")], 1000,
                             [("other:1", 5)])
    assert direct == [] and more[1] == 0  # 'other:1' is not of this process; then full
    assert [r.id for r in await other.set_waiting("other:1", -1, claim=True)] == [more[0]]
    s.direct_grants = None


async def test_a_put_does_not_hand_its_job_straight_over_when_that_would_change_what_is_taken(
        env: Env) -> None:
    """No direct hand-over where the classic one would do otherwise: another process's push
    loop, a loop that watches two tubes (it gets its best job), a tube with a ready job (it
    gets the older one), a paused tube (nobody takes a job now)."""
    s = env.store
    direct: list[tuple[str, Reservation, int]] = []
    s.direct_grants = lambda token, job, pri: direct.append((token, job, pri))
    await s.change_watches(BOB, [("+w", "other")])
    assert await s.reserve_many(BOB, 8, stay=True) == []
    two_tubes = await env.put(body=b"a")
    assert direct == [] and [r.id for r in await s.reserve_many(BOB, 8, stay=True)] == \
        [two_tubes]
    await s.change_watches(BOB, [("-w", "other")])
    older = await env.put(body=b"older")  # BOB was counted out: it stays ready
    assert await s.reserve_many(BOB, 8, stay=True) != []  # takes it, counted out
    await s.pause("default", 0)
    assert await s.reserve_many(BOB, 8, stay=True) == []  # counted in
    await s.pause("default", 60)
    paused = await env.put(body=b"paused")
    assert direct == [] and await env.state(paused) is JobState.READY
    assert await env.state(older) is JobState.RESERVED
    await s.pause("default", 0)  # resumed: the paused job is ready, and comes first
    newer = await env.put(body=b"newer")
    assert direct == []
    assert [r.id for r in await s.reserve_many(BOB, 8, stay=True)] == [paused, newer]
    s.direct_grants = None


async def test_a_staying_take_over_shards_counts_in_and_tries_again(redis_url: str) -> None:
    """Over several shards no one script takes and counts in: a take that finds nothing
    counts the connection in for wake-ups, then tries again (a job that came in between is
    taken, and it is counted out); it ends counted in iff no job came."""
    client = await RedisClient.connect(redis_url)
    try:
        store = ShardedStore(client, "split-stay", "inst", 4, FakeClock())
        await store.load_scripts()
        await store.connect(ALICE)
        tubes: dict[int, str] = {}
        for i in range(40):
            tubes.setdefault(shard_of_tube(f"t{i}", 4), f"t{i}")
        await store.change_watches(ALICE, [("+w", tubes[0]), ("+w", tubes[1])])
        assert await store.reserve_many(ALICE, 4, stay=True) == []
        waiting = [await store.shards[k].tube_counts(tubes[k]) for k in (0, 1)]
        assert [c[8] if c else None for c in waiting] == [1, 1]  # counted in both
        job_id = await store.put(tubes[1], 0, 0, 60, b"woken")  # never handed: a wake-up
        taken = await store.reserve_many(ALICE, 4, counted_waiting=True, stay=True)
        assert [r.id for r in taken] == [job_id]
        waiting = [await store.shards[k].tube_counts(tubes[k]) for k in (0, 1)]
        assert [c[8] if c else None for c in waiting] == [0, 0]  # counted out of both
    finally:
        await client.close()


async def test_a_waiter_watching_several_tubes_gets_its_best_job(env: Env) -> None:
    s = env.store
    await s.change_watches(BOB, [("+w", "urgent")])
    await s.pause("urgent", 60)
    urgent = await env.put("urgent", pri=0)
    await s.pause("urgent", 0)  # ready again; the hint for it may not have reached BOB yet
    await s.set_waiting(BOB, 1)
    pubsub = env.raw.pubsub()
    await pubsub.psubscribe(env.keys.wake_pattern)
    await pubsub.get_message(timeout=1)
    own = await env.put("default", pri=10)
    assert [r.id for r in await s.set_waiting(BOB, -1, claim=True)] == [urgent]
    # The put's own job is still ready: the other waiters of its tube get a wake-up.
    assert await env.state(own) is JobState.READY
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["channel"] == env.keys.wake_channel("default").encode()
    await pubsub.aclose()


async def test_a_waiting_connection_that_changes_its_watch_list_waits_on_the_new_tubes(
        env: Env) -> None:
    s = env.store  # a push consumer can watch and ignore while it counts as waiting
    await s.set_waiting(BOB, 1)
    await s.change_watches(BOB, [("+w", "other"), ("-w", "default")])
    default, other = await s.tube_counts("default"), await s.tube_counts("other")
    assert default is not None and other is not None
    assert (default[8], other[8]) == (0, 1)  # current-waiting
    assert await env.raw.zrange(env.keys.waiters("default"), 0, -1) == []
    job_id = await env.put("other")
    assert [r.id for r in await s.set_waiting(BOB, -1, claim=True)] == [job_id]
    other = await s.tube_counts("other")
    assert other is not None and other[8] == 0


async def test_disconnect_gives_back_a_job_handed_and_never_claimed(env: Env) -> None:
    s = env.store
    await s.set_waiting(BOB, 1)
    job_id = await env.put()
    assert await s.disconnect(BOB, False, False, []) == 1
    info = await s.job_info(job_id)
    assert info is not None and (info.state, info.reserves, info.releases) == ("ready", 1, 0)
    gauges, _ = await s.server_counts()
    assert gauges[9] == 0  # current-waiting


async def test_waiters_of_a_silent_process_are_skipped_and_its_handed_jobs_reaped(
        env: Env) -> None:
    ghost = Store(env.store.client, env.keys, "ghost", env.clock)
    await ghost.heartbeat()
    await ghost.connect("ghost:1")
    await ghost.set_waiting("ghost:1", 1)
    handed = await env.put()  # the ghost is alive: it gets this one
    assert await env.state(handed) is JobState.RESERVED
    await ghost.set_waiting("ghost:1", 1)  # and waits again
    env.clock.advance(2.5)  # ... then falls silent
    await env.store.heartbeat()
    await env.store.set_waiting(BOB, 1)
    skipped = await env.put()
    assert [r.id for r in await env.store.set_waiting(BOB, -1, claim=True)] == [skipped]
    env.clock.advance(1)
    assert await env.store.reap(env.clock.now_ms - 3000) == 1
    assert await env.state(handed) is JobState.READY  # back at once, not after its TTR


@pytest.mark.parametrize("path", ["release", "kick", "kick_job", "promote", "expire",
                                  "disconnect", "pause0"])
async def test_every_path_to_ready_wakes_waiters(env: Env, path: str) -> None:
    s = env.store
    if path in ("kick", "kick_job"):
        job_id = await bring_to(env, JobState.BURIED)
    elif path == "promote":
        job_id = await env.put(delay=1)
    elif path == "pause0":
        job_id = await env.put()
        await s.pause("default", 100)
    else:
        job_id = await bring_to(env, JobState.RESERVED)
    pubsub = env.raw.pubsub()
    await pubsub.psubscribe(env.keys.wake_pattern)
    await pubsub.get_message(timeout=1)
    await s.set_waiting(BOB, 1)
    if path == "release":
        await s.release(ALICE, job_id, 0, 0)
    elif path == "kick":
        await s.kick("default", 1)
    elif path == "kick_job":
        await s.kick_job(job_id)
    elif path == "promote":
        env.clock.advance(1)
        await s.promote()
    elif path == "expire":
        env.clock.advance(61)
        await s.expire()
    elif path == "disconnect":
        await s.disconnect(ALICE, False, False, [job_id])
    else:
        assert await s.pause("default", 0) == -1
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["type"] == "pmessage"
    await pubsub.aclose()


async def test_reap_takes_back_a_dead_instance_share(env: Env) -> None:
    ghost = Store(env.store.client, env.keys, "ghost", env.clock)
    await ghost.heartbeat()
    await ghost.connect("ghost:1")
    await ghost.change_watches("ghost:1", [("+w", "haunted")])
    await ghost.set_waiting("ghost:1", 1)
    assert "haunted" in await env.store.list_tubes()
    env.clock.advance(10)
    await env.store.heartbeat()
    assert await env.store.reap(env.clock.now_ms - 3000) == 1
    assert "haunted" not in await env.store.list_tubes()
    gauges, _ = await env.store.server_counts()
    assert gauges[6] == 2  # current-connections: ALICE and BOB only
    assert gauges[9] == 0  # current-waiting


@pytest.mark.parametrize("recorded_by", ["this-build", "an-earlier-build"])
async def test_a_wait_counted_in_between_a_reap_and_its_restore_is_in_its_tubes_line(
        env: Env, recorded_by: str) -> None:
    """A paused process is reaped (its watch sets go); one of its connections counts in before
    the process's restore runs. This build records no wait for an empty watch set, so the
    count-in after the restore is the one that counts; a wait an earlier build recorded in
    the line of the empty set is moved by the restore into the line of the watch set it brings
    back. Either way a put on its tube is handed to it, and stats-tube counts it (before, the
    wait stayed in the line of the empty set: no hand-over, no wake-up, current-waiting 0)."""
    ghost = Store(env.store.client, env.keys, "ghost", env.clock)
    await ghost.heartbeat()
    await ghost.connect("ghost:1")
    await ghost.change_watches("ghost:1", [("+w", "haunted")])
    env.clock.advance(10)
    await env.store.heartbeat()
    assert await env.store.reap(env.clock.now_ms - 3000) == 1
    if recorded_by == "this-build":
        await ghost.set_waiting("ghost:1", 1)  # its reserve, between the reap and the restore
    else:  # what count_waiting wrote for an empty watch set before it refused to
        empty = "da39a3ee5e6b4b0d3255"  # sha1 of "", 20 digits
        await env.raw.hset(env.keys.waiting, "ghost:1", "1" + empty)
        await env.raw.hset(env.keys.line_of, "ghost:1", empty)
        await env.raw.zadd(env.keys.line(empty), {"ghost:1": 99})
        await env.raw.hincrby(env.keys.instance("ghost"), "waiting", 1)
    assert await ghost.heartbeat()  # it finds itself unregistered ...
    await ghost.restore([("ghost:1", True, ("default", "haunted"))], (1, 0, 0))  # ... restores
    await ghost.set_waiting("ghost:1", 1)  # and counts in again (a no-op: it is counted)
    counts = await env.store.tube_counts("haunted")
    assert counts is not None and counts[8] == 1  # current-waiting
    pubsub = env.raw.pubsub()
    await pubsub.subscribe(env.keys.grant_channel("ghost"))
    await pubsub.get_message(timeout=1)
    job_id = await env.put("haunted")
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["data"] == b"ghost:1"
    assert [r.id for r in await ghost.set_waiting("ghost:1", -1, claim=True)] == [job_id]
    assert await env.raw.exists(env.keys.waiters("haunted"), env.keys.waiters("default"),
                                env.keys.line("da39a3ee5e6b4b0d3255")) == 0
    gauges, _ = await env.store.server_counts()
    assert gauges[9] == 0  # current-waiting
    await pubsub.aclose()


async def test_a_wait_on_no_tube_is_not_recorded(env: Env) -> None:
    """A token whose watch set is gone (reaped) waits on nothing: its count-in records nothing,
    so the count-in it sends once its watches are back is the one that counts."""
    await env.store.change_watches("inst:7", [("+w", "t1")])
    await env.raw.delete(env.keys.watch("inst:7"))
    await env.store.set_waiting("inst:7", 1)
    assert await env.raw.hget(env.keys.waiting, "inst:7") is None
    await env.store.change_watches("inst:7", [("+w", "t1")])
    await env.store.set_waiting("inst:7", 1)
    counts = await env.store.tube_counts("t1")
    assert counts is not None and counts[8] == 1
    await env.store.set_waiting("inst:7", -1)


async def test_reap_counts_out_the_waiting_http_tokens_of_a_dead_process(env: Env) -> None:
    """An HTTP long poll's token ('<instance>:h<random>') is in no connection set: reap finds
    the dead process's waiting tokens in {p}:waiting and counts them out, so their lines leave
    the tubes (no wake-up published, no dead waiter skipped at every put, current-waiting 0),
    and drops their watch sets."""
    ghost = Store(env.store.client, env.keys, "ghost", env.clock)
    await ghost.heartbeat()
    await ghost.connect("ghost:1")
    await ghost.set_waiting("ghost:1", 1)
    for token in ("ghost:h0a1", "ghost:h0a2"):
        await ghost.change_watches(token, [("+w", "polled")])
        await ghost.set_waiting(token, 1)
    await env.store.change_watches("ghostly:h1", [("+w", "polled")])  # another process's
    await env.store.set_waiting("ghostly:h1", 1)
    env.clock.advance(10)
    await env.store.heartbeat()
    await env.raw.zadd(env.keys.instances, {"ghostly": env.clock.now_ms})
    assert await env.store.reap(env.clock.now_ms - 3000) == 1
    waiting = await env.raw.hkeys(env.keys.waiting)
    assert sorted(waiting) == [b"ghostly:h1"]
    counts = await env.store.tube_counts("polled")
    assert counts is not None and counts[8] == 1
    assert await env.raw.exists(env.keys.watch("ghost:h0a1"), env.keys.watch("ghost:h0a2")) == 0
    await env.store.set_waiting("ghostly:h1", -1)
    assert await env.raw.exists(env.keys.waiters("polled"), env.keys.waiters("default")) == 0
    gauges, _ = await env.store.server_counts()
    assert gauges[9] == 0  # current-waiting


async def test_urgent_counts_ready_jobs_below_1024_only(env: Env) -> None:
    await env.put(pri=1023)
    await env.put(pri=1024)
    await env.put(pri=0, delay=5)
    counts = await env.store.tube_counts("default")
    assert counts is not None and counts[0] == 1


async def test_scripts_reload_after_redis_forgets_them(env: Env) -> None:
    await env.raw.script_flush()
    await env.raw.function_flush()
    # NOSCRIPT or no such function: EVAL of the full source, and the library is loaded again
    assert await env.put() == 1
    assert await env.put() == 2
    libraries = await env.raw.function_list()
    assert len(libraries) == (1 if env.store.calls_functions else 0)  # none by EVALSHA


async def test_lua_key_schema_matches_python(env: Env) -> None:
    keys_lua = resources.files("tubeq.store").joinpath("lua", "includes", "keys.lua").read_text()
    probe = expand(keys_lua + """
return {K_JOB_IDS, K_TUBES, K_READY_TUBES, K_TIMERS, K_RESERVED, K_STATS, K_REFS, K_SEQS,
        K_INSTANCES, k_job(ARGV[1]), k_tube(ARGV[2]), k_ready(ARGV[2]), k_delayed(ARGV[2]),
        k_buried(ARGV[2]), k_instance(ARGV[3]), k_instance_conns(ARGV[3]), k_watch(ARGV[4]),
        k_wake(ARGV[2]), K_WAITING, k_waiters(ARGV[2]), k_handed(ARGV[4]), k_grant(ARGV[3]),
        K_EVENTS, k_settings(ARGV[2]), K_LAYOUT, K_COUNTS, k_end(ARGV[1]), K_ENDED,
        K_LINE_OF, k_line(ARGV[5]), k_line_tubes(ARGV[5])}""")
    k = env.keys
    names = await env.raw.eval(probe, 1, k.root, 7, "a-tube", "inst9", "inst9:3", "0f1e")
    assert [n.decode() for n in names] == [
        k.job_ids, k.tubes, k.ready_tubes, k.timers, k.reserved, k.stats, k.refs, k.seqs,
        k.instances, k.job(7), k.tube("a-tube"), k.ready("a-tube"), k.delayed("a-tube"),
        k.buried("a-tube"), k.instance("inst9"), k.instance_conns("inst9"), k.watch("inst9:3"),
        k.wake_channel("a-tube"), k.waiting, k.waiters("a-tube"), k.handed("inst9:3"),
        k.grant_channel("inst9"), k.events, k.settings("a-tube"), k.layout, k.counts, k.end(7),
        k.ended_channel, k.line_of, k.line("0f1e"), k.line_tubes("0f1e")]


async def test_text_writes_numbers_as_redis_would_store_them(env: Env) -> None:
    """text() (lua/includes/text.lua) gives the digits Redis stores for a number handed to it
    as a number, passes strings, fractions and numbers past 2^53 through, and empties its
    cache when full without changing an answer."""
    numbers = [0, 1, -1, 7, 1790000000123, 2 ** 32 - 1, 2 ** 53 - 1, -(2 ** 53 - 1)]
    probe = expand('--- @include "text"\n' + """
local out = {}
for i, n in ipairs({0, 1, -1, 7, 1790000000123, 4294967295, 9007199254740991,
                    -9007199254740991}) do
  redis.call('SET', 'as-number', n)
  out[#out + 1] = {text(n), redis.call('GET', 'as-number')}
end
local passed = {text('0042'), type(text(1.5)), type(text(2^53)), type(text(-2^53))}
local wrong = 0
for n = 1, 2 * TEXT_CACHE_MAX + 10 do  -- fills the cache twice over
  if text(n * 1000 + 7) ~= string.format('%d', n * 1000 + 7) or text(0) ~= '0' then
    wrong = wrong + 1
  end
end
return {out, passed, wrong, texts_n <= TEXT_CACHE_MAX and 1 or 0}""")
    out, passed, wrong, bounded = await env.raw.eval(probe, 0)
    assert [(t.decode(), stored.decode()) for t, stored in out] == \
        [(str(n), str(n)) for n in numbers]
    assert [bytes(passed[0]).decode(), *(bytes(v).decode() for v in passed[1:])] == \
        ["0042", "number", "number", "number"]
    assert wrong == 0 and bounded == 1


async def test_lua_job_record_matches_python(env: Env) -> None:
    """Every field of the job record (lua/includes/job_record.lua, JOB_<NAME>) is a JobField of
    the same name and value, and every JobField is one of them; no two share a hash field."""
    record_lua = resources.files("tubeq.store").joinpath(
        "lua", "includes", "job_record.lua").read_text()
    names = re.findall(r"^local (JOB_\w+) = ", record_lua, re.MULTILINE)
    probe = record_lua + "\nreturn {" + ", ".join(names) + "}"
    values = await env.raw.eval(probe, 0)  # a name whose value is no string ends the list early
    lua = dict(zip((n.removeprefix("JOB_") for n in names), (v.decode() for v in values),
                   strict=True))
    assert lua == {f.name: f.value for f in JobField}
    assert len(set(lua.values())) == len(lua)


async def test_index_follows_the_head_of_each_tube(env: Env) -> None:
    """ready_tubes holds exactly one entry per non-paused tube with ready jobs, naming its head."""
    await env.put("a", 3)
    await env.put("a", 1)
    await env.put("b", 1)
    await env.store.pause("b", 60)
    entries = await env.raw.zrange(env.keys.ready_tubes, 0, -1, withscores=True)
    assert entries == [(b"A2:a", 1.0)]
    await env.store.pause("b", 0)
    entries = await env.raw.zrange(env.keys.ready_tubes, 0, -1, withscores=True)
    assert entries == [(b"A2:a", 1.0), (b"A3:b", 1.0)]


async def test_exact_clock_follows_the_store_clock(env: Env, redis_url: str) -> None:
    # The scheduler aims its timer with exact_ms: the injected clock as is, or the wall clock
    # with its fraction of a millisecond (never behind the whole-ms clock the scripts get).
    env.clock.advance(1.5)
    assert env.store.exact_ms() == float(env.clock.now_ms)
    client = await RedisClient.connect(redis_url)
    try:
        wall = Store(client, Keys("exact"), "inst")
        before = wall.clock()
        exact = wall.exact_ms()
        assert before <= exact < wall.clock() + 1
    finally:
        await client.close()


async def test_a_redis_out_of_memory_still_answers_reads_and_refuses_writes(env: Env) -> None:
    # Read-only scripts are no-writes functions (tubeq.store.scripts): Redis runs them when it is
    # over maxmemory, as it runs the same scripts by EVALSHA; a write is refused, nothing half-done.
    job_id = await env.put(body=b"kept")
    await env.raw.config_set("maxmemory", "1")
    try:
        assert await env.store.peek(job_id) == b"kept"
        counts = await env.store.tube_counts("default")
        assert counts is not None and counts[1] == 1  # current-jobs-ready
        with pytest.raises(RedisReplyError, match="OOM"):
            await env.put()
    finally:
        await env.raw.config_set("maxmemory", "0")
    assert await env.put() == job_id + 1  # the refused put used no id


async def test_calls_for_two_namespaces_on_one_connection_keep_their_own_keys(env: Env) -> None:
    # A library function binds the namespace's key names once per root change (tubeq.store.scripts):
    # calls alternating between two roots must each see their own.
    other = Store(env.store.client, Keys("other"), "inst", env.clock,
                  events_maxlen=env.store.events_maxlen, functions=env.store.wants_functions)
    if env.store.calls_functions:
        other.call_functions()
    await other.heartbeat()
    await other.connect(ALICE)
    ids = [await s.put("default", 0, 0, 60, name) for _ in range(2)
           for s, name in ((env.store, b"mine"), (other, b"theirs"))]
    assert ids == [1, 1, 2, 2]
    assert (await env.reserve()).body == b"mine"
    r = await other.reserve(ALICE)
    assert isinstance(r, Reservation) and r.body == b"theirs"
    assert await env.raw.exists("{test}:j:2", "{other}:j:2") == 2


@pytest.mark.parametrize("renamed", ["FUNCTION", "FCALL"])
async def test_a_redis_without_functions_runs_the_scripts_by_evalsha(
        tmp_path: Path, renamed: str) -> None:
    # As a Redis before 7.0: without FUNCTION the library cannot load and calls go by EVALSHA;
    # without FCALL (a Redis that lost it under a running tubeq) each call falls back to EVAL.
    own = RedisProcess(tmp_path / "redis", extra=("--rename-command", renamed, ""))
    own.start()
    client = await RedisClient.connect(own.url)
    try:
        store = Store(client, Keys("test"), "inst", FakeClock(), events_maxlen=1000)
        assert await store.load_scripts() is (renamed == "FCALL")
        await store.connect(ALICE)
        job_id = await store.put("default", 0, 0, 60, b"still")
        r = await store.reserve(ALICE)
        assert isinstance(r, Reservation) and (r.id, r.body) == (job_id, b"still")
        assert await store.delete(ALICE, job_id)
    finally:
        await client.close()
        own.stop()


async def test_a_restarted_redis_gets_the_library_back_once_for_every_store(
        tmp_path: Path) -> None:
    # A split namespace has a Store per shard on one connection: after a reconnect the client
    # loads the library once, before any store's call, and calls go by FCALL again at once.
    own = RedisProcess(tmp_path / "redis")
    own.start()
    client = await RedisClient.connect(own.url)
    raw = redis.asyncio.Redis.from_url(own.url)
    try:
        store = ShardedStore(client, "split", "inst", 4, FakeClock())
        assert await store.load_scripts()
        await raw.function_flush()  # restarted without it (its data files would keep it)
        await raw.aclose()
        own.stop()
        own.start()  # same port: the client reconnects
        raw = redis.asyncio.Redis.from_url(own.url)

        async def loaded() -> bool:
            try:
                return bool(await raw.function_list())
            except redis.exceptions.ConnectionError:
                return False

        await eventually(loaded, "the client loaded the library again")
        await store.connect(ALICE)
        assert await store.put("default", 0, 0, 60, b"back") > 0
        stats = await raw.info("commandstats")
        assert stats["cmdstat_function|load"]["calls"] == 1  # not once per shard's store
        assert "cmdstat_eval" not in stats  # no call needed the EVAL fallback
    finally:
        await raw.aclose()
        await client.close()
        own.stop()


async def test_a_handed_job_cancelled_before_its_claim_is_dropped_not_given_back(
        env: Env) -> None:
    """A put handed a job to a waiting connection, someone cancelled it (it is reserved: only
    marked), and the connection goes, or its process is reaped, before claiming it: the job
    goes with it (it used to be given back to ready, cancel's mark kept, and run again)."""
    s = env.store
    await s.set_waiting(BOB, 1)
    job_id = await env.put()
    assert await s.cancel(job_id) == 2  # reserved for BOB: marked
    assert await s.disconnect(BOB, False, False, []) == 1
    assert await s.job_info(job_id) is None
    ghost = Store(env.store.client, env.keys, "ghost", env.clock)
    await ghost.heartbeat()
    await ghost.connect("ghost:1")
    await ghost.set_waiting("ghost:1", 1)
    handed = await env.put()
    assert await s.cancel(handed) == 2
    env.clock.advance(3.5)
    await env.store.heartbeat()
    assert await env.store.reap(env.clock.now_ms - 3000) == 1
    assert await s.job_info(handed) is None


async def test_a_parents_end_for_a_child_deleted_while_held_is_dropped(env: Env) -> None:
    """The child was stored before its parent knew it (one shard): a child not found is gone,
    and its parent's end is not kept for it (tubeq.store.store.Store.tell_children)."""
    parent = await env.put()
    child = await put_after(env, parent)
    assert await env.store.delete(BOB, child)
    assert await env.store.delete(BOB, parent)  # ends unfinished: an end for the child left
    assert await env.raw.zcard(env.keys.parent_ends) == 1
    assert await env.store.tell_children() == (1, 0)
    assert await env.raw.zcard(env.keys.parent_ends) == 0
    assert not await env.raw.exists(env.keys.root + f"ae:{child}")  # nothing kept for it


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
@pytest.mark.parametrize("done", [True, False], ids=["finished", "buried"])
async def test_over_shards_an_end_that_comes_before_its_child_is_kept_for_its_put(
        redis_url: str, functions: bool, done: bool) -> None:
    """A child of another shard is told to its parents before it is stored
    (ShardedStore._put_after_far): a parent that ends in between leaves its end on the child's
    shard (k_early_ends), and the child's put reads it: ready at once after a finished parent,
    buried after one that ended otherwise. Both ways of calling the scripts (the EVALSHA
    build prunes each script to its own includes)."""
    client = await RedisClient.connect(redis_url)
    try:
        store = ShardedStore(client, f"split-after-{functions}-{done}", "inst", 4, FakeClock(),
                             functions=functions)
        await store.load_scripts()
        await store.connect(ALICE)
        tubes = {shard_of_tube(f"t{i}", 4): f"t{i}" for i in range(40)}
        parent = await store.put(tubes[0], 0, 0, 60, b"p")
        home = store.shards[1]
        child = await home.burn_id(tubes[1]) * 4 + 1  # as _put_after_far takes it
        assert await store.shards[0].add_child(child, 3_600_000, [parent]) == [PARENT_LIVING]
        assert isinstance(await store.reserve_job(ALICE, parent), Reservation)
        if done:
            assert await store.finish(ALICE, parent, b"r", 3_600_000) is not False
        else:
            assert await store.bury(ALICE, parent, 0)
        assert await store.tell_children() == (1, 0)  # handled: kept on the child's shard
        outcome = await store.put_with(tubes[1], 0, 0, 60, b"c", (
            ("after-far", str(parent)), ("after-keep", 3_600_000), ("id", child)))
        assert (outcome.id, outcome.inserted) == (child, True)
        info = await store.job_info(child)
        assert info is not None and info.state == ("ready" if done else "buried")
        assert not await client.call("EXISTS", home.keys.root + f"ae:{child}")
        # another shard's parent that had already ended when the child was put
        put = await store.put_with(tubes[1], 0, 0, 60, b"d", (
            ("after", str(parent)), ("after-keep", 3_600_000)))
        assert put.inserted and put.unknown_parent == 0
        again = await store.job_info(put.id)
        assert again is not None and again.state == ("ready" if done else "buried")
    finally:
        await client.close()


async def test_over_shards_a_refused_put_takes_its_child_back_from_the_parents(
        redis_url: str) -> None:
    """_put_after_far told the other shards' living parents of the child before the put was
    refused (an unknown parent, a duplicate key): they forget it again."""
    client = await RedisClient.connect(redis_url)
    try:
        store = ShardedStore(client, "split-undo", "inst", 4, FakeClock())
        await store.load_scripts()
        tubes = {shard_of_tube(f"t{i}", 4): f"t{i}" for i in range(40)}
        living = await store.put(tubes[0], 0, 0, 60, b"p")
        children = store.shards[0].keys.root + f"ch:{living}"
        keyed = await store.put_with(tubes[1], 0, 0, 60, b"k", (("key", "dup"),))
        assert keyed.inserted
        refusals = [
            ((("after", f"{living},{living + 400}"), ("after-keep", 1000)), "unknown"),
            ((("key", "dup"), ("after", str(living)), ("after-keep", 1000)), "duplicate")]
        for options, why in refusals:
            outcome = await store.put_with(tubes[1], 0, 0, 60, b"c", options)
            assert not outcome.inserted, why
            assert await client.call("SCARD", children) == 0, why
        assert (await store.put_with(tubes[1], 0, 0, 60, b"c", (
            ("after", str(living)), ("after-keep", 1000)))).inserted
        assert await client.call("SCARD", children) == 1
    finally:
        await client.close()
