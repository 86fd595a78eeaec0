"""Groups inside a tube (put-with group=, lua/includes/groups.lua) against a real Redis with a
clock the test moves: the round robin order, every move into and out of ready, group mode's
start and end, and the group limits (tube-set group-concurrency, group-rate). The fixture's
teardown checks the groups' invariants too (tests/support/job_counts.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources

import pytest

from tests.store.test_lua import ALICE, BOB, Env, open_env
from tests.support.job_counts import count_mismatches
from tubeq.model.states import JobState
from tubeq.store.records import NoJob, Reservation
from tubeq.store.scripts import expand

CAROL = "inst:3"


@pytest.fixture(params=[(1000, True), (0, False)], ids=["events-on", "events-off-evalsha"])
async def env(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    async with open_env(redis_url, *request.param) as opened:
        await opened.store.connect(CAROL)
        opened.clock.now_ms -= opened.clock.now_ms % 1000  # rate windows start at a second
        yield opened


async def gput(env: Env, group: str | None, pri: int = 0, tube: str = "default",
               delay_ms: int = 0) -> int:
    """A job put with ``group`` (None: a put-with without one)."""
    opts: list[tuple[str, int | str]] = [("delay-ms", delay_ms)] if delay_ms else []
    if group is not None:
        opts.append(("group", group))
    outcome = await env.store.put_with(tube, pri, 0, 60, b"x", tuple(opts))
    assert outcome.inserted
    return outcome.id


async def order(env: Env, n: int, token: str = ALICE) -> list[int]:
    """The ids of the next ``n`` reserves (each deleted at once), stopping at the first miss."""
    got = []
    for _ in range(n):
        r = await env.store.reserve(token)
        if not isinstance(r, Reservation):
            break
        got.append(r.id)
        assert await env.store.delete(token, r.id)
    return got


async def grouped(env: Env, tube: str = "default") -> bool:
    return await env.raw.hget(env.keys.tube(tube), "grp") is not None


async def limit(env: Env, **settings: int) -> None:
    await env.store.set_tube("default", tuple((k.replace("_", "-"), v)
                                               for k, v in settings.items()))


async def test_a_tube_without_groups_has_no_group_keys(env: Env) -> None:
    ids = [await env.put(pri=p) for p in (5, 1, 5, 1)]
    assert await order(env, 4) == [ids[1], ids[3], ids[0], ids[2]]
    assert not await grouped(env)
    assert await env.raw.keys("*:g*") == []


async def test_groups_take_turns_at_the_best_priority(env: Env) -> None:
    a = [await gput(env, "a") for _ in range(4)]
    b = [await gput(env, "b") for _ in range(2)]
    c = [await gput(env, "c")]
    assert await grouped(env)
    assert await order(env, 10) == [a[0], b[0], c[0], a[1], b[1], a[2], a[3]]


async def test_a_better_priority_goes_first_and_inside_a_group_pri_id_order(env: Env) -> None:
    a1 = await gput(env, "a", pri=5)
    a2 = await gput(env, "a", pri=5)
    b1 = await gput(env, "b", pri=5)
    b_urgent = await gput(env, "b", pri=1)  # b's best is now 1: b goes first
    a_urgent = await gput(env, "a", pri=1)
    # at pri 1: a's turn (1) before b's (2); then a was served, b at 1 goes; then at pri 5
    assert await order(env, 5) == [a_urgent, b_urgent, a1, b1, a2]


async def test_a_put_that_improves_its_groups_best_priority_may_lead(env: Env) -> None:
    a5 = await gput(env, "a", pri=5)  # a: the first turn, at priority 5
    b0 = await gput(env, "b", pri=0)  # b leads at priority 0
    a0 = await gput(env, "a", pri=0)  # a at priority 0 too, with the earlier turn: it leads
    peeked = await env.store.peek_state("ready", "default")
    assert peeked is not None and peeked[0] == a0
    assert await order(env, 3) == [a0, b0, a5]


async def test_jobs_without_a_group_are_one_group(env: Env) -> None:
    u = [await env.put() for _ in range(3)]  # before group mode: become the group ""
    g = [await gput(env, "g") for _ in range(2)]
    u.append(await gput(env, None))  # put-with without group= in group mode: group ""
    assert await order(env, 6) == [u[0], g[0], u[1], g[1], u[2], u[3]]


async def test_group_mode_ends_when_a_put_finds_the_tube_empty(env: Env) -> None:
    await gput(env, "a")
    await order(env, 1)
    assert await grouped(env)
    job = await env.put()  # a put without a group into an empty tube in group mode
    assert not await grouped(env)
    assert await env.raw.exists(env.keys.group_turns("default"),
                                env.keys.group_places("default")) == 0
    assert await order(env, 1) == [job]


async def test_group_mode_stays_while_a_job_of_a_group_lives(env: Env) -> None:
    g = await gput(env, "a")
    assert (await env.reserve()).id == g
    u = await env.put()  # g is reserved: the tube stays in group mode
    assert await grouped(env)
    assert await env.store.release(ALICE, g, 0, 0)
    assert await order(env, 2) == [u, g]


async def test_a_vanished_tube_takes_its_group_keys(env: Env) -> None:
    await gput(env, "a", tube="gone")
    await env.store.change_watches(ALICE, [("+w", "gone")])
    await order(env, 1)
    await env.store.change_watches(ALICE, [("-w", "gone")])
    assert await env.raw.keys("*gone*") == []


async def test_release_bury_kick_and_delete_keep_the_turns(env: Env) -> None:
    s = env.store
    a = [await gput(env, "a") for _ in range(3)]
    b = [await gput(env, "b") for _ in range(2)]
    r = await env.reserve()
    assert r.id == a[0]
    assert await s.release(ALICE, a[0], 0, 0)  # back into a, which went behind b
    r = await env.reserve()
    assert r.id == b[0]
    assert await s.bury(ALICE, b[0], 0)
    assert await s.delete(ALICE, a[1]) is True  # deleted from ready
    assert await s.kick("default", 1) == 1  # b[0] ready again, in b
    # turns: a (served first, turn 3), b (served, turn 4): a goes first at equal priority
    assert await order(env, 4) == [a[0], b[0], a[2], b[1]]


async def test_delayed_held_and_timed_out_jobs_rejoin_their_group(env: Env) -> None:
    s = env.store
    a1 = await gput(env, "a")
    a_late = await gput(env, "a", delay_ms=5000)
    b1 = await gput(env, "b")
    parent = await env.put(tube="other")
    held = (await s.put_with("default", 0, 0, 60, b"x", (
        ("after", str(parent)), ("after-keep", 3_600_000), ("group", "c")))).id
    assert await env.state(held) is JobState.HELD
    r = await env.reserve()
    assert r.id == a1
    env.clock.advance(61)  # a1's TTR runs out; a_late becomes due
    await s.expire()
    await s.promote()
    await s.change_watches(BOB, [("+w", "other"), ("-w", "default")])
    rp = await s.reserve(BOB)
    assert isinstance(rp, Reservation) and rp.id == parent
    assert await s.finish(BOB, parent, b"", 60_000) is True
    await s.tell_children()
    assert await env.state(held) is JobState.READY
    # a was served (turn 3), b (turn 2) waits first, then a's two, in (pri, id) order, and c
    assert await order(env, 5) == [b1, a1, held, a_late]


async def test_reserve_job_kick_job_and_change_pri_keep_the_groups(env: Env) -> None:
    s = env.store
    a = [await gput(env, "a") for _ in range(2)]
    b = [await gput(env, "b") for _ in range(2)]
    r = await s.reserve_job(ALICE, b[1])
    assert isinstance(r, Reservation) and r.id == b[1]
    assert await s.bury(ALICE, b[1], 0)
    assert await s.kick_job(b[1])
    assert await s.change_pri(a[1], 0) and await s.change_pri(b[0], 7)
    assert await s.change_pri(b[1], 3)
    # a's jobs are the only ones at priority 0; then b's, in (pri, id) order
    assert await order(env, 4) == [a[0], a[1], b[1], b[0]]


async def test_peek_ready_names_the_job_a_reserve_takes(env: Env) -> None:
    a = [await gput(env, "a") for _ in range(2)]
    b = await gput(env, "b")
    await order(env, 1)
    peeked = await env.store.peek_state("ready", "default")
    assert peeked is not None and peeked[0] == b
    assert await order(env, 2) == [b, a[1]]


async def test_clear_tube_empties_the_groups(env: Env) -> None:
    for g in ("a", "b", "a", ""):
        await gput(env, g or None)
    assert await env.store.clear_tube("default", ["ready"]) == 4
    assert await env.raw.hlen(env.keys.group_places("default")) == 0
    job = await gput(env, "b")
    assert await order(env, 2) == [job]


async def test_clear_tube_in_batches_keeps_the_other_groups(env: Env) -> None:
    jobs = [await gput(env, g) for g in ("a", "b") * 3]
    await env.store.clear_tube_batch("default", ["r"], limit=3)
    assert await order(env, 3) == [jobs[4], jobs[3], jobs[5]]


async def test_a_put_many_puts_each_job_in_its_group(env: Env) -> None:
    u = await env.put()  # ready before group mode: the group ""
    ids = await env.store.put_many("default", [(0, 0, 60, b"x")] * 5,
                                   groups=["a", "a", "", "b", "a"])
    assert await grouped(env)
    later = await env.store.put_many("default", [(0, 0, 60, b"y")])  # no groups: group ""
    assert await order(env, 8) == [u, ids[0], ids[3], ids[2], ids[1], later[0], ids[4]]


async def test_a_put_many_without_groups_ends_group_mode_in_an_empty_tube(env: Env) -> None:
    await gput(env, "a")
    await order(env, 1)
    ids = await env.store.put_many("default", [(0, 0, 60, b"x")] * 2)
    assert not await grouped(env)
    assert await order(env, 2) == ids


async def test_a_connection_watching_several_tubes_gets_pri_id_order_across(env: Env) -> None:
    await env.store.change_watches(ALICE, [("+w", "x")])
    a = [await gput(env, "a", pri=2) for _ in range(2)]
    x = await env.put(tube="x", pri=1)
    b = await gput(env, "b", pri=2)
    x2 = await env.put(tube="x", pri=2)
    # x's job of pri 1 first; then at pri 2 each tube's head by id: a[0] (default), then
    # default's next group head b (id < x2), x2, a[1]
    assert await order(env, 5) == [x, a[0], b, a[1], x2]


async def test_a_push_take_of_several_serves_the_groups_in_turns(env: Env) -> None:
    a = [await gput(env, "a") for _ in range(3)]
    b = [await gput(env, "b") for _ in range(2)]
    got = await env.store.reserve_many(ALICE, 4)
    assert [r.id for r in got] == [a[0], b[0], a[1], b[1]]


async def test_a_waiting_connection_is_handed_a_job_of_a_group(env: Env) -> None:
    await env.store.set_waiting(ALICE, 1)
    job = await gput(env, "a")
    got = await env.store.reserve(ALICE)
    assert isinstance(got, Reservation) and got.id == job


# -- group limits ------------------------------------------------------------------------------

async def test_group_concurrency_holds_a_group_at_its_cap(env: Env) -> None:
    await limit(env, group_concurrency=1)
    a = [await gput(env, "a") for _ in range(3)]
    b = [await gput(env, "b") for _ in range(2)]
    s = env.store
    assert (await env.reserve(ALICE)).id == a[0]
    assert (await env.reserve(BOB)).id == b[0]
    assert isinstance(await s.reserve(CAROL), NoJob)  # both at their cap: nothing reservable
    assert await env.raw.zrange(env.keys.ready_tubes, 0, -1) == []
    counts = await s.tube_counts("default")
    assert counts is not None and counts[1] == 3  # still ready
    # every end of a reservation frees its group's place
    assert await s.delete(ALICE, a[0])
    assert (await env.reserve(CAROL)).id == a[1]
    assert await s.release(BOB, b[0], 0, 0)
    assert (await env.reserve(BOB)).id == b[0]
    assert await s.bury(CAROL, a[1], 0)
    assert (await env.reserve(CAROL)).id == a[2]
    assert await s.disconnect(CAROL, False, False, [a[2]]) == 1
    assert (await env.reserve(ALICE)).id == a[2]
    env.clock.advance(61)
    await s.expire()  # both reservations time out
    assert (await env.reserve(ALICE)).id == b[0]
    assert (await env.reserve(ALICE)).id == a[2]
    assert isinstance(await s.reserve(BOB), NoJob)
    assert await s.delete_many(ALICE, [a[2], b[0]]) is not None
    assert (await env.reserve(BOB)).id == b[1]


async def test_finish_fail_and_a_reserve_by_id_count_for_the_group(env: Env) -> None:
    await limit(env, group_concurrency=1)
    s = env.store
    a = [await gput(env, "a") for _ in range(3)]
    got = await s.reserve_job(ALICE, a[2])
    assert isinstance(got, Reservation)
    assert isinstance(await s.reserve(BOB), NoJob)
    assert await s.finish(ALICE, a[2], b"ok", 1000) is True
    assert (await env.reserve(BOB)).id == a[0]
    assert await s.fail(BOB, a[0], b"boom") is not None
    assert (await env.reserve(BOB)).id == a[0]  # fail put it back (no retry policy: ready)


async def test_a_turns_finishes_free_their_groups_places_as_lone_ones_do(env: Env) -> None:
    """finish_many (a connection's finishes of one read) ends each reservation as a lone
    finish does: both groups at their cap get their places back, and the reserve limits' index finds
    the tube again."""
    await limit(env, group_concurrency=1)
    s = env.store
    a = [await gput(env, "a") for _ in range(2)]
    b = [await gput(env, "b") for _ in range(2)]
    assert (await env.reserve(ALICE)).id == a[0]
    assert (await env.reserve(ALICE)).id == b[0]
    assert isinstance(await s.reserve(BOB), NoJob)  # both groups at their cap
    assert await s.finish_many(ALICE, [(a[0], b"x"), (b[0], b"y"), (a[0], b"z")], 1000) == [
        True, True, False]
    assert {(await env.reserve(BOB)).id, (await env.reserve(BOB)).id} == {a[1], b[1]}


async def test_raising_the_cap_brings_parked_groups_back_at_once(env: Env) -> None:
    await limit(env, group_concurrency=1)
    a = [await gput(env, "a") for _ in range(2)]
    assert (await env.reserve()).id == a[0]
    assert isinstance(await env.store.reserve(BOB), NoJob)
    await limit(env, group_concurrency=2)
    assert (await env.reserve(BOB)).id == a[1]
    await limit(env, group_concurrency=0)
    assert await env.raw.hget(env.keys.tube("default"), "lim") is None


async def test_group_rate_holds_a_group_until_its_second_ends(env: Env) -> None:
    await limit(env, group_rate=2)
    a = [await gput(env, "a") for _ in range(4)]
    b = [await gput(env, "b") for _ in range(3)]
    assert await order(env, 10) == [a[0], b[0], a[1], b[1]]
    timers = await env.raw.zrange(env.keys.timers, 0, -1, withscores=True)
    assert (b"l:default", float(env.clock.now_ms + 1000)) in timers
    env.clock.advance(1)
    _due, woken = await env.store.promote()
    assert "default" in woken
    assert await order(env, 10) == [a[2], b[2], a[3]]


async def test_group_limits_leave_a_tube_without_groups_alone(env: Env) -> None:
    await limit(env, group_concurrency=1)
    ids = [await env.put() for _ in range(3)]
    assert [(await env.reserve(t)).id for t in (ALICE, BOB, CAROL)] == ids


async def test_the_teardown_check_sees_a_group_out_of_step(env: Env, redis_url: str) -> None:
    a = await gput(env, "a")
    await gput(env, "b")
    key = env.keys.group_ready("default", "a")
    member = await env.raw.zrange(key, 0, 0)
    await env.raw.zrem(key, *member)
    wrong = count_mismatches(redis_url)
    assert any("groups of default" in line for line in wrong), wrong
    await env.raw.zadd(key, {member[0]: 0})
    assert count_mismatches(redis_url) == []
    assert (await env.reserve()).id == a


async def test_the_group_keys_of_lua_and_python_agree(env: Env) -> None:
    keys_lua = resources.files("tubeq.store").joinpath("lua", "includes", "keys.lua").read_text()
    probe = expand(keys_lua + """
return {k_group_ready(ARGV[1], ARGV[2]), k_group_turns(ARGV[1]), k_group_places(ARGV[1]),
        k_group_reserved(ARGV[1]), k_group_windows(ARGV[1])}""")
    k = env.keys
    names = await env.raw.eval(probe, 1, k.root, "a-tube", "tenant-7")
    assert [n.decode() for n in names] == [
        k.group_ready("a-tube", "tenant-7"), k.group_turns("a-tube"), k.group_places("a-tube"),
        k.group_reserved("a-tube"), k.group_windows("a-tube")]


async def test_a_limit_removed_and_set_again_does_not_strand_a_group(env: Env,
                                                                    redis_url: str) -> None:
    """A reservation counted under group-concurrency, ended after the limit was removed, is
    counted out all the same: setting the limit again finds the group free (it used to stay
    at its cap for good, its job never reserved)."""
    await limit(env, group_concurrency=1)
    first, second = await gput(env, "a"), await gput(env, "a")
    assert (await env.store.reserve(ALICE)).id == first  # type: ignore[union-attr]
    await limit(env, group_concurrency=0)
    assert await env.store.delete(ALICE, first)
    assert await env.raw.hlen(env.keys.group_reserved("default")) == 0
    await limit(env, group_concurrency=1)
    assert await order(env, 2) == [second]
    assert count_mismatches(redis_url) == []


async def test_rate_windows_are_kept_for_recent_groups_only(env: Env) -> None:
    """group-concurrency alone keeps no rate windows; with group-rate, windows of past seconds
    go as new ones are written (one group per tenant must not grow the hash for good)."""
    await limit(env, group_concurrency=5)
    await gput(env, "keep")  # the tube stays in group mode
    for n in range(20):
        await gput(env, f"g{n}")
    assert len(await order(env, 21)) == 21
    assert await env.raw.hlen(env.keys.group_windows("default")) == 0
    await limit(env, group_rate=1000)
    for second in range(30):
        env.clock.advance(1)
        await gput(env, f"t{second}")
        assert len(await order(env, 1)) == 1
    # 30 groups reserved in 30 seconds: at most one window is of the current second, so two
    # distinct picks out of three or more entries take at least one out: never more than 3
    assert await env.raw.hlen(env.keys.group_windows("default")) <= 3
