"""Per-tube reserve limits (tube-set rate= concurrency=): the Lua side with a clock the test
moves (what holds a tube, what releases it, its wake-ups, two processes on one Redis), then
through real tubeq processes with several connections."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis

from tests.store.test_lua import ALICE, BOB, Env, open_env
from tests.support.servers import ServerProcess, TubeqCluster, unique_prefix
from tests.support.wire import Wire
from tubeq.model.states import JobState
from tubeq.redisio.client import RedisClient
from tubeq.store.keys import Keys
from tubeq.store.records import NoJob, Reservation
from tubeq.store.store import Store

CAROL = "inst:3"


@pytest.fixture(params=[1000, 0], ids=["events-on", "events-off"])
async def env(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    async with open_env(redis_url, request.param) as opened:
        await opened.store.connect(CAROL)
        # the clock at the start of a whole second, so rate windows are easy to follow
        opened.clock.now_ms -= opened.clock.now_ms % 1000
        yield opened


async def limit(env: Env, **settings: int) -> None:
    await env.store.set_tube("default", tuple((k, v) for k, v in settings.items()))


async def takes(env: Env, token: str) -> bool:
    return isinstance(await env.store.reserve(token), Reservation)


async def entries(env: Env) -> list[bytes]:
    return list(await env.raw.zrange(env.keys.ready_tubes, 0, -1))


async def test_a_tube_without_limits_carries_no_flag(env: Env) -> None:
    await env.put()
    await env.reserve()
    assert await env.raw.hget(env.keys.tube("default"), "lim") is None
    await limit(env, concurrency=5)
    assert await env.raw.hget(env.keys.tube("default"), "lim") == b"1"
    await limit(env, concurrency=0)
    assert await env.raw.hget(env.keys.tube("default"), "lim") is None


async def test_the_concurrency_cap_holds_the_tube_until_a_reserved_job_leaves(env: Env) -> None:
    await limit(env, concurrency=2)
    ids = [await env.put() for _ in range(8)]
    assert await takes(env, ALICE) and await takes(env, ALICE)
    assert isinstance(await env.store.reserve(BOB), NoJob)
    assert await entries(env) == []  # out of the index: nobody spins on it
    counts = await env.store.tube_counts("default")
    assert counts is not None and counts[1:3] == [6, 2]  # ready, reserved
    s = env.store
    # each way out of reserved frees a place at once
    assert await s.delete(ALICE, ids[0])
    assert await takes(env, BOB) and not await takes(env, CAROL)
    assert await s.release(ALICE, ids[1], 0, 0)
    assert await takes(env, CAROL) and not await takes(env, CAROL)
    assert await s.bury(BOB, ids[2], 0)
    assert await takes(env, BOB) and not await takes(env, ALICE)
    assert await s.disconnect(CAROL, False, False, [ids[1]]) == 1
    assert await takes(env, ALICE) and not await takes(env, ALICE)
    env.clock.advance(61)  # both reservations time out
    await s.expire()
    assert await takes(env, ALICE) and await takes(env, BOB) and not await takes(env, ALICE)


async def test_the_rate_limit_holds_the_tube_until_its_window_ends(env: Env) -> None:
    await limit(env, rate=3)
    for _ in range(10):
        await env.put()
    start = env.clock.now_ms
    env.clock.advance(0.2)
    for _ in range(3):
        assert await takes(env, ALICE)
    assert not await takes(env, BOB)
    assert await entries(env) == []
    assert await env.raw.zscore(env.keys.timers, "l:default") == start + 1000
    env.clock.now_ms = start + 999
    next_due, woken = await env.store.promote()
    assert (next_due, woken) == (start + 1000, [])
    assert not await takes(env, BOB)
    env.clock.now_ms = start + 1000
    next_due, woken = await env.store.promote()
    assert woken == ["default"]
    assert await env.raw.zscore(env.keys.timers, "l:default") is None
    for _ in range(3):
        assert await takes(env, BOB)
    assert not await takes(env, BOB)


async def test_rate_windows_are_the_clocks_whole_seconds(env: Env) -> None:
    await limit(env, rate=2)
    for _ in range(6):
        await env.put()
    env.clock.advance(0.998)
    assert await takes(env, ALICE) and await takes(env, ALICE) and not await takes(env, ALICE)
    env.clock.advance(0.002)  # the next second: a new window, opened by the timer
    assert await env.store.promote() == (-1, ["default"])
    assert await takes(env, ALICE) and await takes(env, ALICE) and not await takes(env, ALICE)


async def test_both_limits_at_once(env: Env) -> None:
    await limit(env, rate=2, concurrency=1)
    ids = [await env.put() for _ in range(6)]
    assert await takes(env, ALICE) and not await takes(env, ALICE)  # the cap
    assert await env.store.delete(ALICE, ids[0])
    assert await takes(env, ALICE)
    assert await env.store.delete(ALICE, ids[1])
    assert not await takes(env, ALICE)  # the rate now, with its timer armed
    assert await env.raw.zscore(env.keys.timers, "l:default") is not None


async def test_limit_changes_take_effect_at_once(env: Env) -> None:
    for _ in range(6):
        await env.put()
    assert await takes(env, ALICE) and await takes(env, ALICE)
    await limit(env, concurrency=2)  # lowered to what is reserved: held now
    assert not await takes(env, BOB)
    await limit(env, concurrency=3)  # raised: one more
    assert await takes(env, BOB) and not await takes(env, BOB)
    await limit(env, concurrency=0)  # removed
    assert await takes(env, BOB)
    await limit(env, rate=1)
    assert not await takes(env, BOB)  # four reserves in this window already
    await limit(env, rate=0)
    assert await takes(env, BOB)


async def test_a_limit_change_wakes_the_tubes_waiters(env: Env) -> None:
    await limit(env, concurrency=1)
    await env.put()
    await env.put()
    await env.reserve()
    pubsub = env.raw.pubsub()
    await pubsub.subscribe(env.keys.wake_channel("default"))
    await pubsub.get_message(timeout=1)  # the subscribe confirmation
    await env.store.set_waiting(BOB, 1)
    await limit(env, concurrency=2)
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["type"] == "message"
    await pubsub.aclose()


async def test_a_held_tube_wakes_its_waiters_when_it_comes_back(env: Env) -> None:
    await limit(env, concurrency=1, rate=5)
    ids = [await env.put() for _ in range(3)]
    await env.reserve()
    pubsub = env.raw.pubsub()
    await pubsub.subscribe(env.keys.wake_channel("default"), env.keys.due_channel)
    for _ in range(2):
        await pubsub.get_message(timeout=1)  # the subscribe confirmations
    await env.store.set_waiting(BOB, 1)
    assert await env.store.delete(ALICE, ids[0])  # below the cap again
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["channel"] == env.keys.wake_channel("default").encode()
    await limit(env, concurrency=0, rate=1)  # one reserve done this window: held by the rate
    message = await pubsub.get_message(timeout=2)  # the rate window's end, for the schedulers
    assert message is not None and message["channel"] == env.keys.due_channel.encode()
    window_end = int(message["data"])
    assert window_end == env.clock.now_ms - env.clock.now_ms % 1000 + 1000
    env.clock.now_ms = window_end
    await env.store.promote()
    message = await pubsub.get_message(timeout=2)
    assert message is not None and message["channel"] == env.keys.wake_channel("default").encode()
    await pubsub.aclose()


async def test_a_held_tube_gets_no_job_handed_over_by_put(env: Env) -> None:
    await limit(env, concurrency=1)
    await env.put()
    await env.reserve()
    await env.store.set_waiting(BOB, 1)
    job_id = await env.put()
    assert await env.state(job_id) is JobState.READY
    assert await env.store.set_waiting(BOB, -1, claim=True) == []


async def test_a_push_batch_stops_at_the_cap(env: Env) -> None:
    await limit(env, concurrency=3)
    for _ in range(10):
        await env.put()
    assert len(await env.store.reserve_many(ALICE, 10)) == 3
    assert await env.store.reserve_many(BOB, 10) == []


async def test_a_held_tube_does_not_hide_the_other_watched_tubes(env: Env) -> None:
    await limit(env, concurrency=1)
    await env.store.change_watches(ALICE, [("+w", "other")])
    await env.put(pri=0)
    await env.put(pri=0)
    other = await env.put("other", pri=99)
    assert (await env.reserve()).id == 1
    assert (await env.reserve()).id == other


async def test_reserve_job_ignores_the_limits_but_counts_against_them(env: Env) -> None:
    await limit(env, concurrency=1)
    ids = [await env.put() for _ in range(3)]
    assert await takes(env, ALICE)
    assert isinstance(await env.store.reserve_job(BOB, ids[2]), Reservation)
    assert await env.store.delete(ALICE, ids[0])
    assert not await takes(env, ALICE)  # still one reserved: at the cap


async def test_limits_outlive_the_tube_as_settings_do(env: Env) -> None:
    await env.store.set_tube("fleeting", (("concurrency", 1),))
    await env.store.change_watches(ALICE, [("+w", "fleeting")])
    await env.put("fleeting")
    await env.put("fleeting")
    assert await takes(env, ALICE) and not await takes(env, ALICE)
    assert await env.raw.hget(env.keys.tube("fleeting"), "lim") == b"1"


async def test_two_processes_never_reserve_past_the_cap(redis_url: str) -> None:
    keys = Keys("lim2")
    clients = [await RedisClient.connect(redis_url) for _ in range(2)]
    stores = [Store(c, keys, name) for c, name in zip(clients, ("pa", "pb"), strict=True)]
    try:
        for store in stores:
            await store.load_scripts()
            await store.heartbeat()
        tokens = [(store, f"{store.instance_id}:{n}") for store in stores for n in range(8)]
        for store, token in tokens:
            await store.connect(token)
        await stores[0].set_tube("default", (("concurrency", 3),))
        for _ in range(40):
            await stores[0].put("default", 0, 0, 60, b"x")
        for _ in range(5):
            got = await asyncio.gather(*(s.reserve(t) for s, t in tokens))
            held = [(s, t, r) for (s, t), r in zip(tokens, got, strict=True)
                    if isinstance(r, Reservation)]
            assert len(held) == 3
            await asyncio.gather(*(s.delete(t, r.id) for s, t, r in held))
    finally:
        for c in clients:
            await c.close()


# -- through real tubeq processes ------------------------------------------------------------


@pytest.fixture
def two_servers(tubeq_cluster: TubeqCluster) -> Iterator[list[ServerProcess]]:
    prefix = unique_prefix("lim")
    servers = [tubeq_cluster.start(prefix, label=f"tubeq-lim-{n}") for n in (1, 2)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def _workers(servers: list[ServerProcess], per_server: int, tube: str,
             work: Any) -> list[threading.Thread]:
    threads = [threading.Thread(target=work, args=(s, tube), daemon=True)
               for s in servers for _ in range(per_server)]
    for t in threads:
        t.start()
    return threads


def test_concurrency_cap_across_connections_and_processes(
        two_servers: list[ServerProcess]) -> None:
    cap, jobs, tube = 2, 12, "lim-cap"
    held, peak, done = [0], [0], [0]
    lock = threading.Lock()

    def work(server: ServerProcess, tube: str) -> None:
        with Wire(server.host, server.port) as w:
            w.ask(f"watch {tube}")
            w.ask("ignore default")
            for _ in range(jobs):  # bounded: at most every job by this worker
                reply = w.ask("reserve-with-timeout 1")
                if not reply.startswith(b"RESERVED"):
                    return
                with lock:
                    held[0] += 1
                    peak[0] = max(peak[0], held[0])
                time.sleep(0.03)
                with lock:
                    held[0] -= 1  # before the delete is sent: never more than the server's
                    done[0] += 1
                assert w.ask(f"delete {int(reply.split()[1])}") == b"DELETED\r\n"

    with Wire(two_servers[0].host, two_servers[0].port) as admin:
        assert admin.ask(f"tube-set {tube} concurrency={cap}") == b"SET\r\n"
        admin.ask(f"use {tube}")
        for n in range(jobs):
            assert admin.ask(f"put 0 0 60 1\r\n{n % 10}").startswith(b"INSERTED")
        threads = _workers(two_servers, 3, tube, work)
        observed = 0
        while any(t.is_alive() for t in threads):
            stats = admin.yaml(f"stats-tube {tube}")
            observed = max(observed, int(stats["current-jobs-reserved"]))
            time.sleep(0.01)
    assert done[0] == jobs
    assert 1 <= peak[0] <= cap and observed <= cap


def test_rate_limit_across_connections_and_processes(
        two_servers: list[ServerProcess]) -> None:
    rate, jobs, tube, ttr = 4, 10, "lim-rate", 100
    got: list[int] = []
    granted: list[int] = []  # when each was granted, by the server's clock
    lock = threading.Lock()
    r = redis.Redis.from_url(two_servers[0].extra["redis_url"])
    keys = Keys(two_servers[0].extra["prefix"])
    all_taken = threading.Event()
    workers = 6
    closing = threading.Barrier(workers)

    def work(server: ServerProcess, tube: str) -> None:
        with Wire(server.host, server.port) as w:
            w.ask(f"watch {tube}")
            w.ask("ignore default")
            deadline = time.monotonic() + 10
            # Each job stays reserved (only the rate limits), and every connection stays open
            # until every worker has stopped reserving: closing one gives its jobs back.
            while not all_taken.is_set() and time.monotonic() < deadline:
                reply = w.ask("reserve-with-timeout 1")
                if reply.startswith(b"RESERVED"):
                    job_id = int(reply.split()[1])
                    deadline_ms = int(r.hget(keys.job(job_id), "u") or 0)  # held: stays
                    with lock:
                        got.append(job_id)
                        granted.append(deadline_ms - ttr * 1000)  # TTR deadline less the TTR
                        if len(got) == jobs:
                            all_taken.set()
            closing.wait(timeout=15)

    with Wire(two_servers[0].host, two_servers[0].port) as admin:
        assert admin.ask(f"tube-set {tube} rate={rate}") == b"SET\r\n"
        admin.ask(f"use {tube}")
        for _ in range(jobs):
            assert admin.ask(f"put 0 0 {ttr} 1\r\nx").startswith(b"INSERTED")
        for t in _workers(two_servers, workers // 2, tube, work):
            t.join(timeout=20)
    r.close()
    assert sorted(got) == sorted(set(got)) and len(got) == jobs
    windows: dict[int, int] = {}
    for at in granted:
        windows[at // 1000] = windows.get(at // 1000, 0) + 1
    assert max(windows.values()) <= rate
    assert len(windows) >= -(-jobs // rate)


# -- blocked reserves through a real tubeq: each way a held tube comes back wakes them ----------


def _blocked_reserve(server: ServerProcess, tube: str, timeout_s: int) -> tuple[Wire, Any]:
    """A connection whose reserve-with-timeout on ``tube`` is under way; the result's
    ``[0]`` is its reply once it came."""
    w = Wire(server.host, server.port)
    w.ask(f"watch {tube}")
    w.ask("ignore default")
    reply: list[bytes] = []
    thread = threading.Thread(target=lambda: reply.append(w.ask(f"reserve-with-timeout "
                                                                 f"{timeout_s}")), daemon=True)
    thread.start()
    time.sleep(0.2)  # it is waiting by now (not asserted: the reply below says what happened)
    return w, (thread, reply)


def _reply_of(waiting: Any) -> bytes:
    thread, reply = waiting
    thread.join(timeout=10)
    return reply[0] if reply else b"(none)"


@pytest.mark.parametrize("release", ["delete", "release", "bury", "tube-set", "quit"])
def test_a_reserve_blocked_by_the_cap_gets_a_job_when_a_place_frees(
        server: ServerProcess, release: str) -> None:
    tube = f"lim-wake-{release}"
    with Wire(server.host, server.port) as holder, Wire(server.host, server.port) as admin:
        assert admin.ask(f"tube-set {tube} concurrency=1") == b"SET\r\n"
        admin.ask(f"use {tube}")
        first = int(admin.ask("put 0 0 60 1\r\na").split()[1])
        admin.ask("put 0 0 60 1\r\nb")
        holder.ask(f"watch {tube}")
        assert holder.ask(f"reserve-job {first}").startswith(b"RESERVED")
        waiter, waiting = _blocked_reserve(server, tube, 5)
        try:
            assert waiting[0].is_alive()  # held by the cap, not answered
            if release == "delete":
                assert holder.ask(f"delete {first}") == b"DELETED\r\n"
            elif release == "release":
                assert holder.ask(f"release {first} 0 0") == b"RELEASED\r\n"
            elif release == "bury":
                assert holder.ask(f"bury {first} 0") == b"BURIED\r\n"
            elif release == "tube-set":
                assert admin.ask(f"tube-set {tube} concurrency=2") == b"SET\r\n"
            else:
                holder.send("quit")
            assert _reply_of(waiting).startswith(b"RESERVED")
        finally:
            waiter.sock.close()


def test_a_reserve_blocked_by_the_rate_gets_a_job_when_the_second_ends(
        server: ServerProcess) -> None:
    tube = "lim-wake-rate"
    with Wire(server.host, server.port) as w, Wire(server.host, server.port) as admin:
        assert admin.ask(f"tube-set {tube} rate=1") == b"SET\r\n"
        admin.ask(f"use {tube}")
        admin.ask("put 0 0 60 1\r\na")
        admin.ask("put 0 0 60 1\r\nb")
        w.ask(f"watch {tube}")
        # one reserve in this second; the second reserve waits for the next one
        assert w.ask("reserve-with-timeout 0").startswith(b"RESERVED")
        if w.ask("reserve-with-timeout 0") == b"TIMED_OUT\r\n":  # not a new second already
            assert w.ask("reserve-with-timeout 3").startswith(b"RESERVED")


@pytest.mark.parametrize(("line", "reply"), [
    ("tube-set lim-err rate=-1", b"BAD_OPTION rate\r\n"),
    ("tube-set lim-err rate=4294967296", b"BAD_OPTION rate\r\n"),
    ("tube-set lim-err concurrency=x", b"BAD_OPTION concurrency\r\n"),
    ("tube-set lim-err concurrency=1 concurrency=2", b"BAD_OPTION concurrency\r\n"),
    ("tube-set lim-err rate", b"BAD_FORMAT\r\n"),
    ("tube-set -lim rate=1", b"BAD_FORMAT\r\n"),
])
def test_refused_limits_change_nothing(server: ServerProcess, line: str, reply: bytes) -> None:
    with Wire(server.host, server.port) as w:
        assert w.ask(line) == reply
        w.ask("use lim-err")
        w.ask("put 0 0 60 1\r\nx")
        w.ask("watch lim-err")
        assert w.ask("reserve-with-timeout 0").startswith(b"RESERVED")
        w.ask("extensions")
        stats = w.yaml("stats-tube lim-err")
        assert (stats["rate"], stats["concurrency"]) == ("0", "0")
