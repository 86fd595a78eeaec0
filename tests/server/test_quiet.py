"""Quiet shutdowns on the server: ``hand-back`` (a job given back without a try), ``push ...
quiet=1`` with the ``QUIET`` frame, the ``quiet`` verb over every process, and a stopping
process quieting its push connections. Against a real tubeq process's context and its private
Redis, through a fake transport (tests.server.test_connection.Client)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from tests.server.test_connection import Client
from tubeq.server.context import ServerContext
from tubeq.server.process import Config, Server


@pytest.fixture
async def server(redis_url: str) -> AsyncIterator[Server]:
    server = Server(Config(port=0, redis_url=redis_url, prefix="quiet"))
    await server.start()
    assert server.ctx is not None
    yield server
    await server.stop()


@pytest.fixture
def ctx(server: Server) -> ServerContext:
    assert server.ctx is not None
    return server.ctx


@contextlib.asynccontextmanager
async def stopping_and_watcher(redis_url: str, prefix: str, grace_s: float,
                               ) -> AsyncIterator[tuple[Server, Client, Client]]:
    """Two processes on one namespace: the one to stop (its grace ``grace_s``), and a watcher
    that outlives it; a connection to each (the first's, then the watcher's)."""
    config = Config(port=0, redis_url=redis_url, prefix=prefix, shutdown_grace_s=grace_s)
    stopping, watcher = Server(config), Server(config)
    await stopping.start()
    await watcher.start()
    try:
        assert stopping.ctx is not None and watcher.ctx is not None
        yield stopping, Client(stopping.ctx), Client(watcher.ctx)
    finally:
        await watcher.stop()


async def stats_job(client: Client, job_id: int) -> dict[str, str]:
    client.send(b"stats-job %d\r\n" % job_id)
    out = await client.until(lambda o: o.endswith(b"\n\r\n"))
    client.transport.out.clear()
    return dict(line.split(": ", 1) for line in out.decode().splitlines()[2:] if ": " in line)


async def test_a_hand_back_makes_the_job_ready_at_once_without_a_try(
        ctx: ServerContext) -> None:
    """The job comes back at its own priority with no delay, its tries, releases and backoff
    untouched: a tube with max-tries=1 and a backoff would bury or delay it on a release."""
    client = Client(ctx)
    client.send(b"tube-set default max-tries=1 backoff-ms=60000\r\n"
                b"put 7 0 60 1\r\nx\r\nreserve\r\nhand-back 1\r\n")
    await client.expect(b"SET\r\nINSERTED 1\r\nRESERVED 1 1\r\nx\r\nRELEASED\r\n")
    job = await stats_job(client, 1)
    assert (job["state"], job["pri"], job["releases"], job["tries"], job["reserves"]) == (
        "ready", "7", "0", "0", "1")
    client.send(b"reserve-with-timeout 0\r\nrelease 1 7 0\r\n")  # a release is a try
    await client.expect(b"RESERVED 1 1\r\nx\r\nRELEASED\r\n")
    job = await stats_job(client, 1)
    assert (job["state"], job["tries"], job["reason"]) == ("buried", "1", "max-tries")


async def test_a_hand_back_of_a_job_not_held_here_is_not_found_and_changes_nothing(
        ctx: ServerContext) -> None:
    holder, other = Client(ctx), Client(ctx)
    holder.send(b"put 0 0 60 1\r\nx\r\nput 0 0 60 1\r\ny\r\nreserve\r\n")
    await holder.expect(b"INSERTED 1\r\nINSERTED 2\r\nRESERVED 1 1\r\nx\r\n")
    other.send(b"hand-back 1\r\nhand-back 2\r\nhand-back 99\r\n")
    await other.expect(b"NOT_FOUND\r\nNOT_FOUND\r\nNOT_FOUND\r\n")
    assert (await stats_job(holder, 1))["state"] == "reserved"
    assert (await stats_job(holder, 2))["state"] == "ready"


async def test_hand_back_bad_format(ctx: ServerContext) -> None:
    client = Client(ctx)
    client.send(b"hand-back\r\nhand-back x\r\nhand-back 1 2\r\nhand-back -1\r\n")
    await client.expect(b"UNKNOWN_COMMAND\r\n" + b"BAD_FORMAT\r\n" * 3)


async def test_a_hand_back_of_a_cancelled_job_answers_cancelled_and_it_is_gone(
        ctx: ServerContext) -> None:
    worker, admin = Client(ctx), Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    admin.send(b"cancel 1\r\n")
    await admin.expect(b"CANCELLED\r\n")
    worker.send(b"hand-back 1\r\npeek 1\r\n")
    await worker.expect(b"CANCELLED\r\nNOT_FOUND\r\n")


async def test_a_hand_back_past_the_ttl_expires_the_job(ctx: ServerContext) -> None:
    client = Client(ctx)
    client.send(b"put-with 0 0 60 1 ttl-ms=200\r\nx\r\nreserve\r\n")
    await client.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    await asyncio.sleep(0.3)
    client.send(b"hand-back 1\r\n")
    await client.expect(b"RELEASED\r\n")
    job = await stats_job(client, 1)
    assert (job["state"], job["reason"]) == ("buried", "expired")


async def test_a_hand_back_frees_the_push_credit(ctx: ServerContext) -> None:
    producer, consumer = Client(ctx), Client(ctx)
    producer.send(b"put 0 0 60 1\r\na\r\nput 0 0 60 1\r\nb\r\n")
    await producer.expect(b"INSERTED 1\r\nINSERTED 2\r\n")
    consumer.send(b"push 1\r\n")
    await consumer.expect(b"PUSHING 1\r\nRESERVED 1 1\r\na\r\n")
    consumer.send(b"hand-back 1\r\n")
    # Job 1 is ready again at once, ahead of job 2 by id: the freed credit takes it again.
    await consumer.expect(b"RELEASED\r\nRESERVED 1 1\r\na\r\n")


async def test_quiet_all_tells_the_connections_that_asked_and_stops_every_push(
        ctx: ServerContext) -> None:
    producer, asked, plain, admin = Client(ctx), Client(ctx), Client(ctx), Client(ctx)
    asked.send(b"push 5 quiet=1\r\n")
    await asked.expect(b"PUSHING 5\r\n")
    plain.send(b"push 5\r\n")
    await plain.expect(b"PUSHING 5\r\n")
    admin.send(b"quiet all\r\n")
    await admin.expect(b"QUIETING\r\n")
    await asked.expect(b"QUIET\r\n")
    producer.send(b"put 0 0 60 1\r\nx\r\n")
    await producer.expect(b"INSERTED 1\r\n")
    await asyncio.sleep(0.3)
    assert asked.transport.out == b"" and plain.transport.out == b""  # nobody took it
    asked.send(b"push 1\r\n")  # a quiet from an admin can be undone: it takes jobs again
    await asked.expect(b"PUSHING 1\r\nRESERVED 1 1\r\nx\r\n")


async def test_quiet_a_tube_or_a_connection_reaches_those_only(ctx: ServerContext) -> None:
    on_a, on_b, admin = Client(ctx), Client(ctx), Client(ctx)
    on_a.send(b"watch a\r\npush 5 quiet=1\r\n")
    await on_a.expect(b"WATCHING 2\r\nPUSHING 5\r\n")
    on_b.send(b"watch b\r\npush 5 quiet=1 cancels=1\r\n")
    await on_b.expect(b"WATCHING 2\r\nPUSHING 5\r\n")
    admin.send(b"quiet tube a\r\n")
    await admin.expect(b"QUIETING\r\n")
    await on_a.expect(b"QUIET\r\n")
    await asyncio.sleep(0.2)
    assert on_b.transport.out == b""
    admin.send(b"quiet conn " + on_b.conn.token.encode() + b"\r\nquiet conn nobody:1\r\n")
    await admin.expect(b"QUIETING\r\nQUIETING\r\n")
    await on_b.expect(b"QUIET\r\n")


async def test_quiet_bad_input(ctx: ServerContext) -> None:
    client = Client(ctx)
    client.send(b"quiet\r\nquiet everyone\r\nquiet tube\r\nquiet tube -bad\r\nquiet conn \r\n"
                b"quiet all \r\npush 1 quiet=2\r\npush 1 quiet=1 quiet=1\r\n")
    await client.expect(b"UNKNOWN_COMMAND\r\n" + b"BAD_FORMAT\r\n" * 5
                        + b"BAD_OPTION quiet\r\nBAD_OPTION quiet\r\n")


async def test_quiet_reaches_push_connections_of_every_process(
        redis_url: str, ctx: ServerContext) -> None:
    """The verb is heard over pub/sub: a push connection of another process on the same Redis
    and prefix is told as one of this process's is."""
    other = Server(Config(port=0, redis_url=redis_url, prefix="quiet"))
    await other.start()
    try:
        assert other.ctx is not None
        there, admin = Client(other.ctx), Client(ctx)
        there.send(b"push 5 quiet=1\r\n")
        await there.expect(b"PUSHING 5\r\n")
        admin.send(b"quiet all\r\n")
        await admin.expect(b"QUIETING\r\n")
        await there.expect(b"QUIET\r\n")
    finally:
        await other.stop()


async def test_a_stopping_process_quiets_its_push_connections(redis_url: str) -> None:
    """On stop (SIGTERM), before the grace: push loops take no more jobs, and the connections
    that asked hear QUIET; a later push asks in vain."""
    server = Server(Config(port=0, redis_url=redis_url, prefix="quiet", shutdown_grace_s=30.0))
    await server.start()
    ctx = server.ctx
    assert ctx is not None
    asked, producer = Client(ctx), Client(ctx)
    asked.send(b"push 5 quiet=1\r\n")
    await asked.expect(b"PUSHING 5\r\n")
    producer.send(b"put 0 0 60 1\r\nx\r\n")
    await producer.expect(b"INSERTED 1\r\n")
    await asked.expect(b"RESERVED 1 1\r\nx\r\n")
    stopping = asyncio.create_task(server.stop())
    await asked.expect(b"QUIET\r\n")
    producer.send(b"put 0 0 60 1\r\ny\r\n")
    await producer.expect(b"DRAINING\r\n")
    asked.send(b"push 5\r\n")
    await asked.expect(b"PUSHING 5\r\n")
    await asyncio.sleep(0.2)
    assert asked.transport.out == b""
    asked.send(b"hand-back 1\r\n")  # the holder gives its job back: the grace ends early
    await asked.expect(b"RELEASED\r\n")
    await asyncio.wait_for(stopping, 20.0)  # not the 30 s grace


async def test_jobs_a_stopping_process_takes_back_count_no_try(redis_url: str) -> None:
    """A connection still holding a job when its stopping process closes it (past the grace):
    the job is ready again with no try counted, where a client's own disconnect counts one."""
    async with stopping_and_watcher(redis_url, "quiet-stop", 0.1) as (stopping, worker, look):
        assert stopping.ctx is not None
        look.send(b"tube-set default max-tries=1\r\nput 0 0 60 1\r\nx\r\nput 0 0 60 1\r\ny\r\n")
        await look.expect(b"SET\r\nINSERTED 1\r\nINSERTED 2\r\n")
        worker.send(b"reserve\r\n")
        await worker.expect(b"RESERVED 1 1\r\nx\r\n")
        gone = Client(stopping.ctx)
        gone.send(b"reserve\r\n")
        await gone.expect(b"RESERVED 2 1\r\ny\r\n")
        await gone.gone()  # its own disconnect: a try, the last one (max-tries=1)
        assert (await stats_job(look, 2))["state"] == "buried"
        await stopping.stop()
        job = await stats_job(look, 1)
        assert (job["state"], job["tries"]) == ("ready", "0")


async def test_a_hand_back_frees_its_groups_slot(ctx: ServerContext) -> None:
    """In a tube with group-concurrency=1, a handed-back job's group may be served again at
    once: the job is ready at its place in its group, and its reservation is counted out."""
    client = Client(ctx)
    client.send(b"tube-set default group-concurrency=1\r\n"
                b"put-with 0 0 60 1 group=a\r\nx\r\nput-with 0 0 60 1 group=a\r\ny\r\n"
                b"reserve\r\nreserve-with-timeout 0\r\nhand-back 1\r\n"
                b"reserve-with-timeout 0\r\n")
    await client.expect(b"SET\r\nINSERTED 1\r\nINSERTED 2\r\nRESERVED 1 1\r\nx\r\n"
                        b"TIMED_OUT\r\nRELEASED\r\nRESERVED 1 1\r\nx\r\n")


async def test_a_clients_own_disconnect_during_the_grace_still_counts_a_try(
        redis_url: str) -> None:
    """Only the connections the stopping process closes give their jobs back without a try: a
    worker that drops its connection itself during the grace (it crashed on the job, say) ends
    a try, as always (here its last: max-tries=1 buries the job)."""
    async with stopping_and_watcher(redis_url, "quiet-grace", 30.0) as (stopping, worker, look):
        look.send(b"tube-set default max-tries=1\r\nput 0 0 60 1\r\nx\r\n")
        await look.expect(b"SET\r\nINSERTED 1\r\n")
        worker.send(b"reserve\r\n")
        await worker.expect(b"RESERVED 1 1\r\nx\r\n")
        stop = asyncio.create_task(stopping.stop())
        await asyncio.sleep(0.2)  # in the grace: the worker holds its job
        assert not stop.done()
        await worker.gone()
        await asyncio.wait_for(stop, 20.0)  # not the 30 s grace: nobody holds a job
        job = await stats_job(look, 1)
        assert (job["state"], job["tries"], job["reason"]) == ("buried", "1", "max-tries")
