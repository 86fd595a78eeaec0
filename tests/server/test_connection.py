"""Layer (b): the connection adapter driven byte by byte through a fake transport.

The store is real (a private Redis): what is under test is the connection's own logic: reply
order, pipelined dispatch, the reserve barrier, quit, half-close, disconnect cleanup, drain
mode, and a failing store turning into INTERNAL_ERROR without losing the connection.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tubeq.protocol import commands as c
from tubeq.redisio.client import RedisNotSent, RedisReplyError
from tubeq.server.connection import Connection
from tubeq.server.context import ServerContext
from tubeq.server.flow import TURN_BUDGET
from tubeq.server.handlers import GATE_HANDLERS, HANDLERS
from tubeq.server.process import Config, Server
from tubeq.server.stats import COMMAND_COUNTERS
from tubeq.server.waiters import WaiterRegistry
from tubeq.store.records import Reservation

REPLY_WAIT_S = 5.0


class FakeTransport(asyncio.Transport):
    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.out = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "write after close"
        self.out += data

    def close(self) -> None:
        # Like asyncio's transports: connection_lost follows on a later loop iteration.
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0  # the fake client takes every byte at once

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class PausingTransport(FakeTransport):
    """A client that stops taking replies once ``PAUSE_PAST`` bytes have been written to it:
    the transport tells the protocol to pause writing, as asyncio's do at their high-water mark."""

    PAUSE_PAST = 100

    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__(protocol)
        self.written = 0
        self.paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        super().write(data)
        self.written += len(data)
        if self.written > self.PAUSE_PAST and not self.paused:
            self.paused = True
            self.protocol.pause_writing()


class Client:
    """One fake client: feeds bytes, waits for reply bytes."""

    def __init__(self, ctx: ServerContext,
                 transport_type: type[FakeTransport] = FakeTransport) -> None:
        self.conn = Connection(ctx)
        self.transport = transport_type(self.conn)
        self.conn.connection_made(self.transport)

    def send(self, data: bytes) -> None:
        self.conn.data_received(data)

    async def until(self, predicate: Callable[[bytes], bool]) -> bytes:
        async def poll() -> None:
            while not predicate(bytes(self.transport.out)):
                await asyncio.sleep(0.005)

        await asyncio.wait_for(poll(), REPLY_WAIT_S)
        return bytes(self.transport.out)

    async def expect(self, reply: bytes) -> None:
        got = await self.until(lambda out: len(out) >= len(reply))
        assert got == reply
        self.transport.out.clear()

    async def gone(self) -> None:
        self.transport.close()
        await asyncio.wait_for(self.conn.wait_closed(), REPLY_WAIT_S)


@pytest.fixture
async def ctx(redis_url: str) -> AsyncIterator[ServerContext]:
    """The shared context of a real tubeq process (scheduler, subscriber) on port 0."""
    server = Server(Config(port=0, redis_url=redis_url, prefix="conn"))
    await server.start()
    assert server.ctx is not None
    yield server.ctx
    await server.stop()


NewClient = Callable[[], Client]


@pytest.fixture
def new_client(ctx: ServerContext) -> NewClient:
    return lambda: Client(ctx)


async def test_pipelined_replies_come_back_in_order(new_client: NewClient) -> None:
    a = new_client()
    a.send(b"put 0 0 10 1\r\na\r\nuse t\r\nput 0 0 10 1\r\nb\r\nlist-tube-used\r\n"
           b"peek 1\r\nstats-job 99\r\n")
    await a.expect(b"INSERTED 1\r\nUSING t\r\nINSERTED 2\r\nUSING t\r\nFOUND 1 1\r\na\r\n"
                   b"NOT_FOUND\r\n")


async def test_puts_redis_refuses_leave_total_jobs_and_cmd_put_exact(
        new_client: NewClient, ctx: ServerContext, redis_url: str) -> None:
    """A put Redis refuses (OOM) stores nothing and counts nowhere in total-jobs (the script
    that stores a job counts it); its cmd-put stays (beanstalkd counts a put whatever it
    answers): the counters call Redis refused meanwhile is sent again, so no count is lost."""
    import redis.asyncio

    raw = redis.asyncio.Redis.from_url(redis_url)
    a = new_client()
    a.send(b"put 0 0 10 1\r\nx\r\n")
    await a.expect(b"INSERTED 1\r\n")
    await raw.config_set("maxmemory", "1")  # noeviction: every write is refused with OOM
    try:
        a.send(b"put 0 0 10 1\r\ny\r\nput 0 0 10 1\r\nz\r\n")
        await a.expect(b"INTERNAL_ERROR\r\nINTERNAL_ERROR\r\n")
        ctx.counters.flush()  # refused too: its counts come back to be sent again
        await asyncio.sleep(0.1)
    finally:
        await raw.config_set("maxmemory", "0")
        await raw.aclose()
    a.send(b"stats\r\n")
    reply = await a.until(lambda out: b"\nmax-job-size" in out and out.endswith(b"\r\n"))
    figures = dict(line.split(": ", 1) for line in reply.decode().splitlines() if ": " in line)
    assert (figures["cmd-put"], figures["total-jobs"]) == ("3", "1")
    a.transport.out.clear()
    a.send(b"stats-tube default\r\n")
    reply = await a.until(lambda out: b"pause-time-left" in out)
    assert "total-jobs: 1\n" in reply.decode()


async def test_byte_at_a_time_gives_the_same_replies(new_client: NewClient) -> None:
    a = new_client()
    for byte in b"put 1 0 10 3\r\nabc\r\nreserve\r\n":
        a.send(bytes([byte]))
    await a.expect(b"INSERTED 1\r\nRESERVED 1 3\r\nabc\r\n")


async def test_commands_behind_a_blocked_reserve_wait_for_it(new_client: NewClient) -> None:
    a, b = new_client(), new_client()
    a.send(b"reserve\r\nlist-tube-used\r\n")
    await asyncio.sleep(0.1)
    assert a.transport.out == b""
    b.send(b"put 0 0 10 2\r\nhi\r\n")
    await b.expect(b"INSERTED 1\r\n")
    await a.expect(b"RESERVED 1 2\r\nhi\r\nUSING default\r\n")


async def test_quit_drops_what_follows_and_closes(new_client: NewClient) -> None:
    a = new_client()
    a.send(b"list-tube-used\r\nquit\r\nput 0 0 10 1\r\nx\r\n")
    await a.expect(b"USING default\r\n")
    await a.until(lambda _: a.transport.closed)
    b = new_client()
    b.send(b"peek-ready\r\n")
    await b.expect(b"NOT_FOUND\r\n")


async def test_half_close_while_blocked_times_out_then_closes(new_client: NewClient) -> None:
    a = new_client()
    a.send(b"reserve\r\n")
    await asyncio.sleep(0.05)
    assert a.conn.eof_received() is True
    await a.expect(b"TIMED_OUT\r\n")
    await a.until(lambda _: a.transport.closed)


async def test_half_close_runs_what_a_blocked_reserve_held(new_client: NewClient) -> None:
    """Issue 35: the put held behind the reserve runs and answers once the EOF has made the
    reserve answer TIMED_OUT; only then does the connection close."""
    a = new_client()
    a.send(b"watch empty\r\nignore default\r\nreserve\r\nput 0 0 10 1\r\nz\r\n")
    await a.expect(b"WATCHING 2\r\nWATCHING 1\r\n")
    await asyncio.sleep(0.05)
    assert a.conn.eof_received() is True
    await a.expect(b"TIMED_OUT\r\nINSERTED 1\r\n")
    await a.until(lambda _: a.transport.closed)
    b = new_client()
    b.send(b"peek-ready\r\n")
    await b.expect(b"FOUND 1 1\r\nz\r\n")


async def test_half_close_waits_for_the_pump_stopped_by_backpressure(
        ctx: ServerContext) -> None:
    """After the EOF, commands the pump left because the client stopped taking replies still
    run once it takes them again: the connection does not close with them unanswered."""
    a = Client(ctx, PausingTransport)
    # TIMED_OUT fits under PAUSE_PAST; the replies of the pump's first turn do not.
    a.send(b"reserve-with-timeout 5\r\n" + b"list-tube-used\r\n" * (TURN_BUDGET + 36))
    await asyncio.sleep(0.05)
    assert a.conn.eof_received() is True
    await a.expect(b"TIMED_OUT\r\n" + b"USING default\r\n" * TURN_BUDGET)
    await asyncio.sleep(0.05)
    assert not a.transport.closed
    a.conn.resume_writing()
    await a.expect(b"USING default\r\n" * 36)
    await a.until(lambda _: a.transport.closed)


async def test_disconnect_returns_reserved_jobs_at_once(new_client: NewClient) -> None:
    a, b = new_client(), new_client()
    a.send(b"put 0 0 100 1\r\nx\r\nreserve\r\n")
    await a.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    b.send(b"reserve-with-timeout 5\r\n")
    await a.gone()
    await b.expect(b"RESERVED 1 1\r\nx\r\n")
    b.send(b"stats-job 1\r\n")
    out = await b.until(lambda o: o.endswith(b"kicks: 0\n\r\n"))
    assert b"reserves: 2\n" in out and b"timeouts: 0\n" in out and b"releases: 0\n" in out


async def test_deadline_soon_when_holding_a_job_in_its_margin(new_client: NewClient) -> None:
    a = new_client()
    a.send(b"put 0 0 1 1\r\nx\r\nreserve\r\nreserve-with-timeout 0\r\n")
    await a.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\nDEADLINE_SOON\r\n")


async def test_failed_store_call_answers_internal_error_and_keeps_serving(
        new_client: NewClient, ctx: ServerContext) -> None:
    a = new_client()
    a.send(b"list-tube-used\r\n")
    await a.expect(b"USING default\r\n")
    real_put = ctx.store.put

    def failing_put(*args: Any) -> asyncio.Future[int]:
        f: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        f.set_exception(ConnectionError("redis is gone"))
        return f

    ctx.store.put = failing_put  # type: ignore[method-assign]
    a.send(b"put 0 0 10 1\r\nx\r\nlist-tube-used\r\n")
    await a.expect(b"INTERNAL_ERROR\r\nUSING default\r\n")
    ctx.store.put = real_put  # type: ignore[method-assign]
    a.send(b"put 0 0 10 1\r\nx\r\n")
    await a.expect(b"INSERTED 1\r\n")


async def test_drain_mode_refuses_puts_but_uses_their_ids(
        new_client: NewClient, ctx: ServerContext) -> None:
    a = new_client()
    ctx.draining = True
    a.send(b"put 0 0 10 1\r\nx\r\n")
    await a.expect(b"DRAINING\r\n")
    ctx.draining = False
    a.send(b"put 0 0 10 1\r\nx\r\n")
    await a.expect(b"INSERTED 2\r\n")


async def test_ttr_expiry_returns_the_job_while_its_owner_is_idle(new_client: NewClient) -> None:
    a, b = new_client(), new_client()
    a.send(b"put 0 0 1 1\r\nx\r\nreserve\r\n")
    await a.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    # a stays silent: the scheduler alone must bring the job back
    b.send(b"reserve-with-timeout 5\r\n")
    await b.expect(b"RESERVED 1 1\r\nx\r\n")
    a.send(b"delete 1\r\n")
    await a.expect(b"NOT_FOUND\r\n")


async def test_a_bad_line_does_not_stop_the_next(new_client: NewClient) -> None:
    a = new_client()
    a.send(b"bogus\r\n" + b"x" * 300 + b"\r\nput 0 0 10 70000\r\n" + b"z" * 70002 +
           b"list-tube-used\r\n")
    await a.expect(b"UNKNOWN_COMMAND\r\nBAD_FORMAT\r\nJOB_TOO_BIG\r\nUSING default\r\n")



async def test_push_delivers_up_to_its_credits_and_a_delete_frees_one(
        new_client: NewClient) -> None:
    producer, worker = new_client(), new_client()
    producer.send(b"".join(b"put 0 0 60 1\r\n%d\r\n" % i for i in range(3)))
    await producer.expect(b"INSERTED 1\r\nINSERTED 2\r\nINSERTED 3\r\n")
    worker.send(b"push 2\r\n")
    await worker.expect(b"PUSHING 2\r\nRESERVED 1 1\r\n0\r\nRESERVED 2 1\r\n1\r\n")
    await asyncio.sleep(0.1)
    assert worker.transport.out == b"", "a third job went out beyond the two credits"
    worker.send(b"delete 1\r\n")
    await worker.expect(b"DELETED\r\nRESERVED 3 1\r\n2\r\n")


async def _three_pushed_of(new_client: NewClient, jobs: int) -> tuple[Client, Client]:
    """A producer that put ``jobs`` jobs (bodies 0, 1, ...) and a worker pushed the first three
    (``push 3``)."""
    producer, worker = new_client(), new_client()
    producer.send(b"".join(b"put 0 0 60 1\r\n%d\r\n" % i for i in range(jobs)))
    await producer.until(lambda o: o.count(b"INSERTED") == jobs)
    worker.send(b"push 3\r\n")
    await worker.expect(b"PUSHING 3\r\n" + b"".join(b"RESERVED %d 1\r\n%d\r\n" % (i, i - 1)
                                                   for i in range(1, 4)))
    return producer, worker


async def test_push_credits_freed_by_one_delete_many_come_back_together(
        new_client: NewClient) -> None:
    """A delete-many of pushed jobs frees each one's credit (the tube counts the three it
    deleted): the next jobs are pushed for all of them; an id it did not delete frees
    nothing."""
    producer, worker = await _three_pushed_of(new_client, 7)
    worker.send(b"delete-many 1 2 99 3\r\n")
    await worker.expect(b"BATCH 4\r\nDELETED\r\nDELETED\r\nNOT_FOUND\r\nDELETED\r\n"
                        + b"".join(b"RESERVED %d 1\r\n%d\r\n" % (i, i - 1) for i in range(4, 7)))
    await asyncio.sleep(0.1)
    assert worker.transport.out == b"", "a job went out beyond the three credits freed"
    producer.send(b"stats-tube default\r\n")
    out = await producer.until(lambda o: b"pause-time-left" in o)
    assert b"\ncmd-delete: 3\n" in out


async def test_credits_a_delete_many_frees_are_taken_in_the_same_redis_write(
        new_client: NewClient, ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A push connection's delete-many (nothing it could wait behind): the next take is sent
    before Redis answered the deletes, so both calls leave in one write; it takes no more
    than the credits freed, and the client reads the deletes' replies before the new jobs."""
    _, worker = await _three_pushed_of(new_client, 6)
    order: list[str] = []
    real_delete_many, real_reserve_many = ctx.store.delete_many, ctx.store.reserve_many

    def delete_many(*args: Any, **kwargs: Any) -> Any:
        call = real_delete_many(*args, **kwargs)
        call.add_done_callback(lambda _: order.append("deletes answered"))
        order.append("deletes sent")
        return call

    def reserve_many(*args: Any, **kwargs: Any) -> Any:
        order.append(f"take of {args[1]} sent")
        return real_reserve_many(*args, **kwargs)

    monkeypatch.setattr(ctx.store, "delete_many", delete_many)
    monkeypatch.setattr(ctx.store, "reserve_many", reserve_many)
    worker.send(b"delete-many 1 2\r\n")
    await worker.expect(b"BATCH 2\r\nDELETED\r\nDELETED\r\n"
                        + b"".join(b"RESERVED %d 1\r\n%d\r\n" % (i, i - 1) for i in (4, 5)))
    assert order[:3] == ["deletes sent", "take of 2 sent", "deletes answered"]
    await asyncio.sleep(0.1)
    assert worker.transport.out == b"", "a job went out beyond the two credits freed"


async def test_credits_that_come_back_to_an_empty_tube_still_hear_the_next_put(
        new_client: NewClient) -> None:
    """Every credit used, then the jobs deleted while the tube is empty: the take the freed
    credits send with the delete-many finds nothing, and the loop must wait counted in all
    the same, so the next put is pushed at once, not at the loop's periodic re-check
    (reserve_wait.RECHECK_S, 10 s later). (A request/reply over reply tubes hit this: the
    worker's deletes left before the callers' next requests, every time.)"""
    producer, worker = await _three_pushed_of(new_client, 3)
    producer.transport.out.clear()
    worker.send(b"delete-many 1 2 3\r\n")
    await worker.expect(b"BATCH 3\r\nDELETED\r\nDELETED\r\nDELETED\r\n")
    await asyncio.sleep(0.1)  # the take sent with the deletes came back empty
    producer.send(b"put 0 0 60 1\r\n9\r\n")
    await producer.expect(b"INSERTED 4\r\n")
    await asyncio.wait_for(worker.expect(b"RESERVED 4 1\r\n9\r\n"), 3)
    producer.send(b"put 0 0 60 1\r\n8\r\n")  # and the one after, its credit free
    await producer.expect(b"INSERTED 5\r\n")
    await asyncio.wait_for(worker.expect(b"RESERVED 5 1\r\n8\r\n"), 3)


async def _a_later_put_is_not_pushed(producer: Client, worker: Client, why: str) -> None:
    """Once the take a delete-many's credits sent came back empty (its tube emptied by
    ``_three_pushed_of(..., 3)``): a put's job (id 4) does not reach ``worker``."""
    await asyncio.sleep(0.2)
    producer.send(b"put 0 0 60 1\r\n9\r\n")
    await producer.expect(b"INSERTED 4\r\n")
    await asyncio.sleep(0.3)
    assert worker.transport.out == b"", why


async def test_push_0_read_with_a_delete_many_pushes_no_job_put_later(
        new_client: NewClient) -> None:
    """`push 0` in the same read as a delete-many that freed every credit: the take those
    credits allowed is sized by the turn's end (none), and no later put is pushed."""
    producer, worker = await _three_pushed_of(new_client, 3)
    producer.transport.out.clear()
    worker.send(b"delete-many 1 2 3\r\npush 0\r\n")
    await worker.expect(b"BATCH 3\r\nDELETED\r\nDELETED\r\nDELETED\r\nPUSHING 0\r\n")
    await _a_later_put_is_not_pushed(producer, worker, "a job was pushed after PUSHING 0")


async def test_push_1_read_with_a_delete_many_gets_at_most_one_job(
        new_client: NewClient) -> None:
    """Credits lowered in the same read as the delete-many that freed three: one job comes,
    not three (the take is sized when the turn ends)."""
    _, worker = await _three_pushed_of(new_client, 7)
    worker.send(b"delete-many 1 2 3\r\npush 1\r\n")
    await worker.expect(b"BATCH 3\r\nDELETED\r\nDELETED\r\nDELETED\r\nPUSHING 1\r\n"
                        b"RESERVED 4 1\r\n3\r\n")
    await asyncio.sleep(0.3)
    assert worker.transport.out == b"", "a job went out beyond the one credit"


async def test_quiet_heard_with_a_delete_many_pushes_no_job_put_later(
        new_client: NewClient, ctx: ServerContext) -> None:
    """An admin's quiet heard in the loop iteration of a delete-many that freed credits on an
    empty tube: the loop counts itself out, and a later put goes to nobody's push."""
    producer, worker = await _three_pushed_of(new_client, 3)
    producer.transport.out.clear()
    worker.send(b"delete-many 1 2 3\r\n")
    ctx.quiet_consumers("all")
    await worker.expect(b"BATCH 3\r\nDELETED\r\nDELETED\r\nDELETED\r\n")
    await _a_later_put_is_not_pushed(producer, worker, "a job was pushed after quiet")


@pytest.mark.parametrize("loss_first", [True, False], ids=["loss-then-take", "take-then-loss"])
async def test_a_lost_registration_and_a_delete_many_leave_the_next_put_to_others(
        new_client: NewClient, loss_first: bool) -> None:
    """Redis lost the waiters' registrations (restored) around a delete-many that freed a
    credit, heard before the turn sent the take or after it, before the loop ran: the loop and
    Redis still agree on whether it waits (it counts in again only once no take is out), so a
    later put with the loop's credits full goes to another connection's reserve."""
    producer, worker = await _three_pushed_of(new_client, 4)  # job 4 still ready
    producer.transport.out.clear()
    if loss_first:
        worker.conn.registration_lost()
    worker.send(b"delete-many 1\r\n")  # the turn's end sends the take
    if not loss_first:
        worker.conn.registration_lost()
    await worker.expect(b"BATCH 1\r\nDELETED\r\nRESERVED 4 1\r\n3\r\n")  # credits full
    await asyncio.sleep(0.2)
    other = new_client()
    producer.send(b"put 0 0 60 1\r\n9\r\n")
    await producer.expect(b"INSERTED 5\r\n")
    other.send(b"reserve-with-timeout 1\r\n")
    await other.expect(b"RESERVED 5 1\r\n9\r\n")


async def test_a_delete_many_sent_again_after_a_reserve_takes_for_its_credits_at_once(
        new_client: NewClient) -> None:
    """A delete-many Redis deferred behind the connection's waiting reserve is sent again
    outside a read's turn: the take its freed credits allow goes with it, and nothing is left
    to be sent by a later turn (a take nobody awaits, holding a job out of everyone's reach
    until the loop's 10 s re-check)."""
    holder = new_client()  # holds job 1 of tube t, to release it later
    holder.send(b"use t\r\nput 0 0 60 1\r\nJ\r\nwatch t\r\nignore default\r\nreserve\r\n")
    await holder.expect(
        b"USING t\r\nINSERTED 1\r\nWATCHING 2\r\nWATCHING 1\r\nRESERVED 1 1\r\nJ\r\n")
    waiter = new_client()  # the older waiter of t
    waiter.send(b"watch t\r\nignore default\r\nreserve\r\n")
    await waiter.expect(b"WATCHING 2\r\nWATCHING 1\r\n")
    producer, worker = new_client(), new_client()
    producer.send(b"".join(b"put 0 0 60 1\r\n%d\r\n" % i for i in range(3)))
    await producer.until(lambda o: o.count(b"INSERTED") == 3)
    producer.transport.out.clear()
    worker.send(b"watch t\r\npush 3\r\n")
    await worker.expect(b"WATCHING 2\r\nPUSHING 3\r\n"
                        + b"".join(b"RESERVED %d 1\r\n%d\r\n" % (i, i - 2) for i in (2, 3, 4)))
    worker.send(b"reserve\r\ndelete-many 2 3 4\r\n")  # the deletes wait for the reserve
    await asyncio.sleep(0.2)
    producer.send(b"put 0 0 60 1\r\n5\r\n")
    await producer.expect(b"INSERTED 5\r\n")
    await worker.expect(b"RESERVED 5 1\r\n5\r\nBATCH 3\r\nDELETED\r\nDELETED\r\nDELETED\r\n")
    await asyncio.sleep(0.3)
    holder.send(b"release 1 0 0\r\n")
    worker.send(b"list-tube-used\r\n")  # any command: a turn of the worker's
    await holder.expect(b"RELEASED\r\n")

    async def someone_has_job_1() -> None:
        while not any(b"RESERVED 1 " in c.transport.out for c in (waiter, worker)):
            await asyncio.sleep(0.005)

    await asyncio.wait_for(someone_has_job_1(), 2.0)


async def test_a_stopping_process_takes_no_job_for_freed_credits(
        new_client: NewClient, ctx: ServerContext) -> None:
    _, worker = await _three_pushed_of(new_client, 6)
    ctx.stopping = True  # as Server.stop sets it (its quiet left out: credits stay 3)
    try:
        worker.send(b"delete-many 1 2 3\r\n")
        await worker.expect(b"BATCH 3\r\nDELETED\r\nDELETED\r\nDELETED\r\n")
        await asyncio.sleep(0.2)
        assert worker.transport.out == b"", "jobs pushed while the process stops"
    finally:
        ctx.stopping = False


async def test_a_failed_delete_many_leaves_its_pushed_jobs_reserved_and_their_credits_free(
        new_client: NewClient, ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """protocol.md (push): a delete-many's credits come back as it is sent; if Redis then
    fails it, the client gets INTERNAL_ERROR, the jobs its credits allowed still come, and
    the jobs it named stay reserved by the connection (until their TTR)."""
    producer, worker = await _three_pushed_of(new_client, 5)

    def failing(*_: Any, **__: Any) -> asyncio.Future[Any]:
        failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        failed.set_exception(RedisReplyError("ERR refused for the test"))
        return failed

    monkeypatch.setattr(ctx.store, "delete_many", failing)
    worker.send(b"delete-many 1 2\r\n")
    await worker.expect(b"INTERNAL_ERROR not-run\r\n"  # Redis refused it: it did not run
                        + b"".join(b"RESERVED %d 1\r\n%d\r\n" % (i, i - 1) for i in (4, 5)))
    producer.send(b"stats-job 1\r\nstats-job 2\r\n")
    out = await producer.until(lambda o: o.count(b"kicks: ") == 2)
    assert out.count(b"state: reserved\n") == 2


async def test_push_wakes_for_jobs_put_later_and_disconnect_returns_them(
        new_client: NewClient) -> None:
    producer, worker, other = new_client(), new_client(), new_client()
    worker.send(b"push 8\r\n")
    await worker.expect(b"PUSHING 8\r\n")
    producer.send(b"put 0 0 60 2\r\nhi\r\n")
    await producer.expect(b"INSERTED 1\r\n")
    await worker.expect(b"RESERVED 1 2\r\nhi\r\n")
    await worker.gone()
    other.send(b"reserve-with-timeout 5\r\n")
    await other.expect(b"RESERVED 1 2\r\nhi\r\n")


async def test_a_push_loop_wakes_for_a_tube_watched_after_it_started(
        new_client: NewClient) -> None:
    """A push connection that watches another tube while its loop waits is woken by that
    tube's hints (a release here), not only by the loop's periodic re-check (seconds later)."""
    worker, other = new_client(), new_client()
    other.send(b"use later\r\nwatch later\r\nput 0 0 60 2\r\nhi\r\nreserve\r\n")
    await other.expect(b"USING later\r\nWATCHING 2\r\nINSERTED 1\r\nRESERVED 1 2\r\nhi\r\n")
    worker.send(b"push 8\r\n")
    await worker.expect(b"PUSHING 8\r\n")
    await asyncio.sleep(0.1)  # its loop finds nothing and waits, watching default only
    worker.send(b"watch later\r\n")
    await worker.expect(b"WATCHING 2\r\n")
    other.send(b"release 1 0 0\r\n")
    await other.expect(b"RELEASED\r\n")
    await asyncio.wait_for(worker.expect(b"RESERVED 1 2\r\nhi\r\n"), 3)


async def test_a_wait_that_waits_its_time_is_not_a_slow_command(redis_url: str) -> None:
    """wait (and put-with wait-ms) hold the connection by design, as a reserve does: a wait
    that times out after a second is not logged as a slow command at --slow-ms 100."""
    server = Server(Config(port=0, redis_url=redis_url, prefix="slowwait", slow_ms=100))
    await server.start()
    try:
        assert server.ctx is not None and server.ctx.observer is not None
        client = Client(server.ctx)
        client.send(b"put 0 0 60 1\r\nx\r\nwait 1 1\r\nput-with 0 0 60 1 wait-ms=500\r\ny\r\n")
        # wait: TIMED_OUT after 1 s; the request/reply: its put's reply after 500 ms
        await client.expect(b"INSERTED 1\r\nTIMED_OUT\r\nINSERTED 2\r\n")
        assert server.ctx.observer.slow_commands == 0
    finally:
        await server.stop()


async def test_a_push_loop_outlives_a_failed_store_call(
        new_client: NewClient, ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis lost under the push loop's take: the loop logs, tries again and goes on pushing
    (it used to end there, and the connection was never pushed a job again: starved)."""
    real = ctx.store.reserve_many
    failures = [RedisNotSent("not connected")]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(ctx.store, "reserve_many", flaky)
    producer, worker = new_client(), new_client()
    worker.send(b"push 4\r\n")
    await worker.expect(b"PUSHING 4\r\n")
    assert not failures  # the loop's first take failed
    producer.send(b"put 0 0 60 2\r\nhi\r\n")
    await producer.expect(b"INSERTED 1\r\n")
    await worker.expect(b"RESERVED 1 2\r\nhi\r\n")


async def test_push_credit_comes_back_when_a_pushed_job_times_out(new_client: NewClient) -> None:
    producer, worker = new_client(), new_client()
    producer.send(b"put 0 0 1 1\r\na\r\n")
    await producer.expect(b"INSERTED 1\r\n")
    worker.send(b"push 1\r\n")
    await worker.expect(b"PUSHING 1\r\nRESERVED 1 1\r\na\r\n")
    # The job's TTR (1 s) runs out: it is ready again and its credit is back, so it is pushed
    # again (with a second reserve counted).
    await worker.expect(b"RESERVED 1 1\r\na\r\n")
    producer.send(b"stats-job 1\r\n")
    out = await producer.until(lambda o: o.endswith(b"kicks: 0\n\r\n"))
    assert b"\nreserves: 2\ntimeouts: 1\n" in out


async def test_pipelined_reserves_are_answered_in_order_from_one_batch(
        new_client: NewClient) -> None:
    producer, worker = new_client(), new_client()
    producer.send(b"put 5 0 60 1\r\na\r\nput 1 0 60 1\r\nb\r\nput 3 0 60 1\r\nc\r\n")
    await producer.expect(b"INSERTED 1\r\nINSERTED 2\r\nINSERTED 3\r\n")
    worker.send(b"reserve\r\nreserve-with-timeout 0\r\nreserve\r\nreserve-with-timeout 0\r\n"
                b"list-tube-used\r\n")
    await worker.expect(b"RESERVED 2 1\r\nb\r\nRESERVED 3 1\r\nc\r\nRESERVED 1 1\r\na\r\n"
                        b"TIMED_OUT\r\nUSING default\r\n")


async def test_a_reserve_that_waits_holds_the_reserves_behind_it(new_client: NewClient) -> None:
    producer, worker = new_client(), new_client()
    worker.send(b"reserve\r\nreserve-with-timeout 0\r\n")
    await asyncio.sleep(0.1)
    assert worker.transport.out == b""
    producer.send(b"put 0 0 60 1\r\nx\r\n")
    await producer.expect(b"INSERTED 1\r\n")
    # the first reserve gets the job; only then does the second run, and find nothing
    await worker.expect(b"RESERVED 1 1\r\nx\r\nTIMED_OUT\r\n")


async def test_delete_of_a_held_job_waits_for_a_waiting_reserve(new_client: NewClient) -> None:
    """Sent past the reserve, deferred by Redis as the reserve found nothing, sent again once
    the reserve has its job: beanstalkd's order, in effect and in replies."""
    worker, observer = new_client(), new_client()
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    worker.send(b"reserve\r\ndelete 1\r\nuse other\r\n")
    await asyncio.sleep(0.1)
    observer.send(b"peek 1\r\n")
    await observer.expect(b"FOUND 1 1\r\nx\r\n")
    assert worker.transport.out == b""
    observer.send(b"put 0 0 60 1\r\ny\r\n")
    await observer.expect(b"INSERTED 2\r\n")
    await worker.expect(b"RESERVED 2 1\r\ny\r\nDELETED\r\nUSING other\r\n")
    observer.send(b"peek 1\r\n")
    await observer.expect(b"NOT_FOUND\r\n")


async def test_commands_past_a_reserve_that_gets_a_job_are_not_deferred(
        new_client: NewClient) -> None:
    """The pipelining the deferral keeps: delete and delete-many of held jobs go out with the
    reserve before them when that reserve finds a job, and take effect at once."""
    worker = new_client()
    worker.send(b"".join(b"put 0 0 60 1\r\n%d\r\n" % i for i in range(4)))
    await worker.until(lambda o: o.count(b"INSERTED") == 4)
    worker.send(b"reserve\r\nreserve\r\n")
    await worker.until(lambda o: o.count(b"RESERVED") == 2)
    worker.send(b"reserve\r\ndelete 1\r\nreserve\r\ndelete-many 2\r\n")
    out = await worker.until(lambda o: o.count(b"DELETED") == 2)
    assert out.endswith(b"RESERVED 3 1\r\n2\r\nDELETED\r\nRESERVED 4 1\r\n3\r\n"
                        b"BATCH 1\r\nDELETED\r\n"), out


async def test_a_turn_sends_its_reserves_and_its_deletes_as_one_call_each(
        new_client: NewClient, ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """What one read brings: four deletes of held jobs, each followed by the next reserve (a
    pipelining consumer's answer to four jobs), reach the store as one delete_many and one
    reserve of four jobs, and each command still gets its own reply, in order."""
    worker = new_client()
    worker.send(b"".join(b"put 0 0 60 1\r\n%d\r\n" % i for i in range(8)))
    await worker.until(lambda o: o.count(b"INSERTED") == 8)
    worker.send(b"reserve\r\n" * 4)
    await worker.until(lambda o: o.count(b"RESERVED") == 4)
    worker.transport.out.clear()
    calls = spy_on(ctx, monkeypatch, ("reserve", "reserve_many", "delete", "delete_many"))
    worker.send(b"".join(b"delete %d\r\nreserve-with-timeout 5\r\n" % i for i in range(1, 5)))
    await worker.expect(b"".join(b"DELETED\r\nRESERVED %d 1\r\n%d\r\n" % (i, i - 1)
                                 for i in range(5, 9)))
    assert [(name, args[1:]) for name, args in calls] == [
        ("delete_many", ([1, 2, 3, 4],)), ("reserve_many", (4,))]
    worker.send(b"delete 5\r\ndelete 99\r\ndelete 5\r\n")  # each answered on its own
    await worker.expect(b"DELETED\r\nNOT_FOUND\r\nNOT_FOUND\r\n")


def spy_on(ctx: ServerContext, monkeypatch: pytest.MonkeyPatch,
           names: tuple[str, ...]) -> list[tuple[str, tuple[Any, ...]]]:
    """The store calls of ``names`` made from now on, in order (each still made)."""
    calls: list[tuple[str, tuple[Any, ...]]] = []
    for name in names:
        real = getattr(ctx.store, name)

        def spy(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            calls.append((_name, args))
            return _real(*args, **kwargs)

        monkeypatch.setattr(ctx.store, name, spy)
    return calls


async def test_a_turn_sends_its_puts_to_one_tube_as_one_call(
        new_client: NewClient, ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer's pipelined puts: one put_many per tube, in order; a put the tube refuses
    (its max-jobs) answers as it would alone; the last put of a read with nothing before it
    goes alone, as put.lua."""
    producer = new_client()
    producer.send(b"tube-set capped max-jobs=3\r\n")
    await producer.expect(b"SET\r\n")
    calls = spy_on(ctx, monkeypatch, ("put", "put_many"))
    producer.send(b"put 0 0 60 1\r\na\r\nput 0 5 60 1\r\nb\r\nuse capped\r\n"
                  + b"put 0 0 60 1\r\nc\r\n" * 4 + b"use default\r\nput 0 0 60 1\r\nd\r\n")
    await producer.expect(b"INSERTED 1\r\nINSERTED 2\r\nUSING capped\r\nINSERTED 3\r\n"
                          b"INSERTED 4\r\nINSERTED 5\r\nOUT_OF_MEMORY\r\nUSING default\r\n"
                          b"INSERTED 6\r\n")
    assert [(name, args[0], len(args[1]) if name == "put_many" else 1)
            for name, args in calls] == [
        ("put_many", "default", 2), ("put_many", "capped", 4), ("put", "default", 1)]
    producer.send(b"stats-job 2\r\npeek-ready\r\n")
    out = await producer.until(lambda o: o.endswith(b"FOUND 1 1\r\na\r\n"))
    assert b"state: delayed\n" in out and b"delay: 5\n" in out, out


def _stats_of(out: bytes) -> list[dict[str, str]]:
    """The stats documents (``OK <bytes>`` replies) in ``out``, each as its key: value pairs."""
    docs = []
    at = out.find(b"OK ")
    while at >= 0:
        head_end = out.index(b"\r\n", at)
        size = int(out[at + 3:head_end])
        body = out[head_end + 2:head_end + 2 + size].decode()
        docs.append(dict(line.split(": ", 1) for line in body.splitlines()[1:]))
        at = out.find(b"OK ", head_end + 2 + size)
    return docs


async def test_a_run_of_pipelined_stats_costs_one_read_that_counts_them_all(
        new_client: NewClient, ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty stats in one read share one read of the counts, sent once all of them are
    counted (each sees cmd-stats with itself); a put between two runs splits them: the run
    after it sees the job, the run before it does not."""
    client = new_client()
    calls = spy_on(ctx, monkeypatch, ("server_counts",))
    client.send(b"stats\r\n" * 20)
    docs = _stats_of(await client.until(lambda o: o.count(b"OK ") == 20 and o.endswith(b"\n\r\n")))
    assert len(calls) == 1
    assert {d["cmd-stats"] for d in docs} == {"20"}
    client.transport.out.clear()
    client.send(b"stats\r\nstats\r\nput 0 0 60 1\r\nx\r\nstats\r\n")
    out = await client.until(lambda o: o.count(b"OK ") == 3 and o.endswith(b"\n\r\n"))
    assert b"INSERTED 1\r\n" in out
    before, also_before, after = _stats_of(out)
    assert len(calls) == 3
    assert before == also_before
    assert (before["current-jobs-ready"], after["current-jobs-ready"]) == ("0", "1")
    assert (before["cmd-stats"], after["cmd-stats"]) == ("22", "23")
    assert after["cmd-put"] == "1"


async def test_a_bury_behind_a_turn_of_reserves_short_of_jobs_waits_for_them(
        new_client: NewClient) -> None:
    """Three reserves tried as one call find two jobs: the third waits, so the bury behind it
    is deferred (the call records the turn's last reserve) and cannot be kicked into it."""
    worker, observer = new_client(), new_client()
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    observer.send(b"put 0 0 60 1\r\ny\r\nput 0 0 60 1\r\nz\r\n")
    await observer.expect(b"INSERTED 2\r\nINSERTED 3\r\n")
    worker.send(b"reserve-with-timeout 1\r\n" * 3 + b"bury 1 0\r\n")
    await asyncio.sleep(0.2)
    observer.send(b"kick 1\r\npeek-buried\r\n")
    await observer.expect(b"KICKED 0\r\nNOT_FOUND\r\n")
    await worker.expect(b"RESERVED 2 1\r\ny\r\nRESERVED 3 1\r\nz\r\nTIMED_OUT\r\nBURIED\r\n")


async def test_delete_many_behind_a_waiting_reserve_waits_for_it(new_client: NewClient) -> None:
    """The job's TTR (2 s) reaches its safety margin while the reserve (timeout 3 s) waits, so
    the delete-many could change what it returns: it is deferred, the reserve answers
    DEADLINE_SOON, then the delete runs (and is counted once)."""
    worker, observer = new_client(), new_client()
    worker.send(b"put 0 0 2 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    worker.send(b"reserve-with-timeout 3\r\ndelete-many 1\r\n")
    await asyncio.sleep(0.2)
    observer.send(b"peek 1\r\nstats\r\n")
    out = await observer.until(lambda o: o.endswith(b"\n\r\n") and b"OK" in o)
    assert out.startswith(b"FOUND 1 1\r\nx\r\n"), out
    await worker.expect(b"DEADLINE_SOON\r\nBATCH 1\r\nDELETED\r\n")
    observer.send(b"stats\r\n")
    out = await observer.until(lambda o: o.count(b"cmd-delete") == 2 and o.endswith(b"\n\r\n"))
    deletes = [line for line in out.split(b"\n") if line.startswith(b"cmd-delete:")]
    assert deletes[0] == deletes[1], deletes  # counted once when sent, not again when re-sent


async def test_a_delete_that_cannot_change_the_reserve_ahead_goes_at_once(
        new_client: NewClient) -> None:
    """A held job whose TTR (60 s) cannot reach its margin before the reserve ahead (timeout
    1 s) ends, even waiting: its delete takes effect at once, its reply comes after."""
    worker, observer = new_client(), new_client()
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    worker.send(b"reserve-with-timeout 1\r\ndelete 1\r\n")
    await asyncio.sleep(0.2)
    observer.send(b"peek 1\r\n")
    await observer.expect(b"NOT_FOUND\r\n")
    await worker.expect(b"TIMED_OUT\r\nDELETED\r\n")


async def test_jobs_granted_while_the_client_leaves_go_back(new_client: NewClient) -> None:
    producer, worker = new_client(), new_client()
    producer.send(b"".join(b"put 0 0 600 1\r\n%d\r\n" % i for i in range(5)))
    await producer.until(lambda o: o.count(b"INSERTED") == 5)
    worker.send(b"reserve\r\n" * 5)
    await worker.gone()  # the reserve calls may still be in flight: their jobs must come back
    producer.send(b"stats-tube default\r\n")
    out = await producer.until(lambda o: o.endswith(b"pause-time-left: 0\n\r\n"))
    assert b"current-jobs-ready: 5\n" in out and b"current-jobs-reserved: 0\n" in out


async def test_a_client_gone_with_reserves_in_flight_leaves_no_waiter(
        new_client: NewClient, ctx: ServerContext) -> None:
    worker, observer = new_client(), new_client()
    worker.send(b"reserve\r\n" * 3)  # nothing is ready: these would wait
    await worker.gone()
    observer.send(b"stats-tube default\r\n")
    out = await observer.until(lambda o: o.endswith(b"pause-time-left: 0\n\r\n"))
    assert b"current-waiting: 0\n" in out
    assert all(not queue for queue in ctx.registry._by_tube.values())


def test_every_counted_command_has_its_stats_line_and_back() -> None:
    """The cmd-* names on the command classes and the stats YAML's list must be the same set."""
    def subclasses(cls: type[c.Command]) -> list[type[c.Command]]:
        return [s for sub in cls.__subclasses__() for s in (sub, *subclasses(sub))]

    stats_names = {cls.stat for cls in subclasses(c.Command) if cls.stat is not None}
    assert stats_names == set(COMMAND_COUNTERS)


async def test_a_job_handed_over_while_its_wake_up_is_lost_is_still_the_reserve_answer(
        new_client: NewClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """put.lua reserves the job to the waiting connection; if the grant message never wakes
    it, its try at the timeout (or the claim on its way out) answers RESERVED, not TIMED_OUT."""
    tube = "handed-" + secrets.token_hex(3)
    worker, producer = new_client(), new_client()
    worker.send(f"watch {tube}\r\nignore default\r\n".encode())
    await worker.expect(b"WATCHING 2\r\nWATCHING 1\r\n")
    # The grant message is lost: nothing wakes the worker before its timeout (patched on the
    # registry; the producer never waits, so only the worker is hit).
    monkeypatch.setattr(WaiterRegistry, "handed_over", lambda self, token: None)
    worker.send(b"reserve-with-timeout 2\r\n")
    await _until_waiting(producer, tube, 1, "the reserve never started waiting")
    # Its try after counting itself in has found nothing by now (milliseconds on any box), so
    # the put below hands the job over to a connection that sleeps.
    await asyncio.sleep(0.5)
    producer.send(f"use {tube}\r\nput 0 0 60 6\r\nhanded\r\n".encode())
    await producer.until(lambda out: b"INSERTED" in out)
    reply = await worker.until(lambda out: out.endswith(b"handed\r\n") or b"TIMED_OUT" in out)
    assert reply.startswith(b"RESERVED ") and reply.endswith(b"\r\nhanded\r\n"), reply


async def _until_waiting(observer: Client, tube: str, count: int, failure: str) -> None:
    """Poll stats-tube (bounded) until ``tube`` shows ``count`` connections waiting."""
    for _ in range(100):
        observer.send(f"stats-tube {tube}\r\n".encode())
        stats = await observer.until(lambda out: out.endswith(b"\r\n")
                                     and out.count(b"\n") > 10)
        observer.transport.out.clear()
        if f"\ncurrent-waiting: {count}\n".encode() in stats:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(failure)


async def test_push_0_stops_waiting_so_later_puts_stay_ready(new_client: NewClient) -> None:
    producer, worker, observer = new_client(), new_client(), new_client()
    worker.send(b"push 2\r\n")
    await worker.expect(b"PUSHING 2\r\n")
    await _until_waiting(observer, "default", 1, "the push connection never started waiting")
    worker.send(b"push 0\r\n")
    await worker.expect(b"PUSHING 0\r\n")
    await _until_waiting(observer, "default", 0,
                         "a push connection without credit still counts as waiting")
    producer.send(b"put 0 0 60 2\r\nhi\r\n")
    await producer.expect(b"INSERTED 1\r\n")
    observer.send(b"stats-job 1\r\n")
    stats = await observer.until(lambda out: out.endswith(b"\r\n") and b"state:" in out)
    assert b"\nstate: ready\n" in stats
    assert worker.transport.out == b""


async def test_reading_stops_while_replies_are_not_taken_and_resumes_after(
        new_client: NewClient) -> None:
    """pause_writing (the client is not reading) stops reading; resume_writing restarts it
    even when every command had already been dispatched before the pause."""
    a = new_client()
    a.send(b"list-tube-used\r\n")
    await a.expect(b"USING default\r\n")
    a.conn.pause_writing()
    assert not a.transport.reading
    a.conn.resume_writing()
    await asyncio.wait_for(_until(lambda: a.transport.reading), REPLY_WAIT_S)
    a.send(b"list-tube-used\r\n")
    await a.expect(b"USING default\r\n")


async def test_commands_past_the_in_flight_bound_wait_and_all_are_answered(
        ctx: ServerContext, new_client: NewClient) -> None:
    """More pipelined commands than max_in_flight: reading pauses, every reply still comes,
    in order."""
    count = ctx.max_in_flight * 3
    a = new_client()
    a.send(b"".join(f"peek {i}\r\n".encode() for i in range(1, count + 1)))
    assert not a.transport.reading  # the bound was reached: no more input taken for now
    out = await a.until(lambda out: out.count(b"\r\n") >= count)
    assert out == b"NOT_FOUND\r\n" * count
    await asyncio.wait_for(_until(lambda: a.transport.reading), REPLY_WAIT_S)


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


async def test_one_command_in_flight_at_a_time_still_answers_a_pipeline(
        ctx: ServerContext, new_client: NewClient) -> None:
    """--max-in-flight 1 (beanstalkd's one command at a time): a pipeline still completes."""
    ctx.max_in_flight = 1
    tube = "one-" + secrets.token_hex(3)
    a = new_client()
    a.send(f"use {tube}\r\nwatch {tube}\r\nignore default\r\n".encode()
           + b"put 0 0 10 1\r\nx\r\n" * 3 + b"reserve\r\nreserve\r\nlist-tube-used\r\n")
    out = await a.until(lambda out: out.endswith(f"USING {tube}\r\n".encode())
                        and out.count(b"RESERVED") == 2)
    lines = out.split(b"\r\n")
    assert lines[:3] == [f"USING {tube}".encode(), b"WATCHING 2", b"WATCHING 1"]
    assert [line.split()[0] for line in lines[3:6]] == [b"INSERTED"] * 3
    assert lines[6].startswith(b"RESERVED ") and lines[8].startswith(b"RESERVED ")


async def test_a_pooled_job_whose_ttr_ran_out_is_not_answered(
        new_client: NewClient, ctx: ServerContext) -> None:
    """A job a late call granted waits in the pool for the next reserve; once its TTR has run
    out, expire.lua has given it back (another connection may hold it, or have deleted it):
    the reserve must not answer it."""
    worker = new_client()
    stale = Reservation(id=424242, ttr=1, body=b"stale", deadline_ms=ctx.store.clock() - 1)
    worker.conn.reserves._pool.append(stale)
    worker.send(b"reserve-with-timeout 0\r\n")
    await worker.expect(b"TIMED_OUT\r\n")


def test_the_server_handles_exactly_the_command_list_in_its_order() -> None:
    """HANDLERS (tubeq.server.handlers) has one handler per parseable command, in the order of
    the one list, so a command added to the list and not to the server fails here."""
    assert list(HANDLERS) == list(c.COMMANDS)
    assert set(GATE_HANDLERS) == set(c.COMMANDS)
