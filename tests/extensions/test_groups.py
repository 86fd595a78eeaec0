"""Groups over the wire and over HTTP: put-with group=, tube-set group-concurrency= and
group-rate=, the replies to bad input (nothing stored), a blocked reserve woken when its group's
slot frees. The Lua side, move by move: tests/store/test_groups.py."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.support.http_support import running_server
from tests.support.servers import ServerProcess
from tests.support.wire import Wire


def put(w: Wire, group: str | None, body: str = "x", extra: str = "") -> int:
    option = f" group={group}" if group is not None else ""
    reply = w.ask(f"put-with 0 0 60 {len(body)}{option}{extra}\r\n{body}")
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
