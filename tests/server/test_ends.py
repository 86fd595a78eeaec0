"""Jobs that answer, in one process: finish keeps a result, wait blocks its connection until the
job ends (tubeq.server.end_waits), and a connection that never sends them sees nothing new.
Against a real tubeq process's context and its private Redis, through a fake transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from tests.server.test_connection import Client, spy_on
from tubeq.redisio.client import RedisReplyError
from tubeq.server import end_waits
from tubeq.server.context import ServerContext
from tubeq.server.end_waits import EndWait, EndWaits
from tubeq.server.process import Config, Server
from tubeq.store.keys import Keys
from tubeq.store.records import JobEnd


@pytest.fixture
async def ctx(redis_url: str) -> AsyncIterator[ServerContext]:
    server = Server(Config(port=0, redis_url=redis_url, prefix="ends"))
    await server.start()
    assert server.ctx is not None
    yield server.ctx
    await server.stop()


async def test_a_wait_hears_the_result_of_a_finish(ctx: ServerContext) -> None:
    producer, worker, caller = Client(ctx), Client(ctx), Client(ctx)
    producer.send(b"put 0 0 60 5\r\nhello\r\n")
    await producer.expect(b"INSERTED 1\r\n")
    caller.send(b"wait 1 10\r\n")
    await asyncio.sleep(0.2)
    assert caller.transport.out == b""
    worker.send(b"reserve\r\n")
    await worker.expect(b"RESERVED 1 5\r\nhello\r\n")
    worker.send(b"finish 1 6\r\nworld!\r\n")
    await worker.expect(b"FINISHED\r\n")
    await caller.expect(b"ENDED 1 finished 6\r\nworld!\r\n")


async def test_a_wait_after_the_end_answers_at_once_and_unknown_ids_are_not_found(
        ctx: ServerContext) -> None:
    client = Client(ctx)
    client.send(b"put 0 0 60 1\r\na\r\nreserve\r\nfinish 1 2\r\nok\r\n")
    await client.expect(b"INSERTED 1\r\nRESERVED 1 1\r\na\r\nFINISHED\r\n")
    client.send(b"wait 1 0\r\nwait-ms 1 0\r\nwait 99 5\r\npeek 1\r\n")
    await client.expect(b"ENDED 1 finished 2\r\nok\r\nENDED 1 finished 2\r\nok\r\n"
                        b"NOT_FOUND\r\nNOT_FOUND\r\n")  # the job itself is gone, as deleted


async def test_a_wait_times_out_on_its_deadline_and_the_job_lives_on(
        ctx: ServerContext) -> None:
    client = Client(ctx)
    client.send(b"put 0 0 60 1\r\na\r\n")
    await client.expect(b"INSERTED 1\r\n")
    loop = asyncio.get_running_loop()
    began = loop.time()
    client.send(b"wait-ms 1 300\r\n")
    await client.expect(b"TIMED_OUT\r\n")
    assert 0.29 <= loop.time() - began < 5
    client.send(b"reserve-with-timeout 0\r\n")
    await client.expect(b"RESERVED 1 1\r\na\r\n")


async def test_waits_hear_a_delete_and_a_bury_and_a_buried_job_answers_at_once(
        ctx: ServerContext) -> None:
    worker, a, b = Client(ctx), Client(ctx), Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\nput 0 0 60 1\r\ny\r\n")
    await worker.expect(b"INSERTED 1\r\nINSERTED 2\r\n")
    a.send(b"wait 1 10\r\n")
    b.send(b"wait 2 10\r\n")
    await asyncio.sleep(0.1)
    worker.send(b"delete 1\r\nreserve\r\n")
    await worker.expect(b"DELETED\r\nRESERVED 2 1\r\ny\r\n")
    await a.expect(b"ENDED 1 deleted 0\r\n\r\n")
    worker.send(b"bury 2 0\r\n")
    await worker.expect(b"BURIED\r\n")
    await b.expect(b"ENDED 2 buried 0\r\n\r\n")
    b.send(b"wait 2 10\r\n")  # it lies buried: an end until someone kicks it
    await b.expect(b"ENDED 2 buried 0\r\n\r\n")
    worker.send(b"kick-job 2\r\n")
    await worker.expect(b"KICKED\r\n")
    b.send(b"wait-ms 2 100\r\n")  # kicked: it lives again, and is waited for again
    await b.expect(b"TIMED_OUT\r\n")


async def test_a_job_nobody_waited_for_keeps_no_end_when_deleted(
        ctx: ServerContext, redis_url: str) -> None:
    """beanstalkd's own verbs pay nothing for a job nobody waits for: no end is kept; a job
    that was waited for keeps its end for --result-ttl."""
    client = Client(ctx)
    client.send(b"put 0 0 60 1\r\nx\r\ndelete 1\r\nwait 1 0\r\n")
    await client.expect(b"INSERTED 1\r\nDELETED\r\nNOT_FOUND\r\n")
    client.send(b"put 0 0 60 1\r\nx\r\nwait-ms 2 0\r\ndelete 2\r\n")
    await client.expect(b"INSERTED 2\r\nTIMED_OUT\r\nDELETED\r\n")
    raw = redis.asyncio.Redis.from_url(redis_url)
    try:
        assert await raw.exists(Keys("ends").end(1)) == 0
        ttl_ms = await raw.pttl(Keys("ends").end(2))
        assert ctx.result_ttl_ms - 5_000 < ttl_ms <= ctx.result_ttl_ms
    finally:
        await raw.aclose()
    client.send(b"wait 2 0\r\n")
    await client.expect(b"ENDED 2 deleted 0\r\n\r\n")


async def test_finish_by_a_connection_not_holding_the_job_changes_nothing(
        ctx: ServerContext) -> None:
    worker, other, caller = Client(ctx), Client(ctx), Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    caller.send(b"wait 1 10\r\n")
    other.send(b"finish 1 1\r\nz\r\nfinish 77 1\r\nz\r\n")
    await other.expect(b"NOT_FOUND\r\nNOT_FOUND\r\n")
    worker.send(b"stats-job 1\r\n")
    assert b"state: reserved" in await worker.until(lambda o: o.endswith(b"\n\r\n"))
    worker.transport.out.clear()
    worker.send(b"finish 1 3\r\nyes\r\n")
    await worker.expect(b"FINISHED\r\n")
    await caller.expect(b"ENDED 1 finished 3\r\nyes\r\n")


async def test_a_result_over_the_job_size_limit_is_refused_and_the_job_stays_held(
        ctx: ServerContext) -> None:
    worker = Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    big = ctx.max_job_size + 1
    worker.send(b"finish 1 %d\r\n" % big + b"r" * big + b"\r\nlist-tube-used\r\n")
    await worker.expect(b"JOB_TOO_BIG\r\nUSING default\r\n")
    worker.send(b"finish 1 1\r\nz\r\n")
    await worker.expect(b"FINISHED\r\n")


async def test_bad_lines_answer_bad_format(ctx: ServerContext) -> None:
    client = Client(ctx)
    client.send(b"wait 1\r\nwait x 1\r\nwait 1 1 \r\nwait-ms 1 -5\r\nfinish 1\r\n")
    await client.expect(b"BAD_FORMAT\r\n" * 5)


async def test_commands_after_a_wait_run_after_it_answers(ctx: ServerContext) -> None:
    """A wait blocks its own connection as a reserve does: what was pipelined after it runs
    once it answered (a delete behind it cannot end the job it waits for)."""
    client, worker = Client(ctx), Client(ctx)
    client.send(b"put 0 0 60 1\r\nx\r\n")
    await client.expect(b"INSERTED 1\r\n")
    client.send(b"wait-ms 1 300\r\ndelete 1\r\n")
    await client.expect(b"TIMED_OUT\r\nDELETED\r\n")
    worker.send(b"put 0 0 60 1\r\ny\r\nreserve\r\n")
    await worker.expect(b"INSERTED 2\r\nRESERVED 2 1\r\ny\r\n")
    client.send(b"wait 2 10\r\nlist-tube-used\r\n")
    await asyncio.sleep(0.1)
    assert client.transport.out == b""
    worker.send(b"finish 2 0\r\n\r\n")
    await client.expect(b"ENDED 2 finished 0\r\n\r\nUSING default\r\n")


async def test_a_half_close_ends_a_wait_as_timed_out_then_closes(ctx: ServerContext) -> None:
    client = Client(ctx)
    client.send(b"put 0 0 60 1\r\nx\r\nwait 1 30\r\n")
    client.conn.eof_received()
    await client.expect(b"INSERTED 1\r\nTIMED_OUT\r\n")
    await asyncio.wait_for(client.conn.wait_closed(), 5)
    assert len(ctx.end_waits) == 0


async def test_a_wait_on_one_process_hears_a_finish_on_another(
        ctx: ServerContext, redis_url: str) -> None:
    other = Server(Config(port=0, redis_url=redis_url, prefix="ends"))
    await other.start()
    try:
        assert other.ctx is not None
        worker, caller = Client(other.ctx), Client(ctx)
        worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
        await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
        caller.send(b"wait 1 10\r\n")
        await asyncio.sleep(0.1)
        worker.send(b"finish 1 4\r\ndone\r\n")
        await worker.expect(b"FINISHED\r\n")
        await caller.expect(b"ENDED 1 finished 4\r\ndone\r\n")
    finally:
        await other.stop()


async def test_a_lost_message_is_covered_by_the_wait_reading_again(
        ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(end_waits, "RECHECK_S", 0.2)
    monkeypatch.setattr(ctx.end_waits, "ended", lambda job_id, end=None: None)  # every message lost
    worker, caller = Client(ctx), Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    caller.send(b"wait 1 30\r\n")
    await asyncio.sleep(0.1)
    worker.send(b"finish 1 1\r\n!\r\n")
    await worker.expect(b"FINISHED\r\n")
    await caller.expect(b"ENDED 1 finished 1\r\n!\r\n")


class _StalledStore:
    """A store whose reads never answer (Redis stalled), or fail (Redis away)."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.reads = 0

    def wait_end(self, job_id: int, keep_ms: int,
                 progress_after: int | None = None) -> asyncio.Future[Any]:
        self.reads += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.fail:
            future.set_exception(ConnectionError("Redis away"))
        return future


@pytest.mark.parametrize("fail", [False, True], ids=["stalled", "away"])
async def test_no_wait_outlives_its_timeout_whatever_redis_does(
        fail: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(end_waits, "RETRY_S", 0.05)
    store, waits = _StalledStore(fail), EndWaits()
    loop = asyncio.get_running_loop()
    began = loop.time()
    outcome = await end_waits.wait_for_end(store, waits, EndWait(1), 300, 1000)  # type: ignore[arg-type]
    took = loop.time() - began
    assert outcome is None  # timed out
    assert 0.29 <= took <= 0.3 + end_waits.READ_GRACE_S + 0.2
    assert len(waits) == 0
    assert store.reads == 1 if not fail else store.reads > 2  # a failed read is tried again


async def test_waits_hear_the_policies_ends_expired_and_dead_lettered(ctx: ServerContext) -> None:
    """A job past its ttl-ms with on-expire=delete ends `expired`; one out of tries is buried
    by tubeq with its reason as the data."""
    client, worker = Client(ctx), Client(ctx)
    client.send(b"put-with 0 0 60 1 ttl-ms=300 on-expire=delete\r\nx\r\n"
                b"put-with 0 0 60 1 max-tries=1\r\ny\r\n")
    await client.expect(b"INSERTED 1\r\nINSERTED 2\r\n")
    client.send(b"wait 1 10\r\n")
    await client.expect(b"ENDED 1 expired 0\r\n\r\n")
    worker.send(b"reserve\r\n")
    await worker.expect(b"RESERVED 2 1\r\ny\r\n")
    client.send(b"wait 2 10\r\n")
    await asyncio.sleep(0.1)
    worker.send(b"release 2 0 0\r\n")
    await worker.expect(b"RELEASED\r\n")
    await client.expect(b"ENDED 2 buried 9\r\nmax-tries\r\n")


async def test_put_with_wait_ms_is_request_and_reply_in_one_command(ctx: ServerContext) -> None:
    """put-with wait-ms=N: the job is stored, marked waited from its birth, and the command
    answers how it ended; not ended within N ms, the put's own reply (the job lives on)."""
    caller, worker = Client(ctx), Client(ctx)
    caller.send(b"use calls\r\nput-with 0 0 60 3 wait-ms=10000\r\nabc\r\n")
    await caller.until(lambda o: o == b"USING calls\r\n")
    caller.transport.out.clear()
    worker.send(b"watch calls\r\nreserve\r\n")
    await worker.expect(b"WATCHING 2\r\nRESERVED 1 3\r\nabc\r\n")
    worker.send(b"finish 1 3\r\nABC\r\n")
    await worker.expect(b"FINISHED\r\n")
    await caller.expect(b"ENDED 1 finished 3\r\nABC\r\n")
    caller.send(b"put-with 0 0 60 1 wait-ms=100\r\nx\r\n")
    await caller.expect(b"INSERTED 2\r\n")  # nobody took it in time: it waits in its tube
    worker.send(b"reserve\r\ndelete 2\r\n")  # marked from its birth: its end is kept
    await worker.expect(b"RESERVED 2 1\r\nx\r\nDELETED\r\n")
    caller.send(b"wait 2 0\r\nput-with 0 0 60 1 wait-ms=nope\r\nx\r\n")
    await caller.expect(b"ENDED 2 deleted 0\r\n\r\nBAD_OPTION wait-ms\r\n")


async def test_put_with_wait_ms_and_a_dedupe_key_waits_for_the_living_job(
        ctx: ServerContext) -> None:
    """An idempotent call: the second put of the same key waits for the first job's end."""
    first, second, worker = Client(ctx), Client(ctx), Client(ctx)
    first.send(b"put-with 0 0 60 1 key=order-7 wait-ms=10000\r\nx\r\n")
    await asyncio.sleep(0.1)
    second.send(b"put-with 0 0 60 1 key=order-7 wait-ms=10000\r\ny\r\n")
    worker.send(b"reserve\r\n")
    await worker.expect(b"RESERVED 1 1\r\nx\r\n")
    worker.send(b"finish 1 2\r\nok\r\n")
    await worker.expect(b"FINISHED\r\n")
    await first.expect(b"ENDED 1 finished 2\r\nok\r\n")
    await second.expect(b"ENDED 1 finished 2\r\nok\r\n")


async def test_put_with_notify_ms_answers_the_put_at_once_and_the_end_as_a_frame(
        ctx: ServerContext) -> None:
    """notify-ms: calls share a connection. Each put answers at once; each end comes later as
    an END frame, in the order the jobs ended, and the commands after the puts run meanwhile."""
    caller, worker = Client(ctx), Client(ctx)
    caller.send(b"put-with 0 0 60 1 tube=calls notify-ms=10000\r\na\r\n"
                b"put-with 0 0 60 1 tube=calls notify-ms=10000\r\nb\r\n"
                b"put-with 0 0 60 1 tube=calls notify-ms=10000\r\nc\r\nlist-tube-used\r\n")
    await caller.expect(b"INSERTED 1\r\nINSERTED 2\r\nINSERTED 3\r\nUSING default\r\n")
    worker.send(b"watch calls\r\nreserve\r\nreserve\r\nreserve\r\n")
    await worker.expect(b"WATCHING 2\r\nRESERVED 1 1\r\na\r\nRESERVED 2 1\r\nb\r\n"
                        b"RESERVED 3 1\r\nc\r\n")
    worker.send(b"finish 2 1\r\nB\r\n")
    await worker.expect(b"FINISHED\r\n")
    await caller.expect(b"END 2 finished 1\r\nB\r\n")
    worker.send(b"delete 3\r\nfinish 1 1\r\nA\r\n")
    await worker.expect(b"DELETED\r\nFINISHED\r\n")
    await caller.until(lambda out: out.count(b"END ") == 2)
    assert sorted(bytes(caller.transport.out).split(b"END ")[1:]) == [
        b"1 finished 1\r\nA\r\n", b"3 deleted 0\r\n\r\n"]


async def test_put_with_notify_ms_times_out_with_a_frame_and_the_job_lives_on(
        ctx: ServerContext) -> None:
    caller = Client(ctx)
    loop = asyncio.get_running_loop()
    began = loop.time()
    caller.send(b"put-with 0 0 60 1 notify-ms=200\r\nx\r\n")
    await caller.expect(b"INSERTED 1\r\n")
    await caller.expect(b"END 1 timed-out 0\r\n\r\n")
    assert 0.19 <= loop.time() - began < 5
    caller.send(b"reserve-with-timeout 0\r\n")
    await caller.expect(b"RESERVED 1 1\r\nx\r\n")


async def test_put_with_notify_ms_refused_puts_and_bad_options_send_no_frame(
        ctx: ServerContext) -> None:
    """A put refused (here: an unknown parent) answers as without notify-ms and no frame
    follows; both wait-ms and notify-ms is BAD_OPTION notify-ms, and nothing is stored."""
    caller = Client(ctx)
    caller.send(b"put-with 0 0 60 1 after=99 notify-ms=100\r\nx\r\n"
                b"put-with 0 0 60 1 wait-ms=100 notify-ms=100\r\ny\r\n"
                b"put-with 0 0 60 1 notify-ms=-1\r\nz\r\nstats-tube default\r\n")
    doc = await caller.until(lambda o: o.endswith(b"\n\r\n"))
    assert doc.startswith(b"UNKNOWN_PARENT 99\r\nBAD_OPTION notify-ms\r\n"
                          b"BAD_OPTION notify-ms\r\nOK ")
    assert b"total-jobs: 0\n" in doc
    caller.transport.out.clear()
    await asyncio.sleep(0.3)  # past the 100 ms of the refused put: still no frame
    assert caller.transport.out == b""


async def test_put_with_notify_ms_and_a_dedupe_key_hears_the_living_job(
        ctx: ServerContext) -> None:
    caller, worker = Client(ctx), Client(ctx)
    caller.send(b"put-with 0 0 60 1 key=k1 notify-ms=10000\r\nx\r\n"
                b"put-with 0 0 60 1 key=k1 notify-ms=10000\r\ny\r\n")
    await caller.expect(b"INSERTED 1\r\nDUPLICATE 1\r\n")
    worker.send(b"reserve\r\nfinish 1 2\r\nok\r\n")
    await worker.expect(b"RESERVED 1 1\r\nx\r\nFINISHED\r\n")
    await caller.expect(b"END 1 finished 2\r\nok\r\nEND 1 finished 2\r\nok\r\n")


async def test_a_half_close_answers_pending_notifies_timed_out_then_closes(
        ctx: ServerContext) -> None:
    caller = Client(ctx)
    caller.send(b"put-with 0 0 60 1 notify-ms=60000\r\nx\r\n"
                b"put-with 0 0 60 1 notify-ms=60000\r\ny\r\n")
    await caller.expect(b"INSERTED 1\r\nINSERTED 2\r\n")
    assert caller.conn.eof_received() is True
    await caller.until(lambda _: caller.transport.closed)
    assert sorted(bytes(caller.transport.out).split(b"END ")[1:]) == [
        b"1 timed-out 0\r\n\r\n", b"2 timed-out 0\r\n\r\n"]
    assert len(ctx.end_waits) == 0


async def test_a_closed_connection_drops_its_notifies(ctx: ServerContext) -> None:
    caller, worker = Client(ctx), Client(ctx)
    caller.send(b"put-with 0 0 60 1 notify-ms=60000\r\nx\r\n")
    await caller.expect(b"INSERTED 1\r\n")
    await caller.gone()
    for _ in range(100):
        if not len(ctx.end_waits):
            break
        await asyncio.sleep(0.01)
    assert len(ctx.end_waits) == 0
    worker.send(b"reserve\r\nfinish 1 1\r\nA\r\n")  # nobody to tell: nothing breaks
    await worker.expect(b"RESERVED 1 1\r\nx\r\nFINISHED\r\n")


async def test_an_end_frame_is_not_held_behind_a_wait_of_its_connection(
        ctx: ServerContext) -> None:
    """A shared connection's `wait` (or reserve) holds the replies after it, not the END
    frames of its calls: the frame goes before the first reply still unanswered."""
    caller, worker = Client(ctx), Client(ctx)
    caller.send(b"put 0 0 60 1\r\nw\r\nput-with 0 0 60 1 tube=calls notify-ms=10000\r\nx\r\n")
    await caller.expect(b"INSERTED 1\r\nINSERTED 2\r\n")
    caller.send(b"wait 1 10\r\n")  # job 1 lives on: this wait holds the connection
    worker.send(b"watch calls\r\nignore default\r\nreserve\r\nfinish 2 1\r\nX\r\n")
    await worker.expect(b"WATCHING 2\r\nWATCHING 1\r\nRESERVED 2 1\r\nx\r\nFINISHED\r\n")
    await caller.expect(b"END 2 finished 1\r\nX\r\n")
    worker.send(b"watch default\r\nreserve\r\ndelete 1\r\n")
    await worker.expect(b"WATCHING 2\r\nRESERVED 1 1\r\nw\r\nDELETED\r\n")
    await caller.expect(b"ENDED 1 deleted 0\r\n\r\n")


async def test_calls_run_after_a_half_close_or_a_quit_are_answered_and_the_connection_closes(
        ctx: ServerContext) -> None:
    """Calls the pump runs after the EOF (it stopped at --max-in-flight before) or sent
    before a quit hear timed-out at once; then the connection closes, holding no wait."""
    ctx.max_in_flight = 1
    caller = Client(ctx)
    caller.send(b"put-with 0 0 60 1 notify-ms=60000\r\nx\r\n"
                b"put-with 0 0 60 1 notify-ms=60000\r\ny\r\n")
    await caller.until(lambda out: out.count(b"\r\n") >= 1)
    assert caller.conn.eof_received() is True
    await caller.until(lambda _: caller.transport.closed)
    out = bytes(caller.transport.out)
    assert out.count(b"INSERTED") == 2 and out.count(b" timed-out 0\r\n") == 2
    ctx.max_in_flight = 128
    quitter = Client(ctx)
    quitter.send(b"put-with 0 0 60 1 notify-ms=60000\r\nz\r\nquit\r\n")
    await quitter.until(lambda _: quitter.transport.closed)
    assert bytes(quitter.transport.out) == b"INSERTED 3\r\nEND 3 timed-out 0\r\n\r\n"
    for _ in range(100):
        if not len(ctx.end_waits):
            break
        await asyncio.sleep(0.01)
    assert len(ctx.end_waits) == 0


def test_recent_ends_keep_no_long_result() -> None:
    """An end told from a finish's reply carries the whole result; the recent ends keep it
    only when a message could carry it too (END_INLINE_MAX): a longer one is read."""
    async def run() -> None:
        waits = EndWaits()
        waits.ended(1, JobEnd("finished", b"x" * end_waits.END_INLINE_MAX))
        waits.ended(2, JobEnd("finished", b"x" * (end_waits.END_INLINE_MAX + 1)))
        kept = {job_id: heard[0] for job_id, heard in waits._recent.items()}
        assert kept[1] is not None and kept[2] is None

    asyncio.run(run())


async def test_notifies_in_flight_count_as_unanswered_commands(ctx: ServerContext) -> None:
    """Flow control: a connection with --max-in-flight calls awaiting their end is not read
    further until one ends (its commands wait, nothing is refused)."""
    ctx.max_in_flight = 2
    caller, worker = Client(ctx), Client(ctx)
    caller.send(b"put-with 0 0 60 1 notify-ms=60000\r\na\r\n"
                b"put-with 0 0 60 1 notify-ms=60000\r\nb\r\nlist-tube-used\r\n")
    await caller.expect(b"INSERTED 1\r\nINSERTED 2\r\n")
    await asyncio.sleep(0.2)
    assert caller.transport.out == b"" and not caller.transport.reading
    worker.send(b"reserve\r\nfinish 1 1\r\nA\r\n")
    await worker.expect(b"RESERVED 1 1\r\na\r\nFINISHED\r\n")
    await caller.expect(b"END 1 finished 1\r\nA\r\nUSING default\r\n")


async def test_an_end_only_its_calls_process_waits_for_is_told_there_not_published(
        redis_url: str) -> None:
    """A request/reply's job finished by its own process: the end reaches the call from the
    finish's reply, and nothing is published (finish.lua, JOB_WAITED_BY). Finished by another
    process, or waited for by a `wait` too, it is published, and every waiter hears it."""
    servers = [Server(Config(port=0, redis_url=redis_url, prefix="told")) for _ in range(2)]
    for server in servers:
        await server.start()
    a, b = (server.ctx for server in servers)
    assert a is not None and b is not None
    listener = redis.asyncio.Redis.from_url(redis_url)
    pubsub = listener.pubsub()
    await pubsub.subscribe(a.store.keys.ended_channel)
    try:
        caller, worker_a, worker_b, waiter = Client(a), Client(a), Client(b), Client(b)
        worker_a.send(b"watch calls\r\n")
        worker_b.send(b"watch calls\r\n")
        await worker_a.expect(b"WATCHING 2\r\n")
        await worker_b.expect(b"WATCHING 2\r\n")
        for job_id, worker in ((1, worker_a), (2, worker_b), (3, worker_a)):
            caller.send(b"put-with 0 0 60 1 tube=calls notify-ms=10000\r\nx\r\n")
            await caller.expect(b"INSERTED %d\r\n" % job_id)
            if job_id == 3:  # a wait of another process marks it too
                waiter.send(b"wait 3 10\r\n")
                await asyncio.sleep(0.2)
            worker.send(b"reserve\r\nfinish %d 2\r\nok\r\n" % job_id)
            await worker.expect(b"RESERVED %d 1\r\nx\r\nFINISHED\r\n" % job_id)
            await caller.expect(b"END %d finished 2\r\nok\r\n" % job_id)
        await waiter.expect(b"ENDED 3 finished 2\r\nok\r\n")
        published = []
        loop = asyncio.get_running_loop()
        until = loop.time() + 0.5
        while loop.time() < until:  # (None also stands for the subscription's confirmation)
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message is not None:
                published.append(int(message["data"].split(b"\n")[0]))
        assert published == [2, 3]
    finally:
        await pubsub.aclose()
        await listener.aclose()
        for server in servers:
            await server.stop()


async def test_fail_keeps_the_error_and_follows_the_jobs_policies(ctx: ServerContext) -> None:
    """A failure is a try: back to ready while tries remain (its error and count in stats-job),
    buried with reason max-tries and the last error when they run out; the waiter hears both."""
    worker, caller = Client(ctx), Client(ctx)
    worker.send(b"put-with 0 0 60 1 max-tries=2\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    caller.send(b"wait 1 30\r\n")
    worker.send(b"fail 1 5\r\nboom!\r\nfail 1 1\r\nz\r\nstats-job 1\r\n")
    doc = await worker.until(lambda o: o.endswith(b"\n\r\n"))
    assert doc.startswith(b"FAILED\r\nNOT_FOUND\r\nOK ")  # released: no longer held
    assert b"state: ready\n" in doc and b"failures: 1\n" in doc and b'error: "boom!"\n' in doc
    assert b"tries: 1\n" in doc
    worker.transport.out.clear()
    worker.send(b"reserve\r\nfail 1 13\r\nline 1\nline 2\r\n")
    await worker.expect(b"RESERVED 1 1\r\nx\r\nFAILED\r\n")
    await caller.expect(b"ENDED 1 buried 23\r\nmax-tries\nline 1\nline 2\r\n")
    worker.send(b"stats-job 1\r\n")
    doc = await worker.until(lambda o: o.endswith(b"\n\r\n"))
    assert b"state: buried\n" in doc and b'error: "line 1\\nline 2"\n' in doc
    caller.send(b"wait 1 0\r\n")  # it lies buried: answered at once, with its reason and error
    await caller.expect(b"ENDED 1 buried 23\r\nmax-tries\nline 1\nline 2\r\n")


async def test_a_failed_job_with_a_backoff_is_delayed_by_it(ctx: ServerContext) -> None:
    worker = Client(ctx)
    worker.send(b"put-with 0 0 60 1 backoff-ms=60000\r\nx\r\nreserve\r\nfail 1 0\r\n\r\n"
                b"stats-job 1\r\n")
    doc = await worker.until(lambda o: o.endswith(b"\n\r\n"))
    assert doc.startswith(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\nFAILED\r\nOK ")
    assert b"state: delayed\n" in doc and b"failures: 1\n" in doc and b'error: ""\n' in doc


async def test_fail_by_a_connection_not_holding_the_job_changes_nothing(
        ctx: ServerContext) -> None:
    worker, other = Client(ctx), Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\n")
    await worker.expect(b"INSERTED 1\r\n")
    other.send(b"fail 1 1\r\ne\r\nreserve\r\nfail 2 1\r\ne\r\nfail 1\r\n")
    await other.expect(b"NOT_FOUND\r\nRESERVED 1 1\r\nx\r\nNOT_FOUND\r\nBAD_FORMAT\r\n")
    worker.send(b"stats-job 1\r\n")
    doc = await worker.until(lambda o: o.endswith(b"\n\r\n"))
    assert b"state: reserved\n" in doc


async def test_ends_on_a_namespace_split_into_shards(redis_url: str) -> None:
    """--shards 4: a job's end is kept on its own shard and published on that shard's channel;
    waits, request/reply and a late wait work for jobs of every shard."""
    server = Server(Config(port=0, redis_url=redis_url, prefix="ends-split", shards=4))
    await server.start()
    try:
        assert server.ctx is not None
        caller, worker = Client(server.ctx), Client(server.ctx)
        worker.send(b"".join(b"watch calls%d\r\n" % n for n in range(6)))
        await worker.until(lambda o: o.endswith(b"WATCHING 7\r\n"))
        worker.transport.out.clear()
        shards = set()
        for n in range(6):  # tubes, and so jobs, on several shards
            caller.send(b"use calls%d\r\nput-with 0 0 60 1 wait-ms=10000\r\n%d\r\n" % (n, n))
            await caller.expect(b"USING calls%d\r\n" % n)
            worker.send(b"reserve\r\n")
            reserved = await worker.until(lambda o: o.count(b"\r\n") == 2)
            job_id = int(reserved.split()[1])
            shards.add(job_id % 4)
            worker.transport.out.clear()
            worker.send(b"finish %d 2\r\nr%d\r\n" % (job_id, n))
            await worker.expect(b"FINISHED\r\n")
            await caller.expect(b"ENDED %d finished 2\r\nr%d\r\n" % (job_id, n))
            caller.send(b"wait %d 0\r\n" % job_id)
            await caller.expect(b"ENDED %d finished 2\r\nr%d\r\n" % (job_id, n))
        assert len(shards) > 1, shards  # the jobs were on more than one shard
    finally:
        await server.stop()


async def test_a_result_over_max_result_size_is_refused(redis_url: str) -> None:
    server = Server(Config(port=0, redis_url=redis_url, prefix="ends-cap", max_result_size=4))
    await server.start()
    try:
        assert server.ctx is not None
        worker = Client(server.ctx)
        worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\nprogress 1 5\r\n12345\r\n"
                    b"finish 1 5\r\n12345\r\nfinish 1 4\r\n1234\r\n")
        await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\nJOB_TOO_BIG\r\n"
                            b"JOB_TOO_BIG\r\nFINISHED\r\n")
    finally:
        await server.stop()


async def test_cancel_deletes_a_waiting_job_and_its_waiters_hear_it(ctx: ServerContext) -> None:
    client, caller = Client(ctx), Client(ctx)
    client.send(b"put 0 0 60 1\r\na\r\nput 0 100 60 1\r\nb\r\nput 0 0 60 1\r\nc\r\n")
    await client.expect(b"INSERTED 1\r\nINSERTED 2\r\nINSERTED 3\r\n")
    client.send(b"reserve-job 3\r\nbury 3 0\r\n")
    await client.expect(b"RESERVED 3 1\r\nc\r\nBURIED\r\n")
    caller.send(b"wait 1 10\r\n")
    await asyncio.sleep(0.1)
    client.send(b"cancel 1\r\ncancel 2\r\ncancel 3\r\ncancel 3\r\ncancel 99\r\n"
                b"peek 1\r\npeek 2\r\npeek 3\r\n")
    await client.expect(b"CANCELLED\r\n" * 3 + b"NOT_FOUND\r\n" * 5)
    await caller.expect(b"ENDED 1 cancelled 0\r\n\r\n")
    client.send(b"cancel 0\r\ncancel x\r\n")
    await client.expect(b"NOT_FOUND\r\nBAD_FORMAT\r\n")


@pytest.mark.parametrize(("holder_says", "answer"), [
    (b"touch 1\r\n", b"NOT_FOUND\r\n"),  # a beanstalkd client: the job is no longer its own
    (b"extensions\r\ntouch 1\r\n", b"CANCELLED\r\n"),  # a client that knows tubeq
    (b"finish 1 1\r\nr\r\n", b"CANCELLED\r\n"), (b"fail 1 1\r\ne\r\n", b"CANCELLED\r\n")],
    ids=["touch", "touch-extended", "finish", "fail"])
async def test_a_cancelled_reserved_job_tells_its_holder_and_never_runs_again(
        ctx: ServerContext, holder_says: bytes, answer: bytes) -> None:
    worker, other, caller = Client(ctx), Client(ctx), Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    caller.send(b"wait 1 10\r\n")
    await asyncio.sleep(0.1)
    other.send(b"cancel 1\r\nstats-job 1\r\n")
    out = await other.until(lambda o: o.endswith(b"\n\r\n"))
    assert out.startswith(b"CANCELLED\r\nOK ") and b"state: reserved\n" in out  # held still
    worker.send(holder_says)
    out = await worker.until(lambda o: o.endswith(answer))
    assert out.endswith(answer), out
    worker.transport.out.clear()
    await caller.expect(b"ENDED 1 cancelled 0\r\n\r\n")
    worker.send(b"peek 1\r\nreserve-with-timeout 0\r\n")
    await worker.expect(b"NOT_FOUND\r\nTIMED_OUT\r\n")


@pytest.mark.parametrize("ending", [b"release 1 0 0\r\n", b"bury 1 0\r\n"],
                         ids=["release", "bury"])
async def test_a_cancelled_job_a_plain_client_gives_back_is_gone(ctx: ServerContext,
                                                                 ending: bytes) -> None:
    """A holder that never heard of cancel (a beanstalkd client) gets its usual reply, and
    the job goes all the same."""
    worker, other = Client(ctx), Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    other.send(b"cancel 1\r\n")
    await other.expect(b"CANCELLED\r\n")
    worker.send(ending + b"peek 1\r\n")
    await worker.expect((b"RELEASED\r\n" if ending.startswith(b"release") else b"BURIED\r\n")
                        + b"NOT_FOUND\r\n")
    worker.send(b"stats-tube default\r\n")
    doc = await worker.until(lambda o: o.endswith(b"\n\r\n"))
    assert b"current-jobs-ready: 0\n" in doc and b"current-jobs-buried: 0\n" in doc


async def test_a_cancelled_job_whose_ttr_runs_out_is_gone(ctx: ServerContext) -> None:
    worker, caller = Client(ctx), Client(ctx)
    worker.send(b"put 0 0 1 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    caller.send(b"cancel 1\r\nwait 1 10\r\n")
    await caller.expect(b"CANCELLED\r\nENDED 1 cancelled 0\r\n\r\n")  # at its TTR
    worker.send(b"peek 1\r\n")
    await worker.expect(b"NOT_FOUND\r\n")


async def test_progress_touches_the_job_and_a_wait_can_follow_it(ctx: ServerContext) -> None:
    worker, caller = Client(ctx), Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\nstats-job 1\r\n")
    first = await worker.until(lambda o: o.endswith(b"\n\r\n"))
    worker.transport.out.clear()
    caller.send(b"wait 1 10 progress=0\r\n")  # the first report, or the end
    await asyncio.sleep(0.1)
    worker.send(b"progress 1 3\r\n10%\r\n")
    await worker.expect(b"TOUCHED\r\n")
    await caller.expect(b"PROGRESS 1 1 3\r\n10%\r\n")
    caller.send(b"wait 1 0 progress=0\r\nwait-ms 1 50 progress=1\r\n")  # no report twice
    await caller.expect(b"PROGRESS 1 1 3\r\n10%\r\nTIMED_OUT\r\n")
    caller.send(b"wait 1 10 progress=1\r\n")
    await asyncio.sleep(0.1)
    worker.send(b"progress 1 3\r\n50%\r\nprogress 1 3\r\n90%\r\nfinish 1 4\r\ndone\r\n")
    await worker.expect(b"TOUCHED\r\nTOUCHED\r\nFINISHED\r\n")
    got = await caller.until(lambda o: o.endswith((b"%\r\n", b"done\r\n")))
    # the latest report when the wait read it, or the end if that came first: never a stale one
    assert got in (b"PROGRESS 1 2 3\r\n50%\r\n", b"PROGRESS 1 3 3\r\n90%\r\n",
                   b"ENDED 1 finished 4\r\ndone\r\n"), got
    caller.transport.out.clear()
    caller.send(b"wait 1 0 progress=3\r\nwait 1 0\r\n")  # ended: the end, whatever was asked
    await caller.expect(b"ENDED 1 finished 4\r\ndone\r\n" * 2)
    assert b"time-left: 59" in first or b"time-left: 60" in first
    worker.send(b"progress 1 1\r\nx\r\nprogress 2\r\nwait 1 0 progress=x\r\n"
                b"wait 1 0 bogus=1\r\n")
    await worker.expect(b"NOT_FOUND\r\nBAD_FORMAT\r\nBAD_OPTION progress\r\n"
                        b"BAD_OPTION bogus\r\n")


async def test_progress_of_a_cancelled_job_answers_cancelled(ctx: ServerContext) -> None:
    worker, other = Client(ctx), Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    other.send(b"cancel 1\r\n")
    await other.expect(b"CANCELLED\r\n")
    worker.send(b"progress 1 1\r\n%\r\npeek 1\r\n")
    await worker.expect(b"CANCELLED\r\nNOT_FOUND\r\n")


async def test_stats_tube_counts_finished_jobs_and_failures(ctx: ServerContext) -> None:
    worker = Client(ctx)
    worker.send(b"use counted\r\nwatch counted\r\nput 0 0 60 1\r\nx\r\nput 0 0 60 1\r\ny\r\n"
                b"reserve\r\nreserve\r\nfail 2 1\r\ne\r\nfinish 1 0\r\n\r\n")
    await worker.until(lambda o: o.endswith(b"FINISHED\r\n"))
    worker.transport.out.clear()
    worker.send(b"stats-tube counted\r\n")
    doc = await worker.until(lambda o: o.endswith(b"\n\r\n"))
    assert b"total-finished: 1\n" in doc and b"total-failed: 1\n" in doc
    assert b"cmd-delete: 1\n" in doc  # a finish is a delete too


async def test_put_with_tube_puts_there_and_the_used_tube_stays(ctx: ServerContext) -> None:
    client = Client(ctx)
    client.send(b"put-with 0 0 60 1 tube=elsewhere\r\nx\r\nlist-tube-used\r\n"
                b"put-with 0 0 60 1 tube=-bad\r\ny\r\nput-with 0 0 60 1 tube=a tube=b\r\nz\r\n")
    await client.expect(b"INSERTED 1\r\nUSING default\r\nBAD_OPTION tube\r\nBAD_OPTION tube\r\n")
    client.send(b"stats-job 1\r\n")
    assert b"tube: elsewhere\n" in await client.until(lambda o: o.endswith(b"\n\r\n"))


async def test_a_finish_behind_a_blocked_reserve_is_done_at_once(ctx: ServerContext) -> None:
    """finish (and fail, progress) act on a held job, as delete and touch do: pipelined behind
    a reserve that waits, it runs at once (its reply keeps its place, after the reserve's)."""
    worker, caller = Client(ctx), Client(ctx)
    worker.send(b"put 0 0 60 1\r\nx\r\nreserve\r\n")
    await worker.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    caller.send(b"wait 1 30\r\n")
    await asyncio.sleep(0.1)
    worker.send(b"reserve-with-timeout 5\r\nfinish 1 2\r\nok\r\n")
    await caller.expect(b"ENDED 1 finished 2\r\nok\r\n")
    assert worker.transport.out == b""  # the reserve still waits: the finish did not
    producer = Client(ctx)
    producer.send(b"put 0 0 60 1\r\ny\r\n")  # (ends that wait)
    await producer.expect(b"INSERTED 2\r\n")
    await worker.expect(b"RESERVED 2 1\r\ny\r\nFINISHED\r\n")


async def test_a_push_connection_that_asked_hears_of_a_cancel_at_once(
        ctx: ServerContext) -> None:
    """push ... cancels=1: CANCELLED <id> as soon as another connection cancels a job it
    holds (cancel.lua tells the holder's process); without it, only the next touch says so."""
    producer, asked, plain = Client(ctx), Client(ctx), Client(ctx)
    producer.send(b"use a\r\nput 0 0 60 1\r\nx\r\nuse b\r\nput 0 0 60 1\r\ny\r\n")
    await producer.expect(b"USING a\r\nINSERTED 1\r\nUSING b\r\nINSERTED 2\r\n")
    asked.send(b"watch a\r\nignore default\r\npush 5 cancels=1\r\n")
    await asked.expect(b"WATCHING 2\r\nWATCHING 1\r\nPUSHING 5\r\nRESERVED 1 1\r\nx\r\n")
    plain.send(b"watch b\r\nignore default\r\npush 5\r\n")
    await plain.expect(b"WATCHING 2\r\nWATCHING 1\r\nPUSHING 5\r\nRESERVED 2 1\r\ny\r\n")
    producer.send(b"cancel 1\r\ncancel 2\r\n")
    await producer.expect(b"CANCELLED\r\nCANCELLED\r\n")
    await asked.expect(b"CANCELLED 1\r\n")
    await asyncio.sleep(0.2)
    assert plain.transport.out == b""
    plain.send(b"touch 2\r\n")
    await plain.expect(b"CANCELLED\r\n")
    asked.send(b"push 1 cancels=2\r\npush 1 cancels=1 \r\npush 1 x\r\n")
    await asked.expect(b"BAD_OPTION cancels\r\nBAD_FORMAT\r\nBAD_FORMAT\r\n")
    asked.send(b"peek 1\r\n")  # marked, still there: its holder's release, TTR or close drops it
    await asked.expect(b"FOUND 1 1\r\nx\r\n")


async def test_a_jobs_own_result_ttl_ms_bounds_how_long_its_result_is_kept(
        ctx: ServerContext) -> None:
    """put-with result-ttl-ms: the job's result is kept that long instead of --result-ttl
    (an hour here); the other job's result is still there after it."""
    client = Client(ctx)
    client.send(b"put-with 0 0 60 1 result-ttl-ms=300\r\na\r\nput 0 0 60 1\r\nb\r\n"
                b"reserve\r\nfinish 1 2\r\nr1\r\nreserve\r\nfinish 2 2\r\nr2\r\n"
                b"wait 1 0\r\n")
    await client.expect(b"INSERTED 1\r\nINSERTED 2\r\nRESERVED 1 1\r\na\r\nFINISHED\r\n"
                        b"RESERVED 2 1\r\nb\r\nFINISHED\r\nENDED 1 finished 2\r\nr1\r\n")
    await asyncio.sleep(0.5)
    client.send(b"wait 1 0\r\nwait 2 0\r\nput-with 0 0 60 1 result-ttl-ms=x\r\nc\r\n")
    await client.expect(b"NOT_FOUND\r\nENDED 2 finished 2\r\nr2\r\nBAD_OPTION result-ttl-ms\r\n")


async def test_a_fails_own_policy_applies_where_the_job_and_its_tube_have_none(
        ctx: ServerContext) -> None:
    """fail's options (the worker's max-tries, backoff-ms, backoff-max-ms) are the job's
    policy only where neither the job (put-with) nor its tube (tube-set) has one; a refused
    option is answered after its body, which is never read as commands."""
    client = Client(ctx)
    client.send(b"put 0 0 60 1\r\na\r\nreserve\r\nfail 1 4 max-tries=x\r\nboom\r\n"
                b"fail 1 4 max-tries=1\r\nboom\r\nstats-job 1\r\n")
    out = await client.until(lambda o: b"\nkicks:" in o and o.endswith(b"\r\n"))
    assert out.startswith(b"INSERTED 1\r\nRESERVED 1 1\r\na\r\nBAD_OPTION max-tries\r\n"
                          b"FAILED\r\nOK ")
    assert b"\nstate: buried\n" in out and b"\nreason: max-tries\n" in out
    client.transport.out.clear()
    client.send(b"tube-set limited max-tries=3\r\nuse limited\r\nwatch limited\r\n"
                b"ignore default\r\nput 0 0 60 1\r\nb\r\nreserve\r\n"
                b"fail 2 4 max-tries=1 backoff-ms=60000\r\nboom\r\nstats-job 2\r\n")
    out = await client.until(lambda o: b"\nkicks:" in o and o.endswith(b"\r\n"))
    assert b"FAILED\r\n" in out
    assert b"\nstate: delayed\n" in out  # the tube's max-tries wins; the fail's backoff fills in


async def test_a_turns_finishes_go_as_one_call_and_each_answers_as_alone(
        ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's finishes of one read (its answers to several calls) reach the store as one
    finish_many, each answered on its own and in order, as a lone finish answers it: done
    (its waits hear the result: a `wait`'s published end, a notify of this process told from
    the reply), not held (another's job, one finished twice, an unknown id), cancelled. The
    tube's counters and stats move as for lone finishes, and the tube goes once unused."""
    calls = spy_on(ctx, monkeypatch, ("finish", "finish_many", "delete", "delete_many"))
    caller, worker, other, waiter = Client(ctx), Client(ctx), Client(ctx), Client(ctx)
    caller.send(b"".join(b"put-with 0 0 60 1 tube=fin notify-ms=10000\r\n%d\r\n" % i
                         for i in range(1, 5)))
    await caller.expect(b"INSERTED 1\r\nINSERTED 2\r\nINSERTED 3\r\nINSERTED 4\r\n")
    worker.send(b"watch fin\r\nreserve\r\nreserve\r\nreserve\r\n")
    await worker.until(lambda o: o.count(b"RESERVED") == 3)
    other.send(b"watch fin\r\nreserve\r\n")
    await other.until(lambda o: b"RESERVED 4 " in o)
    waiter.send(b"wait 2 10\r\n")
    await asyncio.sleep(0.1)
    other.send(b"cancel 3\r\n")
    await other.until(lambda o: o.endswith(b"CANCELLED\r\n"))
    worker.transport.out.clear()
    worker.send(b"finish 1 2\r\nr1\r\nfinish 2 2\r\nr2\r\nfinish 4 2\r\nr4\r\n"
                b"finish 2 2\r\nr2\r\nfinish 3 2\r\nr3\r\nfinish 99 0\r\n\r\n")
    await worker.expect(b"FINISHED\r\nFINISHED\r\nNOT_FOUND\r\nNOT_FOUND\r\nCANCELLED\r\n"
                        b"NOT_FOUND\r\n")
    assert [(name, [job[0] for job in args[1]]) for name, args in calls] == [
        ("finish_many", [1, 2, 4, 2, 3, 99])]
    await caller.until(lambda o: b"END 1 finished 2\r\nr1\r\n" in o
                       and b"END 2 finished 2\r\nr2\r\n" in o and b"END 3 cancelled" in o)
    await waiter.expect(b"ENDED 2 finished 2\r\nr2\r\n")
    other.send(b"finish 4 2\r\nr4\r\n")  # its holder's, alone
    await other.until(lambda o: o.endswith(b"FINISHED\r\n"))
    await caller.until(lambda o: b"END 4 finished 2\r\nr4\r\n" in o)
    worker.transport.out.clear()
    worker.send(b"stats-tube fin\r\n")
    doc = await worker.until(lambda o: o.endswith(b"\n\r\n"))
    assert b"total-finished: 3\n" in doc and b"current-jobs-reserved: 0\n" in doc, doc
    assert b"cmd-delete: 4\n" in doc, doc  # 3 finished and 1 cancelled, as alone
    worker.send(b"ignore fin\r\n")
    other.send(b"ignore fin\r\n")
    await worker.until(lambda o: o.endswith(b"WATCHING 1\r\n"))
    await other.until(lambda o: o.endswith(b"WATCHING 1\r\n"))
    worker.transport.out.clear()
    worker.send(b"list-tubes\r\n")
    out = await worker.until(lambda o: o.endswith(b"\n\r\n"))
    assert b"fin" not in out, out


async def test_a_turns_calls_go_as_one_put_and_a_push_loop_gets_no_more_than_its_credits(
        ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's calls of one read (put-with notify-ms, no other option) reach the store as
    one put_calls: each answered INSERTED in order, its job handed straight to this process's
    push loop while that loop has credit (2 here: the other two wait ready until it settles
    one), and each END comes as the job is finished. A call with another option goes alone,
    before the run after it."""
    calls = spy_on(ctx, monkeypatch, ("put", "put_with", "put_many", "put_calls"))
    worker, caller = Client(ctx), Client(ctx)
    worker.send(b"watch c\r\nignore default\r\npush 2\r\n")
    await worker.expect(b"WATCHING 2\r\nWATCHING 1\r\nPUSHING 2\r\n")
    await asyncio.sleep(0.1)  # its first take found nothing: it waits, counted in
    worker.transport.out.clear()
    call = b"put-with 0 0 60 1 tube=c notify-ms=10000%s\r\n%d\r\n"
    caller.send(b"".join(call % (b"", i) for i in range(1, 5)))
    await caller.expect(b"".join(b"INSERTED %d\r\n" % i for i in range(1, 5)))
    assert [(name, len(args[1])) for name, args in calls] == [("put_calls", 4)]
    await worker.until(lambda o: o.count(b"RESERVED") == 2)
    await asyncio.sleep(0.2)
    assert worker.transport.out == b"RESERVED 1 1\r\n1\r\nRESERVED 2 1\r\n2\r\n"  # no more
    caller.send(call % (b" max-tries=3", 5) + call % (b"", 6) + call % (b"", 7))
    await caller.expect(b"INSERTED 5\r\nINSERTED 6\r\nINSERTED 7\r\n")
    assert [(name, len(args[1]) if name == "put_calls" else 1) for name, args in calls[1:]] \
        == [("put_with", 1), ("put_calls", 2)]
    for job_id in range(1, 8):
        await worker.until(lambda o, j=job_id: b"RESERVED %d " % j in o)
        worker.send(b"finish %d 2\r\nr%d\r\n" % (job_id, job_id))
        await caller.until(lambda o, j=job_id: b"END %d finished 2\r\nr%d\r\n" % (j, j) in o)
    await asyncio.sleep(0.1)
    assert worker.conn.push_room() == 2  # every credit free, none left promised


def _call(i: int) -> bytes:
    return b"put-with 0 0 60 1 tube=c notify-ms=10000\r\n%d\r\n" % i


async def _push_worker(ctx: ServerContext, credits: int) -> Client:
    worker = Client(ctx)
    worker.send(b"watch c\r\nignore default\r\npush %d\r\n" % credits)
    await worker.expect(b"WATCHING 2\r\nWATCHING 1\r\nPUSHING %d\r\n" % credits)
    await asyncio.sleep(0.1)  # its first take found nothing: it waits, counted in
    return worker


async def test_a_settle_while_a_run_of_calls_is_in_flight_leaves_the_loop_taking(
        ctx: ServerContext) -> None:
    """A push loop's job settled while a run of calls that was promised its credits is in
    flight: the run hands it what it may, and the loop still takes the rest as credit comes
    back (a review found a loop left counted out in Redis while it thought itself counted in,
    asleep with a free credit and a ready job)."""
    worker, caller = await _push_worker(ctx, 2), Client(ctx)
    caller.send(_call(1))
    await caller.expect(b"INSERTED 1\r\n")
    await worker.expect(b"RESERVED 1 1\r\n1\r\n")
    await asyncio.sleep(0.05)
    worker.send(b"delete 1\r\n")  # in the same tick as the run below
    caller.send(_call(2) + _call(3))
    await caller.until(lambda o: b"INSERTED 2\r\nINSERTED 3\r\n" in o)
    await worker.until(lambda o: b"RESERVED 2 1\r\n2\r\n" in o and b"RESERVED 3 1\r\n3\r\n" in o)


async def test_a_run_of_calls_handed_over_directly_keeps_the_tubes_max_jobs(
        ctx: ServerContext) -> None:
    """Each job a run hands straight to a push loop counts against the tube's max-jobs at once,
    as a lone put's does (a review found a run of 4 inserting 4 into a tube of max-jobs 2)."""
    admin, caller = Client(ctx), Client(ctx)
    admin.send(b"tube-set c max-jobs=2\r\n")
    await admin.expect(b"SET\r\n")
    worker = await _push_worker(ctx, 4)
    caller.send(_call(1) + _call(2) + _call(3) + _call(4))
    out = await caller.until(lambda o: o.count(b"\r\n") >= 4)
    assert out == b"INSERTED 1\r\nINSERTED 2\r\nOUT_OF_MEMORY\r\nOUT_OF_MEMORY\r\n", out
    await worker.until(lambda o: o.count(b"RESERVED") == 2)


async def test_a_push_loops_own_take_leaves_the_credits_promised_to_a_run(
        ctx: ServerContext) -> None:
    """A push loop woken while a run of calls promised its credits is in flight takes none of
    them: it never holds more jobs than its credits (a review found its take reserving the
    run's leftover jobs on top of those handed over)."""
    worker, caller = await _push_worker(ctx, 2), Client(ctx)
    worker.send(b"push 2\r\n")  # wakes the loop: it looks at its credits again
    caller.send(_call(1) + _call(2) + _call(3) + _call(4))
    await caller.until(lambda o: o.count(b"INSERTED") == 4)
    await worker.until(lambda o: o.count(b"RESERVED") == 2)
    await asyncio.sleep(0.3)
    assert bytes(worker.transport.out).count(b"RESERVED") == 2



async def test_an_end_told_here_is_written_in_the_finishs_turn_not_after_the_waits_task(
        ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call's END frame is written as the end reaches its wait (EndWait.told: the finish's
    reply of this process, or a message), not once the wait's task has woken and returned:
    here that task never returns, and the frame still comes."""
    async def registered_and_stuck(store: Any, waits: EndWaits, wait: EndWait, timeout_ms: int,
                                   keep_ms: int, *, read_first: bool = True,
                                   progress_after: int | None = None) -> None:
        waits.add(wait, recent=not read_first)
        await asyncio.sleep(3600)

    monkeypatch.setattr(end_waits, "wait_for_end", registered_and_stuck)
    worker, caller = await _push_worker(ctx, 1), Client(ctx)
    caller.send(_call(1))
    await caller.expect(b"INSERTED 1\r\n")
    await worker.expect(b"RESERVED 1 1\r\n1\r\n")
    worker.send(b"finish 1 2\r\nok\r\n")
    await worker.expect(b"FINISHED\r\n")
    await caller.expect(b"END 1 finished 2\r\nok\r\n")


async def test_a_callers_end_is_written_before_the_finishers_own_reply(
        ctx: ServerContext) -> None:
    """The worker's finish ends another connection's call: the caller's END frame leaves
    first (it is what the caller waits for), then the worker's FINISHED."""
    worker, caller = await _push_worker(ctx, 1), Client(ctx)
    caller.send(_call(1))
    await caller.expect(b"INSERTED 1\r\n")
    await worker.expect(b"RESERVED 1 1\r\n1\r\n")
    writes: list[tuple[str, bytes]] = []
    for name, client in (("worker", worker), ("caller", caller)):
        def write(data: bytes | bytearray | memoryview, name: str = name,
                  out: bytearray = client.transport.out) -> None:
            writes.append((name, bytes(data)))
            out += data
        client.transport.write = write  # type: ignore[method-assign]
    worker.send(b"finish 1 2\r\nok\r\n")
    await worker.expect(b"FINISHED\r\n")
    await caller.expect(b"END 1 finished 2\r\nok\r\n")
    assert writes == [("caller", b"END 1 finished 2\r\nok\r\n"), ("worker", b"FINISHED\r\n")]


async def test_a_connection_that_finishes_its_own_call_hears_finished_then_end(
        ctx: ServerContext) -> None:
    """One connection calls and finishes the job itself: FINISHED (its finish's reply) comes
    before the END frame the finish caused (a review found them the other way round once the
    end was told at once)."""
    conn = Client(ctx)
    conn.send(b"put-with 0 0 60 1 notify-ms=10000\r\nx\r\n")
    await conn.expect(b"INSERTED 1\r\n")
    conn.send(b"reserve\r\n")
    await conn.expect(b"RESERVED 1 1\r\nx\r\n")
    conn.send(b"finish 1 2\r\nok\r\n")
    await conn.expect(b"FINISHED\r\nEND 1 finished 2\r\nok\r\n")


async def test_a_finish_sent_past_its_own_reserve_still_answers_before_the_end_it_caused(
        ctx: ServerContext) -> None:
    """The finish of a connection's own call pipelined behind a reserve (Redis runs it past
    the reserve, or defers it until the reserve has answered): FINISHED, then END, either
    way (a review found END first: the finish's reply is made a loop turn later there)."""
    conn, producer = Client(ctx), Client(ctx)
    conn.send(b"put-with 0 0 60 1 notify-ms=10000\r\nx\r\n")
    await conn.expect(b"INSERTED 1\r\n")
    conn.send(b"reserve\r\n")
    await conn.expect(b"RESERVED 1 1\r\nx\r\n")
    producer.send(b"put 0 0 60 1\r\ny\r\n")
    await producer.expect(b"INSERTED 2\r\n")
    conn.send(b"reserve\r\nfinish 1 2\r\nok\r\n")  # the reserve finds job 2 at once
    await conn.expect(b"RESERVED 2 1\r\ny\r\nFINISHED\r\nEND 1 finished 2\r\nok\r\n")

    conn.send(b"put-with 0 0 60 1 notify-ms=10000\r\nz\r\n")
    await conn.expect(b"INSERTED 3\r\n")
    conn.send(b"delete 2\r\nreserve\r\n")
    await conn.expect(b"DELETED\r\nRESERVED 3 1\r\nz\r\n")
    conn.send(b"reserve\r\nfinish 3 2\r\nok\r\n")  # the reserve waits: the finish too
    await asyncio.sleep(0.2)
    producer.send(b"put 0 0 60 1\r\nw\r\n")
    await producer.expect(b"INSERTED 4\r\n")
    await conn.expect(b"RESERVED 4 1\r\nw\r\nFINISHED\r\nEND 3 finished 2\r\nok\r\n")


def _refused(*_: Any, **__: Any) -> asyncio.Future[Any]:
    failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    failed.set_exception(RedisReplyError("ERR refused for the test"))
    return failed


async def test_a_run_of_calls_redis_refuses_answers_each_and_gives_the_credits_back(
        ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of calls whose put_many Redis refuses: each call answers INTERNAL_ERROR not-run,
    no END frame follows (no job was stored), and the credits promised to the run are free
    again, so the next calls go straight to the consumer."""
    worker, caller = await _push_worker(ctx, 2), Client(ctx)
    real = ctx.store.put_calls
    monkeypatch.setattr(ctx.store, "put_calls", _refused)
    caller.send(_call(1) + _call(2))
    await caller.expect(b"INTERNAL_ERROR not-run\r\nINTERNAL_ERROR not-run\r\n")
    await asyncio.sleep(0.2)
    assert caller.transport.out == b"" and worker.transport.out == b""
    assert worker.conn.push_room() == 2
    monkeypatch.setattr(ctx.store, "put_calls", real)
    caller.send(_call(3) + _call(4))
    await caller.until(lambda o: o.count(b"INSERTED") == 2)
    await worker.until(lambda o: o.count(b"RESERVED") == 2)


async def test_a_turn_of_finishes_redis_refuses_answers_each_and_the_jobs_stay_held(
        ctx: ServerContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn's finishes whose call Redis refuses: each answers INTERNAL_ERROR not-run, the
    jobs stay reserved by the worker (a later finish of theirs answers FINISHED) and no END
    was sent for them."""
    worker, caller = await _push_worker(ctx, 2), Client(ctx)
    caller.send(_call(1) + _call(2))
    await caller.until(lambda o: o.count(b"INSERTED") == 2)
    await worker.until(lambda o: o.count(b"RESERVED") == 2)
    caller.transport.out.clear()
    worker.transport.out.clear()
    real = ctx.store.finish_many
    monkeypatch.setattr(ctx.store, "finish_many", _refused)
    worker.send(b"finish 1 1\r\na\r\nfinish 2 1\r\nb\r\n")
    await worker.expect(b"INTERNAL_ERROR not-run\r\nINTERNAL_ERROR not-run\r\n")
    assert caller.transport.out == b""
    monkeypatch.setattr(ctx.store, "finish_many", real)
    worker.send(b"finish 1 1\r\na\r\nfinish 2 1\r\nb\r\n")
    await worker.expect(b"FINISHED\r\nFINISHED\r\n")
    await caller.until(lambda o: b"END 1 finished 1\r\na\r\n" in o
                       and b"END 2 finished 1\r\nb\r\n" in o)
