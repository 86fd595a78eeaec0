"""tubeq on a real Redis Cluster: three ``redis-server --cluster-enabled yes`` nodes on loopback,
joined by ``redis-cli --cluster create``, started and stopped here.

What must hold: a namespace's shards spread over the nodes (each node holds jobs, and each
shard's keys only the node its slot belongs to); every beanstalkd command works across them
(the differential suite, nested); two tubeq processes share the cluster; bad input (an
unreachable seed, a cluster with unserved slots, a non-cluster Redis behind a cluster URL) is
one line at start, exit non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.procs import ClusterUnderTest, redis_command
from tests.redisio.test_startup_checks import assert_one_clear_line
from tests.support.client_support import connected, eventually
from tests.support.servers import (
    LOOPBACK,
    TEST_REDIS_ENV,
    TEST_SHARDS_ENV,
    ServerProcess,
    run_differential_suite,
    start_tubeq,
    unique_prefix,
)
from tests.support.wire import Wire
from tubeq.client import Client, Job, TimedOut, UnknownParent
from tubeq.client.errors import CommandError
from tubeq.redisio.cluster import ClusterSeeds
from tubeq.redisio.process import RedisProcess, cluster_port, free_port
from tubeq.store.keys import LAYOUT_VERSION, Keys
from tubeq.store.shards import shard_of_id, shard_of_tube, shard_prefix

SHARDS = 8

pytestmark = pytest.mark.usefixtures("skip_unless_tubeq")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterUnderTest]:
    nodes = ClusterUnderTest(tmp_path_factory.mktemp("cluster"))
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
def servers(cluster: ClusterUnderTest, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Two tubeq processes on the cluster, one namespace split into ``SHARDS``."""
    prefix = unique_prefix("tq-cl")
    started = [start_tubeq(cluster.url, prefix, tmp_path, f"tubeq-cluster-{i}",
                           ("--shards", str(SHARDS))) for i in (0, 1)]
    yield started
    for server in started:
        server.stop()


def node_of(cluster: ClusterUnderTest, key: str) -> int:
    """The index of the node that serves ``key`` (CLUSTER KEYSLOT, then the nodes' slots)."""
    slot = int(redis_command(cluster.nodes[0].port, "CLUSTER", "KEYSLOT", key).strip())
    for index, node in enumerate(cluster.nodes):
        if int(redis_command(node.port, "CLUSTER", "COUNTKEYSINSLOT", str(slot)).strip()
               or 0) > 0:
            return index
    raise AssertionError(f"no node holds a key of slot {slot}")


async def test_shards_spread_over_the_nodes_and_jobs_flow_across_them(
        cluster: ClusterUnderTest, servers: list[ServerProcess]) -> None:
    producer_address, worker_address = servers[0].address, servers[1].address
    prefix = servers[0].extra["prefix"]
    tubes = [f"spread-{n}" for n in range(24)]
    ids: dict[str, int] = {}
    async with Client(*producer_address) as producer:
        for tube in tubes:
            await producer.use(tube)
            ids[tube] = await producer.put(tube.encode(), pri=len(ids))
    # Each job sits on the node of its shard's hash tag, and every node holds some.
    holders = set()
    for tube, job_id in ids.items():
        shard = shard_of_tube(tube, SHARDS)
        assert shard_of_id(job_id, SHARDS) == shard
        key = Keys(shard_prefix(prefix, shard, SHARDS)).job(job_id)
        holders.add(node_of(cluster, key))
    assert holders == {0, 1, 2}, f"jobs on nodes {holders} only"
    # Another process reserves them all, best priority first, across every node.
    async with connected(*worker_address, *tubes) as worker:
        got = []
        for _ in tubes:
            job = await worker.reserve_with_timeout(5)
            got.append(job.id)
            await worker.delete(job.id)
        stats = await worker.stats()
    assert got == [ids[tube] for tube in tubes]
    assert stats["current-jobs-ready"] == 0 and stats["cmd-delete"] >= len(tubes)
    # The namespace's one data layout record, on the node of its unsplit root (tubeq.store.keys).
    layout = Keys(prefix).layout
    port = cluster.nodes[node_of(cluster, layout)].port
    assert redis_command(port, "GET", layout).strip() == str(LAYOUT_VERSION).encode()


async def test_a_blocked_reserve_is_woken_by_a_put_through_another_process_and_node(
        servers: list[ServerProcess]) -> None:
    a, b = "wake-a", "wake-c"
    assert shard_of_tube(a, SHARDS) != shard_of_tube(b, SHARDS)
    async with connected(*servers[1].address, a, b) as worker, \
            Client(*servers[0].address) as producer:
        for tube in (a, b):
            waiting = asyncio.ensure_future(worker.reserve_with_timeout(20))
            await asyncio.sleep(0.2)
            await producer.use(tube)
            job_id = await producer.put(tube.encode())
            job = await asyncio.wait_for(waiting, 20)
            assert (job.id, job.body) == (job_id, tube.encode())
            await worker.delete(job.id)


async def test_groups_take_turns_across_processes_and_nodes(
        servers: list[ServerProcess]) -> None:
    """put-with group= through one process, reserved through the other: the tube's groups take
    turns, and a group at its group-concurrency cap waits until its job is deleted."""
    with Wire(servers[0].host, servers[0].port) as admin:
        assert admin.ask("tube-set tenants group-concurrency=1") == b"SET\r\n"
    async with Client(*servers[0].address) as producer, \
            connected(*servers[1].address, "tenants") as worker:
        await producer.use("tenants")
        a = [await producer.put_with(b"a", group="a") for _ in range(2)]
        b = await producer.put_with(b"b", group="b")
        first = await worker.reserve_with_timeout(5)
        second = await worker.reserve_with_timeout(5)
        assert [first.id, second.id] == [a[0].id, b.id]
        with pytest.raises(TimedOut):
            await worker.reserve_with_timeout(0)  # a is at its cap
        await worker.delete(first.id)
        third = await worker.reserve_with_timeout(5)
        assert third.id == a[1].id
        for job in (second, third):
            await worker.delete(job.id)


async def test_a_shard_whose_slot_moves_is_followed(cluster: ClusterUnderTest,
                                                    servers: list[ServerProcess]) -> None:
    """A resharding moves a shard's slot (and its keys) to another node: the old node answers
    MOVED, tubeq reads the slot map again and serves the shard from the new node, jobs intact."""
    tube = "moving"
    prefix = servers[0].extra["prefix"]
    root = Keys(shard_prefix(prefix, shard_of_tube(tube, SHARDS), SHARDS)).root
    async with Client(*servers[0].address) as client:
        await client.use(tube)
        for _ in range(5):
            await client.put(b"before the move")
        source = node_of(cluster, root + "tubes")
        target = (source + 1) % len(cluster.nodes)
        slot = int(redis_command(cluster.nodes[0].port, "CLUSTER", "KEYSLOT", root).strip())
        cluster.move_slot(slot, source, target)
        assert node_of(cluster, root + "tubes") == target

        async def puts_again() -> bool:
            try:
                await client.put(b"after the move")
            except CommandError:  # INTERNAL_ERROR until tubeq follows the slot
                return False
            return True

        await eventually(puts_again, "puts into the moved shard work again", timeout=20)
        stats = await client.stats_tube(tube)
        assert stats["current-jobs-ready"] == stats["total-jobs"] >= 6
    # The other process learns of the move from its own first MOVED: until it has read the
    # slot map again (within a second), its commands on that shard answer INTERNAL_ERROR.
    async with Client(*servers[1].address) as worker:
        async def follows() -> bool:
            try:
                await worker.stats_tube(tube)
            except CommandError:
                return False
            return True

        await eventually(follows, "the other process follows the move", timeout=20)
        await worker.watch(tube)
        for _ in range(stats["total-jobs"]):
            await worker.delete((await worker.reserve_with_timeout(5)).id)


def test_unreachable_seeds_are_one_line() -> None:
    url = f"redis+cluster://{LOOPBACK}:{free_port()},{LOOPBACK}:{free_port()}"
    done = subprocess.run([sys.executable, "-m", "tubeq", "-p", str(free_port()), "--redis",
                           url], capture_output=True, text=True, timeout=60, check=False)
    assert_one_clear_line(done, "no usable Redis Cluster")


def exits_with_one_line_on(port: int) -> None:
    done = subprocess.run([sys.executable, "-m", "tubeq", "-p", str(free_port()), "--redis",
                           f"redis+cluster://{LOOPBACK}:{port}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert_one_clear_line(done, "no usable Redis Cluster")


def test_a_cluster_with_unserved_slots_is_one_line(tmp_path: Path) -> None:
    lone = RedisProcess(tmp_path / "lone", port=cluster_port(),
                        extra=("--cluster-enabled", "yes", "--cluster-config-file",
                               str(tmp_path / "lone" / "nodes.conf")))
    lone.start()
    try:
        exits_with_one_line_on(lone.port)
    finally:
        lone.stop()


def test_a_plain_redis_behind_a_cluster_url_is_one_line(tmp_path: Path) -> None:
    plain = RedisProcess(tmp_path / "plain")
    plain.start()
    try:
        exits_with_one_line_on(plain.port)
    finally:
        plain.stop()


def test_a_bad_cluster_url_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "tubeq", "--redis", "redis+cluster://"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--redis" in done.stderr, done.stderr
    assert ClusterSeeds.parse("redis+cluster://u:p%40ss@h1:7000,h2").nodes == (
        ("h1", 7000), ("h2", 6379))


def connections_to(pid: int, port: int) -> int:
    """How many established TCP connections process ``pid`` has to loopback ``port``: its
    sockets (/proc/PID/fd) matched against the kernel's table (/proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if remote_port == port and fields[3] == "01" and fields[9] in inodes:  # ESTABLISHED
            count += 1
    return count


def test_one_connection_per_node(cluster: ClusterUnderTest,
                                 servers: list[ServerProcess]) -> None:
    """The shards' calls go over one pipelined connection per node (plus, on one node, the
    subscriber's), not one per shard: 8 shards on 3 nodes put 3 or more on some node, which a
    connection per shard would show as 3 or more connections there."""
    for server in servers:
        per_node = [connections_to(server.pid, node.port) for node in cluster.nodes]
        assert all(n <= 2 for n in per_node), per_node
        assert sum(per_node) <= len(cluster.nodes) + 1, per_node  # + the subscriber


@pytest.mark.timeout(600)
def test_the_differential_suite_passes_on_the_cluster(cluster: ClusterUnderTest) -> None:
    """Every beanstalkd scenario against tubeq on the 3-node cluster, namespace split into 16
    shards (ids compared in steps of the shard count where a scenario looks at them)."""
    print(run_differential_suite({TEST_REDIS_ENV: cluster.url, TEST_SHARDS_ENV: "16"}))


async def test_calls_and_waits_across_the_nodes(cluster: ClusterUnderTest,
                                                servers: list[ServerProcess]) -> None:
    """Request/reply on a Redis Cluster: each job's end is kept on its shard's node and
    published there (a PUBLISH reaches every node's subscribers); callers on one process,
    the worker on the other, tubes over every node."""
    tubes = [f"calls-{n}" for n in range(12)]
    nodes = {node_of(cluster, Keys(shard_prefix(servers[0].extra["prefix"],
                                                 shard_of_tube(t, SHARDS), SHARDS)).root + "x")
             for t in tubes}
    assert len(nodes) > 1, nodes
    async with Client(*servers[1].address) as worker, Client(*servers[0].address) as caller:
        async def answer(job: Job) -> bytes:
            return b"re: " + job.body

        consumer = worker.consume(tubes, concurrency=4)
        running = asyncio.ensure_future(consumer.run(answer))
        try:
            for tube in tubes:
                assert await caller.call(tube, tube.encode(), timeout=10) == (
                    b"re: " + tube.encode())
            job_id = await caller.put(b"late")  # its end, read after it happened
        finally:
            consumer.stop()
            await running
    async with Client(*servers[1].address) as other:  # watches default
        job = await other.reserve_with_timeout(5)
        assert job.id == job_id
        await job.finish(b"done")
    async with Client(*servers[0].address) as caller:
        assert await caller.wait(job_id, timeout=5) == b"done"


async def test_a_fan_in_across_the_nodes(cluster: ClusterUnderTest,
                                         servers: list[ServerProcess]) -> None:
    """Dependencies on a Redis Cluster: parents in tubes of every node, the child in another;
    each parent's end crosses from its node to the child's (add_child.lua on the parents'
    shards, after_end.lua on the child's), the workers on the other process. The child runs
    once, after the last parent finished; one unknown parent refuses the put."""
    prefix = servers[0].extra["prefix"]
    tubes = [f"parts-{n}" for n in range(9)]
    nodes = {node_of(cluster, Keys(shard_prefix(prefix, shard_of_tube(t, SHARDS),
                                                SHARDS)).root + "x") for t in tubes}
    assert len(nodes) > 1, nodes
    async with Client(*servers[0].address) as producer, \
            Client(*servers[1].address) as worker:
        parents = []
        for tube in tubes:
            await producer.use(tube)
            parents += await producer.put_many([b"%s-%d" % (tube.encode(), i) for i in range(5)])
        await producer.use("sum")
        with pytest.raises(UnknownParent):
            await producer.put_with(b"never", after=[*parents, parents[-1] + 10 * SHARDS])
        child = await producer.put_with(b"sum", after=parents)

        async def answer(job: Job) -> bytes:
            return job.body

        consumer = worker.consume(tubes, concurrency=4)
        running = asyncio.ensure_future(consumer.run(answer))
        try:
            await producer.watch("sum")
            job = await producer.reserve_with_timeout(10)
        finally:
            consumer.stop()
            await running
        assert job.id == child.id
        assert [await producer.wait(p, timeout=0) for p in parents] == [
            b"%s-%d" % (t.encode(), i) for t in tubes for i in range(5)]
        await job.delete()
        with pytest.raises(TimedOut):
            await producer.reserve_with_timeout(1)
