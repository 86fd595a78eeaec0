"""Dependencies (put-with after=): a job held until its parents finished, through a real tubeq
process's context and its private Redis (the parents' ends reach the children through the
process's drain, tubeq.server.parents), on one Redis root and over shards."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest

from tests.server.test_connection import Client
from tests.support.contexts import server_context
from tubeq.server.context import ServerContext
from tubeq.store.shards import shard_of_id, shard_of_tube


@pytest.fixture(params=[1, 4], ids=["one-root", "shards-4"])
async def ctx(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[ServerContext]:
    async with server_context(redis_url, f"after{request.param}", request.param) as ctx:
        yield ctx


async def line(client: Client) -> bytes:
    """The next reply line, taken off the client's output."""
    out = await client.until(lambda o: b"\r\n" in o)
    end = out.index(b"\r\n") + 2
    del client.transport.out[:end]
    return out[:end]


async def read(client: Client, n: int) -> bytes:
    out = await client.until(lambda o: len(o) >= n)
    del client.transport.out[:n]
    return out[:n]


async def read_reply(client: Client) -> bytes:
    """An OK reply's document."""
    header = await line(client)
    found = re.fullmatch(rb"OK (\d+)\r\n", header)
    assert found, header
    return (await read(client, int(found[1]) + 2))[:-2]


async def put(client: Client, tube: str, body: bytes, options: str = "") -> int:
    client.send(b"put-with 0 0 60 %d tube=%s%s\r\n%s\r\n" % (
        len(body), tube.encode(), b" " + options.encode() if options else b"", body))
    reply = await line(client)
    found = re.fullmatch(rb"INSERTED (\d+)\r\n", reply)
    assert found, reply
    return int(found[1])


async def reserve(client: Client, tube: str) -> tuple[int, bytes]:
    client.send(b"watch %s\r\nreserve-with-timeout 5\r\n" % tube.encode())
    assert re.fullmatch(rb"WATCHING \d+\r\n", await line(client))
    reply = await line(client)
    found = re.fullmatch(rb"RESERVED (\d+) (\d+)\r\n", reply)
    assert found, reply
    body = await read(client, int(found[2]) + 2)
    client.send(b"ignore %s\r\n" % tube.encode())
    assert re.fullmatch(rb"WATCHING \d+\r\n", await line(client))
    return int(found[1]), body[:-2]


async def stats_job_state(client: Client, job_id: int) -> str:
    client.send(b"stats-job %d\r\n" % job_id)
    doc = await read_reply(client)
    state = re.search(rb"\nstate: (\w+)\n", doc)
    assert state
    return state[1].decode()


async def test_a_child_runs_once_every_parent_finished_in_other_tubes(
        ctx: ServerContext) -> None:
    producer, worker = Client(ctx), Client(ctx)
    a = await put(producer, "images", b"a")
    b = await put(producer, "mail", b"b")
    child = await put(producer, "report", b"c", f"after={a},{b}")
    assert await stats_job_state(producer, child) == "held"
    worker.send(b"watch report\r\nignore default\r\nreserve-with-timeout 0\r\n")
    await worker.expect(b"WATCHING 2\r\nWATCHING 1\r\nTIMED_OUT\r\n")
    worker.send(b"ignore report\r\n")  # (refused: the last tube watched)
    await worker.expect(b"NOT_IGNORED\r\n")
    for tube, parent in (("images", a), ("mail", b)):
        job_id, _ = await reserve(producer, tube)
        assert job_id == parent
        producer.send(b"finish %d 2\r\nok\r\n" % parent)
        await producer.expect(b"FINISHED\r\n")
        if parent == a:
            await asyncio.sleep(0.2)
            assert await stats_job_state(producer, child) == "held"
    worker.send(b"reserve-with-timeout 5\r\n")
    await worker.expect(b"RESERVED %d 1\r\nc\r\n" % child)
    # the child reads its parents' results with wait: their ends are kept
    worker.send(b"wait %d 0\r\nwait %d 0\r\n" % (a, b))
    await worker.expect(b"ENDED %d finished 2\r\nok\r\nENDED %d finished 2\r\nok\r\n" % (a, b))


async def test_a_parent_deleted_by_its_holder_counts_as_done(ctx: ServerContext) -> None:
    client = Client(ctx)
    parent = await put(client, "jobs", b"p")
    child = await put(client, "jobs", b"c", f"after={parent}")
    job_id, _ = await reserve(client, "jobs")
    assert job_id == parent  # the held child is not reservable
    client.send(b"delete %d\r\n" % parent)
    await client.expect(b"DELETED\r\n")
    assert await reserve(client, "jobs") == (child, b"c")


@pytest.mark.parametrize("how", ["bury", "delete-unrun", "cancel", "cancel-then-delete"])
async def test_a_parent_that_ends_unfinished_buries_its_child_and_its_waiters_hear(
        ctx: ServerContext, how: str) -> None:
    client, waiter = Client(ctx), Client(ctx)
    parent = await put(client, "jobs", b"p")
    child = await put(client, "other", b"c", f"after={parent}")
    grandchild = await put(client, "third", b"g", f"after={child}")
    waiter.send(b"wait %d 10\r\n" % child)
    await asyncio.sleep(0.1)
    if how == "bury":
        assert (await reserve(client, "jobs"))[0] == parent
        client.send(b"bury %d 0\r\n" % parent)
        await client.expect(b"BURIED\r\n")
    elif how == "cancel":
        client.send(b"cancel %d\r\n" % parent)
        await client.expect(b"CANCELLED\r\n")
    elif how == "cancel-then-delete":  # cancelled while held: its holder's delete is no done
        assert (await reserve(client, "jobs"))[0] == parent
        canceller = Client(ctx)
        canceller.send(b"cancel %d\r\n" % parent)
        await canceller.expect(b"CANCELLED\r\n")
        client.send(b"delete %d\r\n" % parent)
        await client.expect(b"DELETED\r\n")
    else:
        client.send(b"delete %d\r\n" % parent)
        await client.expect(b"DELETED\r\n")
    await waiter.expect(b"ENDED %d buried 13\r\nparent-failed\r\n" % child)
    for _ in range(50):  # the grandchild hears its parent's bury in turn
        if await stats_job_state(client, grandchild) == "buried":
            break
        await asyncio.sleep(0.05)
    assert await stats_job_state(client, grandchild) == "buried"
    client.send(b"list-jobs other buried 0 10\r\nstats-tube other\r\n")
    listing = await read_reply(client)
    assert b"%d" % child in listing
    tube_doc = await read_reply(client)
    assert b"\ntotal-parent-failed: 1\n" in tube_doc and b"\ncurrent-jobs-held: 0\n" in tube_doc


async def test_bad_after_values_and_unknown_parents_store_nothing(ctx: ServerContext) -> None:
    client = Client(ctx)
    parent = await put(client, "jobs", b"p")
    for bad in (b"after=", b"after=0", b"after=1,,2", b"after=x", b"after=01",
                b"after=18446744073709551616", b"after=" + b",".join(b"%d" % i for i in
                                                                     range(1, 1002))):
        client.send(b"put-with 0 0 60 1 " + bad + b"\r\nz\r\n")
        await client.expect(b"BAD_OPTION after\r\n")
    # an id never put; the id the job itself is about to get (no cycle can be built: a
    # parent must exist before its child)
    client.send(b"put-with 0 0 60 1 after=%d,999999\r\nz\r\n" % parent)
    await client.expect(b"UNKNOWN_PARENT 999999\r\n")
    shards = getattr(ctx.store, "count", 1)
    own = parent + shards  # the next id of the parent's shard: the tube's own, as it is "jobs"
    client.send(b"put-with 0 0 60 1 tube=jobs after=%d\r\nz\r\n" % own)
    await client.expect(b"UNKNOWN_PARENT %d\r\n" % own)
    assert await put(client, "jobs", b"next") == own  # the refused puts used no id
    client.send(b"stats-tube default\r\n")
    doc = await read_reply(client)
    assert b"\ntotal-jobs: 0\n" in doc  # nothing stored in the used tube
    client.send(b"stats\r\n")
    stats = await read_reply(client)
    assert b"\ntotal-jobs: 2\n" in stats  # the parent and "next" only
    job_id, _ = await reserve(client, "jobs")
    assert job_id == parent


async def test_kick_does_not_release_a_held_job_and_clear_tube_removes_it(
        ctx: ServerContext) -> None:
    client = Client(ctx)
    parent = await put(client, "jobs", b"p")
    child = await put(client, "kids", b"c", f"after={parent}")
    client.send(b"use kids\r\nkick 10\r\nkick-job %d\r\nreserve-job %d\r\n" % (child, child))
    await client.expect(b"USING kids\r\nKICKED 0\r\nNOT_FOUND\r\nNOT_FOUND\r\n")
    client.send(b"list-jobs kids held 0 10\r\n")
    assert b"%d" % child in await read_reply(client)
    client.send(b"clear-tube kids all\r\n")
    await client.expect(b"CLEARED 1\r\n")
    client.send(b"stats-job %d\r\n" % child)
    await client.expect(b"NOT_FOUND\r\n")


async def test_a_fan_in_of_many_parents_runs_its_child_once(ctx: ServerContext) -> None:
    producer, worker = Client(ctx), Client(ctx)
    parents = [await put(producer, f"part{i % 7}", b"p") for i in range(60)]
    child = await put(producer, "sum", b"all", "after=" + ",".join(map(str, parents)))
    if ctx.store.__class__.__name__ == "ShardedStore":  # parents on several shards indeed
        assert len({shard_of_id(p, 4) for p in parents}) > 1
        assert shard_of_tube("sum", 4) is not None
    worker.send(b"watch sum\r\n")
    await worker.expect(b"WATCHING 2\r\n")
    for i in range(7):
        producer.send(b"watch part%d\r\n" % i)
        await line(producer)
    producer.send(b"ignore default\r\n")
    await line(producer)
    for _ in parents:
        producer.send(b"reserve-with-timeout 5\r\n")
        reply = await line(producer)
        found = re.fullmatch(rb"RESERVED (\d+) 1\r\n", reply)
        assert found, reply
        await read(producer, 3)
        producer.send(b"finish %s 0\r\n\r\n" % found[1])
        await producer.expect(b"FINISHED\r\n")
    worker.send(b"reserve-with-timeout 5\r\n")
    await worker.expect(b"RESERVED %d 3\r\nall\r\n" % child)
    worker.send(b"delete %d\r\nreserve-with-timeout 1\r\n" % child)
    await worker.expect(b"DELETED\r\nTIMED_OUT\r\n")


async def test_stats_job_counts_a_held_jobs_parents_to_come(ctx: ServerContext) -> None:
    client = Client(ctx)
    a = await put(client, "jobs", b"a")
    b = await put(client, "jobs", b"b")
    child = await put(client, "kids", b"c", f"after={a},{b}")
    client.send(b"stats-job %d\r\n" % child)
    assert b"\nparents-pending: 2\n" in await read_reply(client)
    assert (await reserve(client, "jobs"))[0] == a
    client.send(b"finish %d 0\r\n\r\n" % a)
    await client.expect(b"FINISHED\r\n")
    for _ in range(100):
        client.send(b"stats-job %d\r\n" % child)
        if b"\nparents-pending: 1\n" in await read_reply(client):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the finished parent was never counted out")
