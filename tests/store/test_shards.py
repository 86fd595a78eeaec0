"""A namespace split into shards (``tubeq --shards N``, tubeq.store.shards) on one real Redis.

What must hold: jobs live under their tube's shard root and their ids name that shard; every
command that names an id reaches it; a reserve over tubes of several shards takes the best job
in (pri, put order); a reserve blocked over several shards is woken by a put on any of them;
a disconnect gives back what it held in every shard; stats and list-tubes cover all shards; a
process started with another shard count refuses to start. The differential beanstalkd suite
runs against a split namespace too (the last test: a nested pytest run).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
import redis

from tests.redisio.test_startup_checks import assert_one_clear_line
from tests.support.client_support import connected, tube_settles
from tests.support.http_support import running_server
from tests.support.servers import (
    TEST_SHARDS_ENV,
    ServerProcess,
    TubeqCluster,
    run_differential_suite,
    unique_prefix,
)
from tubeq.client import Client, NotFound, TimedOut
from tubeq.redisio.client import RedisClient
from tubeq.server.reserves import ReserveOwner, ReserveQueue
from tubeq.server.waiters import WaiterRegistry
from tubeq.store.base import JobStore
from tubeq.store.keys import Keys
from tubeq.store.shards import DEFAULT_TUBE, ShardedStore, shard_of_id, shard_of_tube, shard_prefix
from tubeq.store.store import Store

SHARDS = 4

pytestmark = pytest.mark.usefixtures("skip_unless_tubeq")


def tubes_in_distinct_shards(count: int, stem: str) -> list[str]:
    """``count`` tube names, each in a shard none of the others (nor ``default``) is in."""
    taken = {shard_of_tube(DEFAULT_TUBE, SHARDS)}
    names: list[str] = []
    n = 0
    while len(names) < count:
        name = f"{stem}-{n}"
        n += 1
        if shard_of_tube(name, SHARDS) not in taken:
            taken.add(shard_of_tube(name, SHARDS))
            names.append(name)
    return names


@pytest.fixture
def split_server(tubeq_cluster: TubeqCluster) -> ServerProcess:
    return tubeq_cluster.start(unique_prefix("tq-shard"), label="tubeq-shards",
                               flags=("--shards", str(SHARDS)))


@pytest.fixture
async def admin(split_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client(*split_server.address) as client:
        yield client


def _public(cls: type) -> set[str]:
    """The public members ``cls`` defines or inherits (methods, properties, class attributes)."""
    return {name for name in dir(cls) if not name.startswith("_")}


def _declared(protocol: type) -> set[str]:
    """What a Protocol lists: its methods and properties, and its annotated attributes."""
    return {name for name in (*vars(protocol), *protocol.__annotations__)
            if not name.startswith("_")}


# The split store's own members, which no other layer reaches through a JobStore: routing by
# tube and by id, and the swap of a shard's client when a cluster slot moves (Server).
SPLIT_ONLY = {"count", "home", "shards", "of_tube", "of_id", "rebind"}
# Store's own members: one Redis root's client, keys and script loading, which a split store
# holds per shard.
ROOT_ONLY = {"client", "events_maxlen", "holds_default", "wants_functions", "calls_functions",
             # the steps of a dependency that span shards (put-with after=), which the split
             # store calls shard by shard: ShardedStore._put_after_far, tell_children
             "add_child", "parent_ends", "after_end"}


async def test_every_store_call_is_routed() -> None:
    """JobStore lists every public Store member, and ShardedStore defines each one itself (it
    inherits nothing: composition, so mypy rejects a member it lacks wherever it is held as a
    JobStore), none falling through to keys of the unsplit namespace, where a split namespace
    keeps nothing. And the split store has no public member the interface does not declare,
    beyond its routing."""
    declared = _declared(JobStore)
    assert ShardedStore.__mro__ == (ShardedStore, object)
    store_members = _public(Store) | {"keys", "instance_id", "clock", "metrics",
                                      "direct_grants"}
    assert store_members - ROOT_ONLY == declared
    own = set(vars(ShardedStore)) | {"keys", "instance_id", "clock"}  # set by its __init__
    missing = declared - own
    assert not missing, f"ShardedStore does not route: {sorted(missing)}"
    store = ShardedStore(RedisClient("redis://127.0.0.1:1"), "tq-routing", "inst", SHARDS)
    assert {"keys", "instance_id", "clock"} <= set(vars(store))  # never connected: no I/O here
    members = {name for name in (*dir(ShardedStore), *vars(store)) if not name.startswith("_")}
    assert members == declared | SPLIT_ONLY


def test_layout() -> None:
    assert shard_prefix("tq", 2, 4) == "tq#2/4"
    # A tube's group (its name up to the first "/") picks its shard.
    assert {shard_of_tube(f"mail/{n}", 16) for n in range(50)} == {shard_of_tube("mail", 16)}
    assert shard_of_tube("mail/high/x", 16) == shard_of_tube("mail", 16)
    assert {shard_of_id(4 * seq + 3, 4) for seq in range(1, 50)} == {3}
    assert len({shard_of_tube(f"t{i}", 4) for i in range(100)}) == 4  # every shard gets tubes


async def test_jobs_live_in_their_tubes_shard_and_ids_name_it(
        split_server: ServerProcess, admin: Client) -> None:
    tubes = tubes_in_distinct_shards(3, "ids")
    ids: dict[str, int] = {}
    for tube in tubes:
        await admin.use(tube)
        ids[tube] = await admin.put(tube.encode(), ttr=30)
    prefix = split_server.extra["prefix"]
    r = redis.Redis.from_url(split_server.extra["redis_url"])
    try:
        for tube, job_id in ids.items():
            shard = shard_of_tube(tube, SHARDS)
            assert shard_of_id(job_id, SHARDS) == shard
            assert r.hget(Keys(shard_prefix(prefix, shard, SHARDS)).job(job_id), "t") == \
                tube.encode()
            assert r.exists(Keys(prefix).job(job_id)) == 0  # nothing under the unsplit root
    finally:
        r.close()
    # Every id-only command finds its job, whatever shard holds it.
    for tube, job_id in ids.items():
        assert (await admin.peek(job_id)).body == tube.encode()
        assert (await admin.stats_job(job_id))["tube"] == tube
        job = await admin.reserve_job(job_id)
        await admin.release(job.id, pri=7)
        assert (await admin.stats_job(job_id))["pri"] == 7
        await admin.bury((await admin.reserve_job(job_id)).id)
        await admin.kick_job(job_id)
        await admin.delete(job_id)
        with pytest.raises(NotFound):
            await admin.stats_job(job_id)
    stats = await admin.stats()
    assert stats["current-jobs-ready"] == 0 and stats["total-jobs"] == 3


async def test_a_reserve_over_shards_takes_pri_then_put_order(split_server: ServerProcess,
                                                               admin: Client) -> None:
    low, high, other = tubes_in_distinct_shards(3, "order")
    await admin.use(low)
    first = await admin.put(b"pri 5, first", pri=5)
    await admin.use(other)
    second = await admin.put(b"pri 5, second", pri=5)
    await admin.use(high)
    urgent = await admin.put(b"pri 1", pri=1)
    async with connected(*split_server.address, low, high, other) as worker:
        got = [(await worker.reserve_with_timeout(0)).id for _ in range(3)]
        with pytest.raises(TimedOut):
            await worker.reserve_with_timeout(0)
    assert got == [urgent, first, second]


async def test_a_reserve_blocked_over_shards_is_woken_by_a_put_on_any(
        split_server: ServerProcess, admin: Client) -> None:
    a, b = tubes_in_distinct_shards(2, "wake")
    async with connected(*split_server.address, a, b) as worker:
        for tube in (b, a):
            waiting = asyncio.ensure_future(worker.reserve_with_timeout(20))
            await tube_settles(admin, tube, current_waiting=1)
            stats = await admin.stats()
            assert stats["current-waiting"] == 1  # counted once, not once per shard
            await admin.use(tube)
            job_id = await admin.put(tube.encode())
            job = await asyncio.wait_for(waiting, 20)
            assert (job.id, job.body) == (job_id, tube.encode())
            await worker.delete(job.id)
        await tube_settles(admin, a, current_waiting=0)
        await tube_settles(admin, b, current_waiting=0)


async def test_a_disconnect_gives_back_what_it_held_in_every_shard(
        split_server: ServerProcess, admin: Client) -> None:
    tubes = tubes_in_distinct_shards(3, "held")
    for tube in tubes:
        await admin.use(tube)
        await admin.put(tube.encode(), ttr=120)
    async with connected(*split_server.address, *tubes) as worker:
        held = {(await worker.reserve_with_timeout(0)).body for _ in tubes}
        assert held == {t.encode() for t in tubes}
        for tube in tubes:
            await tube_settles(admin, tube, current_jobs_reserved=1, current_watching=1)
    for tube in tubes:  # back to ready at once, not after the 120 s TTR
        await tube_settles(admin, tube, current_jobs_ready=1, current_jobs_reserved=0,
                           current_watching=0)


async def test_stats_and_list_tubes_cover_every_shard(split_server: ServerProcess,
                                                      admin: Client) -> None:
    tubes = tubes_in_distinct_shards(3, "cover")
    for n, tube in enumerate(tubes, start=1):
        await admin.use(tube)
        for _ in range(n):
            await admin.put(b"x")
    assert await admin.list_tubes() == [DEFAULT_TUBE, *tubes]  # creation order
    stats = await admin.stats()
    assert stats["current-jobs-ready"] == 6
    assert stats["cmd-put"] == 6 and stats["total-jobs"] == 6
    assert stats["current-tubes"] == 4
    assert stats["current-connections"] == 1
    for n, tube in enumerate(tubes, start=1):
        assert (await admin.stats_tube(tube))["total-jobs"] == n


async def test_delete_many_across_shards_answers_in_order(admin: Client) -> None:
    """Each shard deletes its ids in one call; the answers come back in the order asked, an id
    given twice is deleted once."""
    ids = []
    for tube in tubes_in_distinct_shards(3, "many"):
        await admin.use(tube)
        ids.append(await admin.put(b"x"))
    asked = [ids[2], ids[0], ids[2], 2**63 - 1, ids[1]]
    assert await admin.delete_many(asked) == [True, True, False, False, True]


async def test_a_turns_finishes_across_shards_answer_in_order(
        split_server: ServerProcess) -> None:
    """A worker's finishes of one read over jobs of three shards (one finish_many per shard):
    each answered in the order sent, a job finished twice answers NOT_FOUND the second time,
    and each result is kept for a wait."""
    reader, writer = await asyncio.open_connection(*split_server.address)
    try:
        ids = []
        for tube in tubes_in_distinct_shards(3, "fin"):
            writer.write(f"use {tube}\r\nput 0 0 60 1\r\nx\r\nwatch {tube}\r\n".encode())
            await reader.readline()
            ids.append(int((await reader.readline()).split()[1]))
            await reader.readline()
        for _ in ids:
            writer.write(b"reserve\r\n")
            await reader.readline()
            await reader.readline()
        order = [ids[2], ids[0], ids[2], ids[1]]
        writer.write(b"".join(b"finish %d 2\r\nr%d\r\n" % (job_id, k)
                              for k, job_id in enumerate(order)))
        assert [await reader.readline() for _ in order] == [
            b"FINISHED\r\n", b"FINISHED\r\n", b"NOT_FOUND\r\n", b"FINISHED\r\n"]
        writer.write(b"wait %d 0\r\n" % ids[1])
        assert await reader.readline() == b"ENDED %d finished 2\r\n" % ids[1]
        assert await reader.readline() == b"r3\r\n"
    finally:
        writer.close()


async def test_a_burned_id_is_the_tubes_shard_next(split_server: ServerProcess) -> None:
    """beanstalkd uses up an id on a put whose body is bad; a split namespace uses up its
    tube's shard's next id, so the next put there skips one step of ``SHARDS``."""
    (tube,) = tubes_in_distinct_shards(1, "burn")
    reader, writer = await asyncio.open_connection(*split_server.address)
    try:
        writer.write(f"use {tube}\r\nput 0 0 10 3\r\none\r\nput 0 0 10 3\r\nabcdef\r\n"
                     "put 0 0 10 3\r\ntwo\r\n".encode())
        # The body's excess ("def") is then read as a command, as beanstalkd reads it.
        replies = [await asyncio.wait_for(reader.readline(), 10) for _ in range(5)]
    finally:
        writer.close()
    assert replies[0] == f"USING {tube}\r\n".encode()
    assert replies[2:4] == [b"EXPECTED_CRLF\r\n", b"UNKNOWN_COMMAND\r\n"]
    before, after = (int(replies[i].split()[1]) for i in (1, 4))
    assert after - before == 2 * SHARDS


def test_another_shard_count_refuses_to_start(tubeq_cluster: TubeqCluster) -> None:
    prefix = unique_prefix("tq-shard-n")
    tubeq_cluster.start(prefix, label="tubeq-shards-4", flags=("--shards", "4"))
    done = subprocess.run(
        [sys.executable, "-m", "tubeq", "-p", "0", "--redis", tubeq_cluster.redis.url,
         "--prefix", prefix, "--shards", "2"],
        capture_output=True, text=True, timeout=60, check=False)
    assert_one_clear_line(done, "split into 4 shard(s)", "--shards 2")
    unsplit = subprocess.run(
        [sys.executable, "-m", "tubeq", "-p", "0", "--redis", tubeq_cluster.redis.url,
         "--prefix", prefix], capture_output=True, text=True, timeout=60, check=False)
    assert_one_clear_line(unsplit, "split into 4 shard(s)", "--shards 1")


@pytest.mark.timeout(600)
def test_the_differential_suite_passes_on_a_split_namespace() -> None:
    """Every beanstalkd scenario, against tubeq with ``--shards 4`` (ids compared in steps of
    the shard count where a scenario looks at their arithmetic: tests/differential/harness.py)."""
    print(run_differential_suite({TEST_SHARDS_ENV: str(SHARDS)}))


async def test_the_http_api_reserves_across_shards_and_leaves_nothing_behind(
        redis_url: str) -> None:
    """An HTTP long-poll reserve is a token that watches, reserves and unwatches, never
    connects or disconnects: once it is over, the split store remembers nothing of it."""
    tubes = tubes_in_distinct_shards(2, "http")
    async with running_server(redis_url, shards=SHARDS) as server, \
            aiohttp.ClientSession() as session:
        base = f"http://127.0.0.1:{server.http_port}"
        async with session.post(f"{base}/api/tubes/{tubes[1]}/jobs", data=b"x") as response:
            assert response.status == 201
            job_id = (await response.json())["id"]
        async with session.post(f"{base}/api/tubes/{','.join(tubes)}/reserve",
                                params={"timeout": "0"}) as response:
            assert response.status == 200, await response.text()
            assert (await response.json())["id"] == job_id
        store = server.ctx.store if server.ctx is not None else None
        assert isinstance(store, ShardedStore)
        assert not store._watched and not store._touched  # what would grow per request


async def test_an_unsplit_prefix_with_a_hash_sign_numbers_jobs_as_usual(redis_url: str) -> None:
    """Only a root ending in ``#<k>/<n>}:`` is a shard's: any other '#' in a prefix changes
    nothing (new_job in lua/includes/keys.lua)."""
    client = await RedisClient.connect(redis_url)
    try:
        store = Store(client, Keys("odd#name"), "inst")
        await store.load_scripts()
        assert [await store.put("default", 0, 0, 60, b"x") for _ in range(3)] == [1, 2, 3]
    finally:
        await client.close()


class _Connection:
    """What a reserve queue uses of its connection (ReserveOwner), over a real split store."""

    def __init__(self, store: ShardedStore, token: str, watched: tuple[str, ...]) -> None:
        self.store = store
        self.token = token
        self.reserved: dict[int, int] = {}
        self.extended = False
        self.worker = False
        self.replaying = False
        self.handlers: dict[Any, Any] = {}
        self.watched = watched
        self.ctx = SimpleNamespace(observer=None, registry=WaiterRegistry(), tracer=None,
                                   scheduler=SimpleNamespace(note_due=lambda due: None))

    def mark_worker(self) -> None:
        self.worker = True

    def reply_done(self, reply: asyncio.Future[bytes]) -> None:
        pass

    def schedule_pump(self) -> None:
        pass


async def test_a_blocked_reserve_over_shards_that_times_out_mid_try_is_counted_out(
        redis_url: str) -> None:
    """A reserve-with-timeout blocked over tubes of two shards, whose try Redis holds past the
    timeout (its wait answers TIMED_OUT and sends its count-out at once): the count-in that try
    began with reaches Redis before that count-out, so nothing is left counted as waiting
    once the try is back (else current-waiting stays 1 in both shards and a put on those
    tubes hands its job to nobody: the stale waiter is first in line)."""
    alice, bob = "inst:1", "inst:2"
    client = await RedisClient.connect(redis_url)
    try:
        store = ShardedStore(client, "split-stall", "inst", SHARDS)
        await store.load_scripts()
        await store.heartbeat()
        a, b = tubes_in_distinct_shards(2, "stall")
        await store.connect(alice)
        await store.change_watches(alice, [("+w", a), ("+w", b), ("-w", DEFAULT_TUBE)])
        await store.connect(bob)
        await store.change_watches(bob, [("+w", a), ("-w", DEFAULT_TUBE)])
        conn = _Connection(store, alice, (a, b))
        queue = ReserveQueue(cast(ReserveOwner, conn))

        # Redis stalls alice's looks past her reserve's first try (its two looks).
        gate = asyncio.Event()
        looks: list[str] = []
        stalled = asyncio.Event()
        for k in {shard_of_tube(a, SHARDS), shard_of_tube(b, SHARDS)}:
            shard = store.shards[k]

            def stalling(token: str, look: Any = shard.best) -> asyncio.Future[Any]:
                async def later() -> Any:
                    if token == alice:
                        looks.append(token)
                        if len(looks) > 2 and not gate.is_set():
                            stalled.set()
                            await gate.wait()
                    return await look(token)
                return asyncio.ensure_future(later())

            shard.best = stalling  # type: ignore[method-assign]

        reply = queue.start(1, None, False)  # reserve-with-timeout 1
        await asyncio.wait_for(stalled.wait(), 5)
        assert await asyncio.wait_for(reply, 5) == b"TIMED_OUT\r\n"
        await asyncio.sleep(0.1)  # the wait's count-out has run in Redis
        gate.set()  # Redis answers again: the try goes on and finds nothing
        for _ in range(100):
            if queue.grants is None:
                break
            await asyncio.sleep(0.02)
        assert queue.grants is None and queue.wait is None
        shards = (shard_of_tube(a, SHARDS), shard_of_tube(b, SHARDS))
        assert [await store.shards[k].client.call("HGET", store.shards[k].keys.waiting, alice)
                for k in shards] == [None, None]
        counts = [await store.shards[k].tube_counts(t) for k, t in zip(shards, (a, b),
                                                                          strict=True)]
        assert [c[8] if c else None for c in counts] == [0, 0]  # current-waiting
        await store.set_waiting(bob, 1)  # first in line on `a` now: a put is handed to him
        job_id = await store.put(a, 0, 0, 60, b"for bob")
        assert [r.id for r in await store.set_waiting(bob, -1, claim=True)] == [job_id]
        await store.delete(bob, job_id)
        await store.disconnect(alice, False, True, [])
        await store.disconnect(bob, False, True, [])
    finally:
        await client.close()
