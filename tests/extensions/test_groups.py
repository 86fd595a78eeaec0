"""Groups over the wire and over HTTP: put-with group=, tube-set group-concurrency= and
group-rate=, the replies to bad input (nothing stored), a blocked reserve woken when its group's
slot frees. The Lua side, move by move: tests/store/test_groups.py."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from tests.store.test_shards import tubes_in_distinct_shards
from tests.support.http_support import running_server
from tests.support.servers import ServerProcess, TubeqCluster, unique_prefix
from tests.support.wire import Wire
from tubeq.client import BadOption, Client
from tubeq.client.batches import NewJob
from tubeq.client.policies import put_with_line


def put(w: Wire, group: str | None, body: str = "x") -> int:
    option = f" group={group}" if group is not None else ""
    reply = w.ask(f"put-with 0 0 60 {len(body)}{option}\r\n{body}")
    assert reply.startswith(b"INSERTED "), reply
    return int(reply.split()[1])


def reserve(w: Wire) -> int | None:
    reply = w.ask("reserve-with-timeout 0")
    if reply == b"TIMED_OUT\r\n":
        return None
    assert reply.startswith(b"RESERVED "), reply
    return int(reply.split()[1])


def test_groups_take_turns_over_the_wire(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use groups-rr")
        w.ask("watch groups-rr")
        w.ask("ignore default")
        a = [put(w, "tenant-a") for _ in range(3)]
        b = [put(w, "tenant-b") for _ in range(2)]
        got = []
        while (job := reserve(w)) is not None:
            got.append(job)
            assert w.ask(f"delete {job}") == b"DELETED\r\n"
        assert got == [a[0], b[0], a[1], b[1], a[2]]


@pytest.mark.parametrize(("option", "reply"), [
    ("group=", b"BAD_OPTION group\r\n"),
    ("group=" + "g" * 201, b"BAD_OPTION group\r\n"),
    ("group=a:b", b"BAD_OPTION group\r\n"),
    ("group=-a", b"BAD_OPTION group\r\n"),
    ("group=a b", b"BAD_FORMAT\r\n"),  # a space ends the key: "b" is no name=value token
    ("group=a group=b", b"BAD_OPTION group\r\n"),
])
def test_a_bad_group_key_is_refused_and_nothing_stored(server: ServerProcess, option: str,
                                                       reply: bytes) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use groups-bad")
        assert w.ask(f"put-with 0 0 60 1 {option}\r\nx") == reply
        doc = w.yaml("stats-tube groups-bad")
        assert (doc["total-jobs"], doc["current-jobs-ready"]) == ("0", "0")
        job = put(w, "g" * 200)  # the longest key is taken
        assert w.ask(f"delete {job}") == b"DELETED\r\n"


@pytest.mark.parametrize("line", [
    "tube-set groups-bad group-concurrency=x",
    "tube-set groups-bad group-concurrency=-1",
    "tube-set groups-bad group-rate=4294967296",
])
def test_a_bad_group_limit_is_refused(server: ServerProcess, line: str) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("extensions")  # the settings show to this connection
        name = line.split()[2].partition("=")[0]
        assert w.ask(line) == f"BAD_OPTION {name}\r\n".encode()
        w.ask("use groups-bad")
        doc = w.yaml("stats-tube groups-bad")
        assert (doc["group-concurrency"], doc["group-rate"]) == ("0", "0")


def test_a_group_at_its_cap_waits_and_a_blocked_reserve_wakes_when_a_slot_frees(
        server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w, Wire(server.host, server.port) as other:
        assert w.ask("tube-set groups-cap group-concurrency=1") == b"SET\r\n"
        for conn in (w, other):
            conn.ask("watch groups-cap")
            conn.ask("ignore default")
        w.ask("use groups-cap")
        a = [put(w, "a") for _ in range(2)]
        assert reserve(w) == a[0]
        assert reserve(other) is None  # a is at its cap; no other group has a job
        got: list[bytes] = []
        waiter = threading.Thread(target=lambda: got.append(other.ask("reserve-with-timeout 10")))
        waiter.start()
        assert w.ask(f"delete {a[0]}") == b"DELETED\r\n"
        waiter.join(timeout=15)
        assert got and got[0].startswith(f"RESERVED {a[1]} ".encode()), got
        assert other.ask(f"delete {a[1]}") == b"DELETED\r\n"


def test_stats_tube_counts_the_groups_and_names_the_busiest(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w, Wire(server.host, server.port) as plain:
        w.ask("extensions")
        w.ask("use groups-stats")
        plain.ask("use groups-stats")
        doc = w.yaml("stats-tube groups-stats")
        assert (doc["groups"], doc["groups-busiest"]) == ("0", '""')
        for group, n in (("big", 4), ("mid", 2), ("one", 1)):
            for _ in range(n):
                put(w, group)
        assert w.ask("tube-set groups-stats group-concurrency=5") == b"SET\r\n"
        w.ask("watch groups-stats")
        w.ask("ignore default")
        assert reserve(w) is not None  # big's
        doc = w.yaml("stats-tube groups-stats")
        assert doc["groups"] == "3"
        assert doc["groups-busiest"] == '"big 3 1, mid 2 0, one 1 0"'
        # a connection that never used an extension sees beanstalkd's document only
        assert "groups" not in plain.yaml("stats-tube groups-stats")


def test_put_many_entries_take_a_group(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use groups-many")
        w.send(b"put-many 4\r\n0 0 60 1 group=a\r\na\r\n0 0 60 1 group=a\r\na\r\n"
               b"0 0 60 1 group=b c\r\nx\r\n0 0 60 1 group=b\r\nb\r\n")
        assert w.reply() == b"BATCH 4\r\n"
        replies = [w.reply() for _ in range(4)]
        assert replies[2] == b"BAD_FORMAT\r\n"  # a space ends the key: nothing stored
        a1, a2, b = (int(r.split()[1]) for r in replies[:2] + replies[3:])
        w.ask("watch groups-many")
        w.ask("ignore default")
        got = []
        while (job := reserve(w)) is not None:
            got.append(job)
            assert w.ask(f"delete {job}") == b"DELETED\r\n"
        assert got == [a1, b, a2]


def test_push_and_reserve_many_serve_the_groups_in_turns(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use groups-push")
        a = [put(w, "a") for _ in range(3)]
        b = [put(w, "b") for _ in range(3)]
        w.ask("watch groups-push")
        w.ask("ignore default")
        reply = w.ask("reserve-many 3 0")
        assert reply == b"BATCH 3\r\n"
        got = [int(w.reply().split()[1]) for _ in range(3)]
        assert got == [a[0], b[0], a[1]]
        assert w.ask("push 3") == b"PUSHING 3\r\n"
        pushed = [int(w.reply().split()[1]) for _ in range(3)]
        assert pushed == [b[1], a[2], b[2]]
        assert w.ask("push 0") == b"PUSHING 0\r\n"
        for job in got + pushed:
            assert w.ask(f"delete {job}") == b"DELETED\r\n"


# -- several processes, shards ------------------------------------------------------------------

@pytest.fixture
def two_servers(tubeq_cluster: TubeqCluster) -> Iterator[list[ServerProcess]]:
    """Two tubeq processes on one namespace (what --workers runs on one port)."""
    prefix = unique_prefix("grp")
    servers = [tubeq_cluster.start(prefix, label=f"tubeq-grp-{n}") for n in (1, 2)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def test_a_slot_freed_on_one_process_wakes_a_reserve_on_another(
        two_servers: list[ServerProcess]) -> None:
    one, two = two_servers
    with Wire(one.host, one.port) as w, Wire(two.host, two.port) as other:
        assert w.ask("tube-set groups-2p group-concurrency=1") == b"SET\r\n"
        for conn in (w, other):
            conn.ask("watch groups-2p")
            conn.ask("ignore default")
        w.ask("use groups-2p")
        a = [put(w, "a") for _ in range(2)]
        b = put(w, "b")
        assert [reserve(w), reserve(other)] == [a[0], b]
        got: list[bytes] = []
        waiter = threading.Thread(target=lambda: got.append(other.ask("reserve-with-timeout 10")))
        waiter.start()
        assert w.ask(f"delete {a[0]}") == b"DELETED\r\n"
        waiter.join(timeout=15)
        assert got and got[0].startswith(f"RESERVED {a[1]} ".encode()), got
        for job in (a[1], b):
            assert other.ask(f"delete {job}") == b"DELETED\r\n"


@pytest.fixture
def split_server(tubeq_cluster: TubeqCluster) -> Iterator[ServerProcess]:
    server = tubeq_cluster.start(unique_prefix("grp-shard"), label="tubeq-grp-shards",
                                 flags=("--shards", "4"))
    try:
        yield server
    finally:
        server.stop()


def test_groups_over_shards(split_server: ServerProcess) -> None:
    """A tube lives in one shard: its groups take turns there; a connection watching tubes of
    several shards still gets (pri, put order) across them."""
    grouped, plain = tubes_in_distinct_shards(2, "grp")
    with Wire(split_server.host, split_server.port) as w:
        w.ask(f"use {grouped}")
        a = [put(w, "a") for _ in range(2)]
        b = put(w, "b")
        w.ask(f"use {plain}")
        urgent = int(w.ask("put 1 0 60 1\r\nu").split()[1])
        later = int(w.ask("put 0 0 60 1\r\nl").split()[1])
        for tube in (grouped, plain):
            w.ask(f"watch {tube}")
        w.ask("ignore default")
        got = []
        while (job := reserve(w)) is not None:
            got.append(job)
            assert w.ask(f"delete {job}") == b"DELETED\r\n"
        # pri 0: the grouped tube's head by turns (a, b, a), each against the other tube's
        # best by put order; then pri 1
        assert got == [a[0], b, a[1], later, urgent]


# -- HTTP ---------------------------------------------------------------------------------------

@pytest.fixture
async def http_base(redis_url: str) -> AsyncIterator[str]:
    async with running_server(redis_url) as s:
        yield f"http://127.0.0.1:{s.http_port}"


async def test_an_http_put_takes_a_group(http_base: str) -> None:
    async with aiohttp.ClientSession() as session:
        ids = []
        for group in ("a", "a", "b"):
            async with session.post(f"{http_base}/api/tubes/web/jobs", json={
                    "body": "x", "group": group}) as response:
                assert response.status == 201
                ids.append((await response.json())["id"])
        async with session.post(f"{http_base}/api/tubes/web/jobs", params={"group": "a b"},
                                data=b"x") as response:
            assert response.status == 400
            assert "group" in (await response.json())["error"]
        got = []
        for _ in ids:
            async with session.post(f"{http_base}/api/tubes/web/reserve",
                                    params={"timeout": "0"}) as response:
                assert response.status == 200
                job = await response.json()
                got.append(job["id"])
            async with session.delete(f"{http_base}/api/jobs/{job['id']}",
                                      params={"reservation": job["reservation"]}) as response:
                assert response.status in (200, 204)
        assert got == [ids[0], ids[2], ids[1]]


async def test_http_stats_of_a_tube_show_its_groups(http_base: str) -> None:
    async with aiohttp.ClientSession() as session:
        for group in ("a", "b", "b"):
            async with session.post(f"{http_base}/api/tubes/web2/jobs",
                                    params={"group": group}, data=b"x") as response:
                assert response.status == 201
        async with session.get(f"{http_base}/api/tubes/web2") as response:
            stats = await response.json()
        assert stats["groups"] == 2
        assert stats["groups_busiest"] == [{"group": "b", "ready": 2, "reserved": 0},
                                           {"group": "a", "ready": 1, "reserved": 0}]


# -- the bundled client -------------------------------------------------------------------------

def test_the_client_sends_a_group_and_refuses_one_that_would_split_the_line() -> None:
    def line(group: str) -> bytes:
        return put_with_line(0, 0, 60, 1, delay_ms=None, max_tries=None, backoff_ms=None,
                             backoff_max_ms=None, ttl_ms=None, on_expire=None, key=None,
                             group=group)

    assert line("tenant-7") == b"put-with 0 0 60 1 group=tenant-7\r\n"
    for bad in ("", "a b", "a\r\nb"):
        with pytest.raises(ValueError):
            line(bad)


async def test_the_client_puts_with_a_group(server: ServerProcess) -> None:
    async with Client(server.host, server.port) as client:
        await client.use("groups-client")
        await client.watch("groups-client")
        await client.ignore("default")
        a = [(await client.put_with(b"a", group="a")).id for _ in range(2)]
        b = (await client.put_with(b"b", group="b")).id
        got = []
        for _ in range(3):
            job = await client.reserve_with_timeout(0)
            got.append(job.id)
            await client.delete(job.id)
        assert got == [a[0], b, a[1]]
        with pytest.raises(BadOption):
            await client.put_with(b"x", group="a:b")


async def test_the_client_puts_many_with_groups(server: ServerProcess) -> None:
    async with Client(server.host, server.port) as client:
        await client.use("groups-client-many")
        await client.watch("groups-client-many")
        await client.ignore("default")
        ids = await client.put_many([NewJob(b"a", group="a"), NewJob(b"a", group="a"),
                                     NewJob(b"b", group="b"), b"plain"])
        got = []
        for _ in ids:
            job = await client.reserve_with_timeout(0)
            got.append(job.id)
            await client.delete(job.id)
        assert got == [ids[0], ids[2], ids[3], ids[1]]
