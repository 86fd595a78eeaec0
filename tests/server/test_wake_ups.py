"""Wake-ups reach the reserves that can take the jobs: every blocked reserve of a tube is served
as soon as there are jobs for it, however many became ready at once and whoever else is
registered on the tube (tubeq.server.waiters; the hint's count, lua/includes/jobs.lua's wake).

Against a real Redis and one server process's context (tests/server/test_connection.py's fake
client), one shard and four: a kick, a pause's end, delayed jobs due together, TTRs running
out together, each with as many reserves as jobs; a push connection with no credit first in
the tube's line, or one whose client stopped reading, which take nothing; a capped tube, whose
freed slot wakes one reserve, not all; a tube whose limits let several jobs go at once (a kick,
a pause's end, delayed jobs due together), which wakes as many. A reserve not served within
the bound would have waited for the 10 s re-check or its timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.server.test_connection import Client
from tests.support.contexts import server_context
from tubeq.server.context import ServerContext
from tubeq.server.waiters import Waiter

# A reserve answers within this once its job is ready (the re-check a lost wake-up leaves it
# to is 10 s; the reserves' own timeout is RESERVE_TIMEOUT_S)
SERVED_WITHIN_S = 3.0
RESERVE_TIMEOUT_S = 5


@pytest.fixture(params=[1, 4], ids=["one-shard", "four-shards"])
async def ctx(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[ServerContext]:
    async with server_context(redis_url, f"wakes{request.param}", request.param) as ctx:
        yield ctx


async def _blocked(ctx: ServerContext, tube: str) -> Client:
    """A connection whose reserve-with-timeout on ``tube`` alone is sent (it blocks)."""
    client = Client(ctx)
    client.send(b"watch %s\r\nignore default\r\nreserve-with-timeout %d\r\n"
                % (tube.encode(), RESERVE_TIMEOUT_S))
    await client.until(lambda out: out.count(b"\r\n") >= 2)  # WATCHING, WATCHING
    client.transport.out.clear()
    return client


async def _answers(clients: list[Client]) -> list[bytes]:
    """Each client's first reply line once all have one, or SERVED_WITHIN_S has passed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + SERVED_WITHIN_S
    while loop.time() < end and not all(b"\r\n" in c.transport.out for c in clients):
        await asyncio.sleep(0.01)
    return [bytes(c.transport.out).split(b"\r\n")[0] for c in clients]


async def _blocked_all(ctx: ServerContext, tube: str, count: int) -> list[Client]:
    waiters = [await _blocked(ctx, tube) for _ in range(count)]
    for _ in range(100):  # until each has counted in (its first try came back empty)
        if ctx.registry.count() >= count:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    return waiters


async def _kicked_to_blocked(ctx: ServerContext, setup: bytes, puts: list[bytes]) -> list[bytes]:
    """``puts`` (after ``setup``) into tube k, reserved and buried; as many reserves blocked on
    k; then one kick of them all: each reserve's first reply line (see _answers)."""
    producer = Client(ctx)
    producer.send(setup + b"use k\r\nwatch k\r\n" + b"".join(puts) + b"reserve\r\n" * len(puts))
    out = await producer.until(lambda out: out.count(b"RESERVED") >= len(puts))
    held = [int(part.split(b" ")[0]) for part in out.split(b"RESERVED ")[1:]]
    producer.transport.out.clear()
    producer.send(b"".join(b"bury %d 0\r\n" % job for job in held))
    await producer.until(lambda out: out.count(b"BURIED") >= len(puts))
    waiters = await _blocked_all(ctx, "k", len(puts))
    producer.send(b"kick %d\r\n" % len(puts))
    return await _answers(waiters)


async def test_a_kick_of_three_serves_three_blocked_reserves(ctx: ServerContext) -> None:
    got = await _kicked_to_blocked(ctx, b"", [b"put 0 0 60 1\r\na\r\n"] * 3)
    assert all(line.startswith(b"RESERVED") for line in got), got


async def test_a_pause_ending_over_three_ready_jobs_serves_three_blocked_reserves(
        ctx: ServerContext) -> None:
    producer = Client(ctx)
    producer.send(b"use q\r\n" + b"put 0 0 60 1\r\na\r\n" * 3 + b"pause-tube q 1\r\n")
    await producer.until(lambda out: out.count(b"\r\n") >= 5)
    waiters = await _blocked_all(ctx, "q", 3)
    got = await _answers(waiters)  # the pause ends at 1 s
    assert all(line.startswith(b"RESERVED") for line in got), got


async def test_two_delayed_jobs_due_together_serve_two_blocked_reserves(
        ctx: ServerContext) -> None:
    waiters = await _blocked_all(ctx, "d", 2)
    producer = Client(ctx)
    producer.send(b"use d\r\nput 0 1 60 1\r\na\r\nput 0 1 60 1\r\nb\r\n")  # one read: one sweep
    await producer.until(lambda out: out.count(b"\r\n") >= 3)
    got = await _answers(waiters)
    assert all(line.startswith(b"RESERVED") for line in got), got


async def test_two_ttrs_running_out_together_serve_two_blocked_reserves(
        ctx: ServerContext) -> None:
    holder = Client(ctx)
    holder.send(b"use e\r\nwatch e\r\nput 0 0 1 1\r\na\r\nput 0 0 1 1\r\nb\r\n"
                b"reserve\r\nreserve\r\n")
    await holder.until(lambda out: out.count(b"RESERVED") >= 2)
    waiters = await _blocked_all(ctx, "e", 2)
    got = await _answers(waiters)  # both TTRs (1 s) run out together
    assert all(line.startswith(b"RESERVED") for line in got), got


async def _creditless_pusher(ctx: ServerContext, tube: bytes) -> Client:
    """A push connection on ``tube`` whose one credit is held: it takes nothing now."""
    pusher = Client(ctx)
    pusher.send(b"watch %s\r\nignore default\r\npush 1\r\n" % tube)
    await pusher.until(lambda out: b"RESERVED" in out)
    await asyncio.sleep(0.1)
    return pusher


async def test_a_push_loop_with_no_credit_does_not_take_a_releases_wake_up(
        ctx: ServerContext) -> None:
    """First in the tube's line, the push loop that can take nothing is passed by: the reserve
    behind it hears the release."""
    producer = Client(ctx)
    producer.send(b"use a\r\nwatch a\r\nput 0 0 60 1\r\nx\r\nput 0 0 60 1\r\ny\r\nreserve\r\n")
    out = await producer.until(lambda out: b"RESERVED" in out)
    held = int(out.split(b"RESERVED ")[1].split(b" ")[0])
    pusher = await _creditless_pusher(ctx, b"a")
    [reserve] = await _blocked_all(ctx, "a", 1)
    producer.send(b"release %d 0 0\r\n" % held)
    got = await _answers([reserve])
    assert got[0].startswith(b"RESERVED"), got
    del pusher


async def test_a_push_loop_with_no_credit_does_not_take_a_delayed_jobs_wake_up(
        ctx: ServerContext) -> None:
    """The same with a delayed job, while an older waiter on another tube is what the
    scheduler wakes first as the sweep goes out."""
    other = await _blocked(ctx, "other")
    producer = Client(ctx)
    producer.send(b"use a\r\nput 0 0 60 1\r\nx\r\n")
    await producer.until(lambda out: out.count(b"\r\n") >= 2)
    pusher = await _creditless_pusher(ctx, b"a")
    [reserve] = await _blocked_all(ctx, "a", 1)
    producer.send(b"put 0 1 60 1\r\ny\r\n")
    got = await _answers([reserve])
    assert got[0].startswith(b"RESERVED"), got
    del other, pusher


async def test_a_push_loop_whose_client_stopped_reading_passes_a_hint_on(
        ctx: ServerContext) -> None:
    """A push loop counted in (credit left, nothing ready) whose client stops taking replies
    cannot take a job: a hint that lands on it goes on to the reserve behind it."""
    producer = Client(ctx)
    producer.send(b"use a\r\nwatch a\r\nput 0 0 60 1\r\nx\r\nreserve\r\n")
    out = await producer.until(lambda out: b"RESERVED" in out)
    held = int(out.split(b"RESERVED ")[1].split(b" ")[0])
    pusher = Client(ctx)
    pusher.send(b"watch a\r\nignore default\r\npush 1\r\n")  # nothing ready: counted in
    await asyncio.sleep(0.2)
    [reserve] = await _blocked_all(ctx, "a", 1)
    pusher.conn.pause_writing()  # the client stops reading its replies
    producer.send(b"release %d 0 0\r\n" % held)
    got = await _answers([reserve])
    assert got[0].startswith(b"RESERVED"), got


async def test_a_slot_freed_on_a_capped_tube_wakes_one_waiter_not_all(
        ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tube with concurrency=1 and 30 jobs ready: a delete frees one slot, and one of the
    20 blocked reserves is woken for it, not every one (its ready count is not what it
    serves)."""
    producer = Client(ctx)
    producer.send(b"use c\r\nwatch c\r\ntube-set c concurrency=1\r\n"
                  + b"put 0 0 60 1\r\na\r\n" * 30 + b"reserve\r\n")
    out = await producer.until(lambda out: b"RESERVED" in out)
    held = int(out.split(b"RESERVED ")[1].split(b" ")[0])
    waiters = await _blocked_all(ctx, "c", 20)
    woken = 0
    wake = Waiter.wake

    def counting(self: Waiter) -> None:
        nonlocal woken
        woken += 1
        wake(self)

    monkeypatch.setattr(Waiter, "wake", counting)
    producer.send(b"delete %d\r\n" % held)
    await _answers(waiters[:1])
    await asyncio.sleep(0.3)
    assert sum(b"RESERVED" in c.transport.out for c in waiters) == 1
    assert woken <= 2, f"{woken} waiters woken for one free slot"


async def test_delayed_jobs_due_together_on_a_limited_tube_serve_as_many_reserves(
        ctx: ServerContext) -> None:
    """Three delayed jobs of a tube with a far limit (concurrency=100) fall due in one sweep:
    three blocked reserves are served (its hint counts what the limit lets go, not one)."""
    setup = Client(ctx)
    setup.send(b"tube-set l concurrency=100\r\n")
    await setup.until(lambda out: b"\r\n" in out)
    waiters = await _blocked_all(ctx, "l", 3)
    producer = Client(ctx)
    producer.send(b"use l\r\n" + b"put 0 1 60 1\r\na\r\n" * 3)  # one read: one due instant
    await producer.until(lambda out: out.count(b"\r\n") >= 4)
    got = await _answers(waiters)
    assert all(line.startswith(b"RESERVED") for line in got), got


async def test_two_delayed_jobs_of_a_limited_tube_with_an_older_waiter_on_another(
        ctx: ServerContext) -> None:
    """The scheduler's guess wakes the oldest waiter, which watches another tube: the two
    jobs of the limited tube still reach two of its three reserves."""
    [other] = await _blocked_all(ctx, "other", 1)
    setup = Client(ctx)
    setup.send(b"tube-set l concurrency=100\r\n")
    await setup.until(lambda out: b"\r\n" in out)
    waiters = await _blocked_all(ctx, "l", 3)
    producer = Client(ctx)
    producer.send(b"use l\r\n" + b"put 0 1 60 1\r\na\r\n" * 2)
    await producer.until(lambda out: out.count(b"\r\n") >= 3)
    loop = asyncio.get_running_loop()
    end = loop.time() + SERVED_WITHIN_S
    while loop.time() < end and sum(b"RESERVED" in c.transport.out for c in waiters) < 2:
        await asyncio.sleep(0.01)
    assert sum(b"RESERVED" in c.transport.out for c in waiters) == 2
    assert other.transport.out == b""


async def test_a_pause_ending_over_jobs_of_a_limited_tube_serves_as_many_reserves(
        ctx: ServerContext) -> None:
    producer = Client(ctx)
    producer.send(b"tube-set p concurrency=100\r\nuse p\r\n" + b"put 0 0 60 1\r\na\r\n" * 3
                  + b"pause-tube p 1\r\n")
    await producer.until(lambda out: out.count(b"\r\n") >= 6)
    waiters = await _blocked_all(ctx, "p", 3)
    got = await _answers(waiters)  # the pause ends at 1 s
    assert all(line.startswith(b"RESERVED") for line in got), got


@pytest.mark.parametrize("limit", [b"concurrency=100", b"rate=50", b"group-concurrency=2"])
async def test_a_kick_of_four_on_a_limited_tube_serves_four_reserves(
        ctx: ServerContext, limit: bytes) -> None:
    """Older than the scheduler's guess: a limited tube's hint said one job, so a kick (or
    anything making several ready at once) served some of its reserves and left the rest to
    their timeout. Group limits: two groups of two jobs, two each at most."""
    puts = [b"put-with 0 0 60 1 group=g%d\r\na\r\n" % (i % 2) for i in range(4)]
    got = await _kicked_to_blocked(ctx, b"tube-set k " + limit + b"\r\n", puts)
    assert all(line.startswith(b"RESERVED") for line in got), got
