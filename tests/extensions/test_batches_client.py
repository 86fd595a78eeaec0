"""The bundled client's batches: the BATCH reply frame, put_many / reserve_many / delete_many
against tubeq and beanstalkd (which has none of the commands: the client falls back or says
so), consume() deleting in batches, and ``tubeq-cli put-many``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.client.test_cli import Cli
from tests.support.client_support import WAIT_S, connected, tube_settles
from tests.support.servers import ServerProcess
from tubeq.client import (
    Client,
    Job,
    JobTooBig,
    NewJob,
    ProtocolError,
    Reply,
    ReplyParser,
    TimedOut,
    UnknownCommand,
)

pytestmark = pytest.mark.timeout(60)


# -- the reply frame (sans-IO) -------------------------------------------------------------------

def test_a_batch_frame_carries_its_replies_whole_fed_at_once_or_byte_by_byte() -> None:
    data = (b"BATCH 3\r\nINSERTED 5\r\nRESERVED 7 2\r\nhi\r\nNOT_FOUND\r\n"
            b"BATCH 0\r\nDELETED\r\n")
    expected = [Reply(b"BATCH", (b"3",), items=(Reply(b"INSERTED", (b"5",)),
                                                Reply(b"RESERVED", (b"7", b"2"), b"hi"),
                                                Reply(b"NOT_FOUND"))),
                Reply(b"BATCH", (b"0",)), Reply(b"DELETED")]
    assert ReplyParser().feed(data) == expected
    frame_ends = {data.index(b"BATCH 0"), data.index(b"DELETED"), len(data)}
    parser = ReplyParser()
    out: list[Reply] = []
    for i in range(len(data)):
        out += parser.feed(data[i:i + 1])
        assert parser.mid_reply == (i + 1 not in frame_ends)  # inside the batch too
    assert out == expected


@pytest.mark.parametrize("data", [b"BATCH 2\r\nBATCH 1\r\n", b"BATCH 8193\r\n", b"BATCH\r\n",
                                  b"BATCH 1 2\r\n"])
def test_a_batch_frame_outside_the_grammar_stops_the_parser(data: bytes) -> None:
    parser = ReplyParser()
    assert parser.feed(data) == []
    assert isinstance(parser.error, ProtocolError)


# -- the client against both servers -------------------------------------------------------------

@pytest.fixture
async def client(any_server: ServerProcess, tube_name: str) -> Any:
    async with connected(*any_server.address, tube_name) as opened:
        yield opened


async def test_put_many_gives_each_job_its_id_or_its_error(client: Client,
                                                          any_server: ServerProcess,
                                                          tube_name: str) -> None:
    results = await client.put_many([b"a", "b", NewJob(b"c", pri=3, delay=100, ttr=9),
                                     b"x" * 70_000, b"e"], pri=7)
    assert isinstance(results[3], JobTooBig)
    ids = [r for r in results if isinstance(r, int)]
    assert len(ids) == 4 and ids == sorted(ids)
    stats = await client.stats_job(ids[2])
    assert (stats["pri"], stats["delay"], stats["ttr"], stats["state"]) == (3, 100, 9, "delayed")
    assert (await client.stats_job(ids[0]))["pri"] == 7
    assert (await client.peek(ids[1])).body == b"b"
    # tubeq was asked once whether it has put-many; beanstalkd got plain puts.
    link = client._link
    assert link is not None and ("put-many" in (link.extensions or ())) == (
        any_server.kind == "tubeq")
    assert await client.put_many([]) == []
    for bad in ({"pri": -1}, {"delay": 2**32}, {"ttr": True}):  # checked before anything is sent
        with pytest.raises(ValueError):
            await client.put_many([b"a", NewJob(b"b")], **bad)
    assert await client.delete_many([*ids, ids[0], 2**63]) == [True] * 4 + [False, False]


async def test_put_many_splits_a_large_batch_and_keeps_the_order(client: Client,
                                                                tube_name: str) -> None:
    results = await client.put_many([b"%d" % i for i in range(2500)], ttr=5)
    assert all(isinstance(r, int) for r in results) and len(results) == 2500
    ids = [r for r in results if isinstance(r, int)]
    assert ids == sorted(ids)
    assert (await client.peek(ids[1999])).body == b"1999"
    assert all(await client.delete_many(ids))


async def test_reserve_many_on_tubeq_and_unknown_on_beanstalkd(client: Client,
                                                               any_server: ServerProcess) -> None:
    ids = await client.put_many([b"1", b"2", b"3"])
    if any_server.kind != "tubeq":
        with pytest.raises(UnknownCommand):
            await client.reserve_many(2, 0)
        assert await client.delete_many([i for i in ids if isinstance(i, int)]) == [True] * 3
        return
    jobs = await client.reserve_many(2, 0)
    assert [(j.id, j.body, j.reserved) for j in jobs] == [(ids[0], b"1", True),
                                                          (ids[1], b"2", True)]
    assert [j.id for j in await client.reserve_many(10, 1)] == [ids[2]]
    with pytest.raises(TimedOut):
        await client.reserve_many(10, 0)
    with pytest.raises(ValueError):
        await client.reserve_many(0, 0)
    assert await client.delete_many([ids[0], ids[1], ids[2]]) == [True, True, True]


async def test_delete_many_runs_past_one_line_are_split(client: Client) -> None:
    ids = [10**18 + i for i in range(2000)]  # 20 bytes each: more than one 16 KiB line
    assert await client.delete_many(ids) == [False] * 2000


# -- consume(): batched deletes ------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "push"), [("beanstalkd", False), ("tubeq", False),
                                            ("tubeq", True)],
                         ids=["beanstalkd-reserve", "tubeq-reserve", "tubeq-push"])
async def test_consume_deletes_the_jobs_of_one_tick_in_one_batch(
        kind: str, push: bool, tube_name: str, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    any_server: ServerProcess = request.getfixturevalue(f"client_{kind}")
    batches: list[int] = []
    original = Client._delete_many_on

    async def spy(self: Client, link: Any, ids: list[int]) -> list[bool]:
        batches.append(len(ids))
        return await original(self, link, ids)

    monkeypatch.setattr(Client, "_delete_many_on", spy)
    async with connected(*any_server.address, tube_name) as admin:
        total = 8
        await admin.put_many([b"%d" % i for i in range(total)])
        started: list[int] = []
        release = asyncio.Event()
        client = Client(*any_server.address)
        consumer = client.consume(tube_name, concurrency=total, connections=1, push=push)

        async def handler(job: Job) -> None:
            started.append(job.id)
            if len(started) == total:
                release.set()  # every handler ends in the same loop turn
            await release.wait()
            if len(started) == total and job.id == started[-1]:
                consumer.stop()

        async with asyncio.timeout(WAIT_S):
            await consumer.run(handler)
        assert batches == [total]
        stats = await tube_settles(admin, tube_name, current_jobs_reserved=0,
                                   current_jobs_ready=0)
        assert stats["cmd-delete"] == total


# -- tubeq-cli put-many --------------------------------------------------------------------------

def test_cli_put_many_puts_one_job_per_line(any_server: ServerProcess, tube_name: str) -> None:
    cli = Cli(any_server.host, any_server.port, any_server.kind)
    out = cli.json("put-many", "-t", tube_name, "--pri", "9", stdin=b"one\n\ntwo\r\nthree\n")
    assert out["tube"] == tube_name and out["refused"] == [] and len(out["ids"]) == 3
    shown = cli.json("peek", str(out["ids"][1]))
    assert (shown["body"], shown["pri"]) == ("two", 9)
    text = cli.run("delete", *map(str, out["ids"])).stdout
    assert text == "".join(f"deleted job {i}\n" for i in out["ids"])
    # A refused job: the others are put and shown, then one line on stderr and status 1.
    done = cli.run("put-many", "-t", tube_name, stdin=b"ok\n" + b"x" * 70_000 + b"\n",
                   status=1)
    assert done.stdout.startswith("inserted job ") and done.stdout.count("\n") == 1
    assert done.stderr.startswith("tubeq-cli: 1 of 2 jobs refused (line 2: ")
    assert done.stderr.count("\n") == 1
