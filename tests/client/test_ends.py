"""The bundled client's side of jobs that answer: Job.finish and Job.fail, Client.wait and
Client.call (request/reply in one round trip), and consume()'s handler whose return value
answers the job; against tubeq, and against beanstalkd where the behaviour must stay its own."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.client_support import WAIT_S, connected
from tests.support.servers import ServerProcess
from tubeq.client import (
    JSON,
    CallTimedOut,
    Client,
    ClientConnectionError,
    Job,
    JobNotFinished,
    NotFound,
    Progress,
    TimedOut,
    UnknownCommand,
)
from tubeq.client import client as client_module

pytestmark = pytest.mark.timeout(60)


async def test_a_call_gets_the_result_a_consumer_handler_returned(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    async with Client(*client_tubeq.address) as caller, Client(*client_tubeq.address) as worker:
        consumer = worker.consume(tube_name, concurrency=2)

        async def handler(job: Job) -> bytes:
            return job.body.upper()

        running = asyncio.ensure_future(consumer.run(handler))
        try:
            async with asyncio.timeout(WAIT_S):
                results = await asyncio.gather(*(caller.call(tube_name, b"job %d" % i,
                                                             timeout=10) for i in range(3)))
        finally:
            consumer.stop()
            await running
        assert results == [b"JOB 0", b"JOB 1", b"JOB 2"]
        assert caller._used == "default"  # a call leaves the used tube as it was


async def test_calls_of_one_client_are_in_flight_together(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    """One client, many calls at once (put-with notify-ms): every request reaches the worker
    before any is answered, which calls that each held the connection until their end could
    not do (the handler waits for all of them), and each caller gets its own result."""
    calls = 20
    async with Client(*client_tubeq.address) as caller, Client(*client_tubeq.address) as worker:
        consumer = worker.consume(tube_name, concurrency=calls)
        arrived: list[bytes] = []
        all_in = asyncio.Event()

        async def handler(job: Job) -> bytes:
            arrived.append(job.body)
            if len(arrived) == calls:
                all_in.set()
            await all_in.wait()
            return job.body.upper()

        running = asyncio.ensure_future(consumer.run(handler))
        try:
            async with asyncio.timeout(WAIT_S):
                results = await asyncio.gather(*(caller.call(tube_name, b"call %d" % i,
                                                             timeout=10) for i in range(calls)))
        finally:
            consumer.stop()
            await running
        assert results == [b"CALL %d" % i for i in range(calls)]


async def test_wait_and_call_say_how_a_job_ended_otherwise(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    async with connected(*client_tubeq.address, tube_name) as client, \
            connected(*client_tubeq.address, tube_name) as other:
        with pytest.raises(CallTimedOut) as timed_out:
            await client.call(tube_name, b"x", timeout=0.05)
        job_id = timed_out.value.job_id
        waiting = asyncio.ensure_future(other.wait(job_id, timeout=10))
        job = await client.reserve()
        assert job.id == job_id
        await job.fail("boom")  # tried again: the wait goes on
        job = await client.reserve()
        await job.bury()
        with pytest.raises(JobNotFinished) as ended:
            await waiting
        assert (ended.value.job_id, ended.value.how, ended.value.data) == (job_id, "buried",
                                                                          b"\nboom")
        with pytest.raises(NotFound):
            await client.wait(10 ** 9, timeout=0)
        living = await client.put(b"y")
        with pytest.raises(TimedOut):
            await client.wait_end(living, timeout=0)


async def test_finish_answers_a_wait_with_the_result(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    async with connected(*client_tubeq.address, tube_name) as client, \
            connected(*client_tubeq.address, tube_name) as caller:
        job_id = await client.put(b"x")
        waiting = asyncio.ensure_future(caller.wait(job_id, timeout=10))
        job = await client.reserve()
        await job.finish("done é")
        assert await waiting == "done é".encode()
        end = await caller.wait_end(job_id, timeout=0)
        assert (end.id, end.how, end.data) == (job_id, "finished", "done é".encode())


async def test_on_beanstalkd_a_handlers_return_value_still_deletes(
        client_beanstalkd: ServerProcess, tube_name: str) -> None:
    async with connected(*client_beanstalkd.address, tube_name) as admin, \
            Client(*client_beanstalkd.address) as worker:
        await admin.put(b"x")
        consumer = worker.consume(tube_name, push=False)

        async def handler(job: Job) -> bytes:
            consumer.stop()
            return b"result"

        async with asyncio.timeout(WAIT_S):
            await consumer.run(handler)
        stats = await admin.stats_tube(tube_name)
        assert (stats["cmd-delete"], stats["current-jobs-ready"]) == (1, 0)
        with pytest.raises(UnknownCommand):
            await admin.wait(1, timeout=0)


@pytest.mark.parametrize("how", ["auto_touch", "push"])
async def test_a_cancel_reaches_the_handler_of_a_job_in_progress(
        client_tubeq: ServerProcess, tube_name: str, how: str) -> None:
    """auto_touch hears CANCELLED at its next touch, and a push consumer at once (it asks for
    cancel notices: push ... cancels=1, so a TTR of 600 s is never waited for); either cancels
    the handler's task; the job is gone, never run again, and the consumer goes on with the
    next job."""
    async with connected(*client_tubeq.address, tube_name) as admin, \
            Client(*client_tubeq.address) as worker:
        ttr = 2 if how == "auto_touch" else 600  # auto_touch touches every 0.5 s
        first = await admin.put(b"long", ttr=ttr)
        started, cancelled = asyncio.Event(), asyncio.Event()
        seen: list[bytes] = []
        consumer = worker.consume(tube_name, concurrency=1, auto_touch=how == "auto_touch",
                                  push=how == "push")

        async def handler(job: Job) -> bytes:
            seen.append(job.body)
            if job.body == b"long":
                started.set()
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled.set()
                    raise
            consumer.stop()
            return b"ok"

        running = asyncio.ensure_future(consumer.run(handler))
        async with asyncio.timeout(WAIT_S):
            await started.wait()
            await admin.cancel(first)
            await cancelled.wait()
            second = await admin.put(b"next")
            await running
        assert seen == [b"long", b"next"]
        with pytest.raises(NotFound):
            await admin.peek(first)
        assert await admin.wait(second, timeout=5) == b"ok"
        with pytest.raises(NotFound):
            await admin.cancel(first)


async def test_a_caller_follows_a_jobs_progress_to_its_result(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    async with connected(*client_tubeq.address, tube_name) as worker, \
            Client(*client_tubeq.address) as caller:
        job_id = await worker.put(b"x")
        job = await worker.reserve()
        seen: list[bytes] = []

        async def follow() -> bytes:
            after = 0
            while True:
                got = await caller.wait_end(job_id, timeout=10, progress_after=after)
                if isinstance(got, Progress):
                    seen.append(got.data)
                    after = got.seq
                    continue
                return got.data

        following = asyncio.ensure_future(follow())
        for step in (b"1/3", b"2/3"):
            await job.progress(step)
            await asyncio.sleep(0.2)
        await job.finish(b"3/3")
        assert await following == b"3/3"
        assert seen == [b"1/3", b"2/3"]


async def test_a_result_too_big_for_the_server_fails_the_job_with_that_reason(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    """The server refuses the result (past -z): the job is failed with the reason, once, not
    run again and again; a caller hears how it went."""
    async with connected(*client_tubeq.address, tube_name) as admin, \
            Client(*client_tubeq.address) as worker:
        job_id = (await admin.put_with(b"x", max_tries=1)).id
        runs = 0
        consumer = worker.consume(tube_name, concurrency=1)

        async def handler(job: Job) -> bytes:
            nonlocal runs
            runs += 1
            consumer.stop()
            return b"r" * 70_000  # past the server's 65,535-byte limit

        async with asyncio.timeout(WAIT_S):
            await consumer.run(handler)
        with pytest.raises(JobNotFinished) as ended:
            await admin.wait(job_id, timeout=5)
        assert ended.value.how == "buried" and b"result too big" in ended.value.data
        assert runs == 1


async def test_json_values_through_a_call_a_consumer_and_a_wait(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    """codec=JSON: a call sends a value and gets one back; the consumer's handler returns a
    value (None still deletes, with no result); wait decodes a result too."""
    async with Client(*client_tubeq.address) as caller, Client(*client_tubeq.address) as worker:
        consumer = worker.consume(tube_name, concurrency=2, codec=JSON)

        async def handler(job: Job) -> object:
            asked = JSON.decode(job.body)
            return None if asked == "nothing" else {"sum": sum(asked["n"]), "é": True}

        running = asyncio.ensure_future(consumer.run(handler))
        try:
            async with asyncio.timeout(WAIT_S):
                assert await caller.call(tube_name, {"n": [1, 2, 3]}, timeout=10,
                                         codec=JSON) == {"sum": 6, "é": True}
                with pytest.raises(JobNotFinished) as ended:
                    await caller.call(tube_name, "nothing", timeout=10, codec=JSON)
                assert ended.value.how == "deleted"
                with pytest.raises(CallTimedOut):  # not a consumer's tube: nobody answers
                    await caller.call("nobody-" + tube_name, [1], timeout=0.1, codec=JSON)
        finally:
            consumer.stop()
            await running
    async with connected(*client_tubeq.address, tube_name) as other:
        job_id = await other.put(b"{}")
        job = await other.reserve_with_timeout(5)
        assert job.id == job_id
        await job.finish(JSON.encode([1, "two", None]))
        assert await other.wait(job_id, timeout=5, codec=JSON) == [1, "two", None]


async def test_a_server_that_does_not_answer_times_a_call_out_and_a_cancel_stays_a_cancel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing answers (a server that reads and never writes): a call raises CallTimedOut
    (no job id: stored or not, unknown), a wait TimedOut, once their timeout and the grace
    ran out; a call whose task is cancelled raises CancelledError, not a timeout."""
    monkeypatch.setattr(client_module, "REPLY_GRACE_S", 0.05)

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    silent = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    try:
        async with Client("127.0.0.1", port) as client, asyncio.timeout(WAIT_S):
            with pytest.raises(CallTimedOut) as timed_out:
                await client.call("t", b"x", timeout=0.05)
            assert timed_out.value.job_id is None
            with pytest.raises(TimedOut):
                await client.wait(1, timeout=0.05)
            calling = asyncio.ensure_future(client.call("t", b"y", timeout=30))
            await asyncio.sleep(0.05)
            calling.cancel()
            with pytest.raises(asyncio.CancelledError):
                await calling
    finally:
        silent.close()
        await silent.wait_closed()


async def _fake_server(answer: bytes, *, then_close: bool) -> asyncio.Server:
    """A server that answers every command line with ``answer`` (and the body after a
    put-with), then closes the connection or stays silent."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            await reader.readexactly(int(line.split()[4]) + 2)
            writer.write(answer)
            await writer.drain()
            if then_close:
                break
        if then_close:
            writer.close()
            return
        while await reader.read(65536):
            pass
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def test_a_call_whose_end_never_comes_times_out_with_its_job_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "REPLY_GRACE_S", 0.05)
    server = await _fake_server(b"INSERTED 7\r\n", then_close=False)
    try:
        async with Client("127.0.0.1", server.sockets[0].getsockname()[1]) as client, \
                asyncio.timeout(WAIT_S):
            with pytest.raises(CallTimedOut) as timed_out:
                await client.call("t", b"x", timeout=0.05)
            assert timed_out.value.job_id == 7
    finally:
        server.close()
        await server.wait_closed()


async def test_calls_in_flight_fail_when_the_connection_goes() -> None:
    server = await _fake_server(b"INSERTED 7\r\n", then_close=True)
    try:
        async with Client("127.0.0.1", server.sockets[0].getsockname()[1]) as client, \
                asyncio.timeout(WAIT_S):
            with pytest.raises(ClientConnectionError):
                await client.call("t", b"x", timeout=30)
    finally:
        server.close()
        await server.wait_closed()


async def test_calls_of_one_key_with_different_timeouts_each_get_their_own_end(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    """Two calls of one dedupe key share the job: the one whose time runs out first hears
    timed-out, the other the result (the frames come in the order the server hears them)."""
    async with Client(*client_tubeq.address) as caller, \
            connected(*client_tubeq.address, tube_name) as worker, asyncio.timeout(WAIT_S):
        long = asyncio.ensure_future(caller.call(tube_name, b"x", key="k1", timeout=10))
        await asyncio.sleep(0.1)
        with pytest.raises(CallTimedOut) as timed_out:
            await caller.call(tube_name, b"y", key="k1", timeout=0.3)
        job = await worker.reserve()
        assert timed_out.value.job_id == job.id
        await job.finish(b"done")
        assert await long == b"done"


async def test_a_call_to_a_server_without_notify_ms_holds_its_connection_instead() -> None:
    """An older tubeq refuses notify-ms (BAD_OPTION, nothing stored): the call is sent again
    with wait-ms, and the client's calls use wait-ms from then on."""
    lines: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            lines.append(line)
            await reader.readexactly(int(line.split()[4]) + 2)
            if b"notify-ms=" in line:
                writer.write(b"BAD_OPTION notify-ms\r\n")
            else:
                writer.write(b"ENDED %d finished 2\r\nok\r\n" % len(lines))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        async with Client("127.0.0.1", server.sockets[0].getsockname()[1]) as client, \
                asyncio.timeout(WAIT_S):
            assert await client.call("t", b"x", timeout=5) == b"ok"
            assert await client.call("t", b"y", timeout=5) == b"ok"
        assert [b"notify-ms=" in line for line in lines] == [True, False, False]
    finally:
        server.close()
        await server.wait_closed()


def test_a_client_that_calls_again_in_a_new_event_loop_is_answered(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    """One Client used by two asyncio.run()s in turn, closed at the end of the first: its call
    in the second is answered (a review found a call's timer put on the first, closed loop)."""
    caller = Client(*client_tubeq.address)

    async def one(n: int) -> bytes:
        async with Client(*client_tubeq.address) as worker:
            consumer = worker.consume(tube_name, concurrency=1)

            async def handler(job: Job) -> bytes:
                return job.body.upper()

            running = asyncio.ensure_future(consumer.run(handler))
            try:
                result: bytes = await caller.call(tube_name, b"call %d" % n, timeout=10)
                return result
            finally:
                consumer.stop()
                await running
                await caller.aclose()

    assert asyncio.run(one(1)) == b"CALL 1"
    assert asyncio.run(one(2)) == b"CALL 2"
