"""consume(): success deletes, failure releases with backoff then buries, auto_touch, the
concurrency bound, and stopping or cancelling with no job left reserved.

Every test runs three ways: beanstalkd 1.12 with pipelined reserves, tubeq with pipelined
reserves (``push=False``: the fallback path), and tubeq with the push extension (``push=True``).
Each checks the server's view from a separate connection.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from tests.support.client_support import WAIT_S, Proxy, connected, eventually, tube_settles
from tests.support.servers import ServerProcess
from tubeq.client import Client, Consumer, Job, NotFound, UnknownCommand
from tubeq.client.consume import _STOP_ON_SIGNALS, default_connections

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Target:
    server: ServerProcess
    push: bool

    @property
    def mode(self) -> str:
        return "push" if self.push else "reserve"

    def consume(self, client: Client, tube: str, **options: object) -> Consumer:
        return client.consume(tube, push=self.push, **options)  # type: ignore[arg-type]


@pytest.fixture(params=[("beanstalkd", False), ("tubeq", False), ("tubeq", True)],
                ids=["beanstalkd-reserve", "tubeq-reserve", "tubeq-push"])
def target(request: pytest.FixtureRequest) -> Target:
    kind, push = request.param
    return Target(request.getfixturevalue(f"client_{kind}"), push)


@pytest.fixture
async def admin(target: Target, tube_name: str) -> AsyncIterator[Client]:
    """A separate connection that puts jobs into the test's tube and reads its stats."""
    async with connected(*target.server.address, tube_name) as client:
        yield client


async def test_success_deletes(target: Target, admin: Client, tube_name: str) -> None:
    bodies = {await admin.put(b"job %d" % i): b"job %d" % i for i in range(6)}
    ids = list(bodies)
    seen: list[int] = []
    client = Client(*target.server.address)
    async with asyncio.timeout(WAIT_S), \
            target.consume(client, tube_name, concurrency=3, connections=3) as jobs:
        async for job in jobs:
            async with job:
                assert job.body == bodies[job.id]
                assert job.tube == tube_name and job.reserved
                seen.append(job.id)
            if len(seen) == len(ids):
                jobs.stop()
        assert jobs.modes == [target.mode] * 3
    assert sorted(seen) == ids
    stats = await tube_settles(admin, tube_name, current_jobs_reserved=0)
    assert (stats["current-jobs-ready"], stats["cmd-delete"], stats["total-jobs"]) == (0, 6, 6)


async def test_run_respects_the_concurrency_bound(target: Target, admin: Client,
                                                  tube_name: str) -> None:
    total, concurrency = 20, 4
    for i in range(total):
        await admin.put(b"%d" % i)
    active = peak = done = 0
    reserved_seen: list[int] = []
    async with Client(*target.server.address) as client:
        consumer = target.consume(client, tube_name, concurrency=concurrency, connections=2)

        async def handler(job: Job) -> None:
            nonlocal active, peak, done
            active += 1
            peak = max(peak, active)
            assert consumer.held <= concurrency
            reserved_seen.append(int((await admin.stats_tube(tube_name))["current-jobs-reserved"]))
            await asyncio.sleep(0.01)
            active -= 1
            done += 1
            if done == total:
                consumer.stop()

        async with asyncio.timeout(WAIT_S):
            await consumer.run(handler)
    assert done == total
    assert 1 < peak <= concurrency
    assert max(reserved_seen) <= concurrency
    stats = await tube_settles(admin, tube_name, current_jobs_reserved=0)
    assert (stats["cmd-delete"], stats["current-jobs-ready"]) == (total, 0)


async def test_a_job_put_once_a_full_backlog_drained_is_handled_at_once(
        target: Target, admin: Client, tube_name: str) -> None:
    """A backlog that fills every credit, handled and acknowledged until the tube is empty,
    then a quiet spell and one more job: it is handled at once, well inside the server's
    10 s re-check of a waiting connection (push: the take the last acknowledgements send
    comes back empty, and the connection must still hear the next put; it once did not)."""
    concurrency = 4
    for i in range(3 * concurrency):
        await admin.put(b"backlog %d" % i)
    handled: asyncio.Queue[bytes] = asyncio.Queue()
    async with Client(*target.server.address) as client:
        consumer = target.consume(client, tube_name, concurrency=concurrency, connections=1)

        async def handler(job: Job) -> None:
            await handled.put(job.body)

        run = asyncio.ensure_future(consumer.run(handler))
        try:
            async with asyncio.timeout(WAIT_S):
                for _ in range(3 * concurrency):
                    assert (await handled.get()).startswith(b"backlog ")
            await tube_settles(admin, tube_name, current_jobs_reserved=0)
            await asyncio.sleep(0.3)  # nothing queued: the connection waits
            await admin.put(b"after")
            assert await asyncio.wait_for(handled.get(), 3.0) == b"after"
        finally:
            consumer.stop()
            await run
    stats = await tube_settles(admin, tube_name, current_jobs_reserved=0)
    assert (stats["cmd-delete"], stats["current-jobs-ready"]) == (3 * concurrency + 1, 0)


async def test_failure_releases_with_backoff_then_buries(target: Target, admin: Client,
                                                         tube_name: str) -> None:
    """beanstalkd: the consumer releases with its backoff, then buries. tubeq: it fails the
    job with the exception's text and its policy (max-tries 4, backoff 1 s doubling up to
    3 s), and the server delays it (by its backoff less a jitter of up to half) and buries
    it with reason max-tries, the error kept for waiters and stats-job."""
    job_id = await admin.put(b"flaky", pri=7)
    seen: list[tuple[str, int, int, int]] = []
    client = Client(*target.server.address)
    async with asyncio.timeout(WAIT_S), \
            target.consume(client, tube_name, concurrency=2, max_tries=4, backoff_base=1,
                           backoff_max=3) as jobs:
        async for job in jobs:
            async with job:
                raise RuntimeError("the job fails")  # logged and swallowed
            # here the job has been released (or buried): look at it from outside
            stats = await admin.stats_job(job.id)
            seen.append((str(stats["state"]), int(stats["delay"]),
                         int(stats["reserves"]), int(stats["pri"])))
            if stats["state"] == "buried":
                jobs.stop()
            else:
                await admin.kick_job(job.id)  # end the backoff early
    stats = await admin.stats_job(job_id)
    if target.server.kind == "beanstalkd":
        assert seen == [("delayed", 1, 1, 7), ("delayed", 2, 2, 7), ("delayed", 3, 3, 7),
                        ("buried", 3, 4, 7)]
        assert (stats["releases"], stats["buries"]) == (3, 1)
    else:
        assert [(state, reserves, pri) for state, _, reserves, pri in seen] == [
            ("delayed", 1, 7), ("delayed", 2, 7), ("delayed", 3, 7), ("buried", 4, 7)]
        assert (stats["releases"], stats["buries"]) == (0, 1)
        ended = await admin.wait_end(job_id, 0)  # lies buried: how, why and the error
        assert (ended.how, ended.data) == ("buried", b"max-tries\nRuntimeError: the job fails")
    await admin.delete(job_id)


async def test_auto_touch_keeps_a_short_ttr_job_alive(target: Target, admin: Client,
                                                      tube_name: str) -> None:
    job_id = await admin.put(b"slow", ttr=1)
    client = Client(*target.server.address)
    async with asyncio.timeout(WAIT_S), \
            target.consume(client, tube_name, concurrency=1, auto_touch=True) as jobs:
        async for job in jobs:
            async with job:
                await asyncio.sleep(2.2)  # more than twice its TTR
                stats = await admin.stats_job(job.id)
                assert (stats["state"], stats["reserves"], stats["timeouts"]) == (
                    "reserved", 1, 0)
            jobs.stop()
    with pytest.raises(NotFound):  # it was deleted: the block ended normally
        await admin.stats_job(job_id)


async def test_cancel_while_iterating_leaves_no_job_reserved(
        target: Target, admin: Client, tube_name: str) -> None:
    for i in range(6):
        await admin.put(b"%d" % i)
    client = Client(*target.server.address)
    consumer = target.consume(client, tube_name, concurrency=3)
    started = asyncio.Event()

    async def work() -> None:
        async for job in consumer:
            async with job:
                started.set()
                await asyncio.Event().wait()  # never finishes

    task = asyncio.ensure_future(work())
    async with asyncio.timeout(WAIT_S):
        await started.wait()
    await eventually(lambda: _held(consumer, 3), "the consumer holds 3 jobs")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stats = await tube_settles(admin, tube_name, current_jobs_reserved=0)
    assert (stats["current-jobs-ready"], stats["cmd-delete"]) == (6, 0)
    await _delete_all(admin, tube_name)


async def test_cancel_run_leaves_no_job_reserved(target: Target, admin: Client,
                                                 tube_name: str) -> None:
    for i in range(6):
        await admin.put(b"%d" % i)
    started: set[int] = set()
    three = asyncio.Event()

    async def handler(job: Job) -> None:
        started.add(job.id)
        if len(started) == 3:
            three.set()
        await asyncio.Event().wait()

    async with Client(*target.server.address) as client:
        consumer = target.consume(client, tube_name, concurrency=3)
        task = asyncio.ensure_future(consumer.run(handler))
        async with asyncio.timeout(WAIT_S):
            await three.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    stats = await tube_settles(admin, tube_name, current_jobs_reserved=0)
    assert (stats["current-jobs-ready"], stats["cmd-delete"]) == (6, 0)
    stats = await admin.stats_job(min(started))
    assert (stats["releases"], stats["buries"]) == (0, 0)  # put back, not failed
    await _delete_all(admin, tube_name)


async def test_stop_lets_handed_out_jobs_finish_and_puts_back_the_rest(
        target: Target, admin: Client, tube_name: str) -> None:
    for i in range(8):
        await admin.put(b"%d" % i)
    gate = asyncio.Event()
    started: list[int] = []
    finished: list[int] = []

    async def handler(job: Job) -> None:
        started.append(job.id)
        await gate.wait()
        finished.append(job.id)

    async with Client(*target.server.address) as client:
        consumer = target.consume(client, tube_name, concurrency=3)
        task = asyncio.ensure_future(consumer.run(handler))
        await eventually(lambda: _count(started, 3), "3 handlers are running")
        consumer.stop()
        gate.set()
        async with asyncio.timeout(WAIT_S):
            await task
    assert sorted(finished) == sorted(started) and len(started) >= 3
    stats = await tube_settles(admin, tube_name, current_jobs_reserved=0)
    assert stats["cmd-delete"] == len(finished)
    assert stats["current-jobs-ready"] == 8 - len(finished)
    await _delete_all(admin, tube_name)


async def test_a_lost_connection_is_reopened(target: Target, admin: Client,
                                             tube_name: str) -> None:
    seen: list[bytes] = []
    async with Proxy(*target.server.address) as proxy, asyncio.timeout(WAIT_S):
        client = Client("127.0.0.1", proxy.port)  # never connects itself: the consumer does
        consumer = target.consume(client, tube_name, concurrency=1)
        async with consumer:
            await admin.put(b"before")
            async for job in consumer:
                async with job:
                    seen.append(job.body)
                if len(seen) == 1:
                    proxy.cut()
                    # Put the next job once the consumer is back (the admin and the new
                    # connection watch the tube): a job granted at the very moment a connection
                    # drops is a server-side race, not what this test is about.
                    await eventually(lambda: _watchers(admin, tube_name, 2),
                                     "the consumer reconnected")
                    await admin.put(b"after")
                else:
                    consumer.stop()
        assert proxy.accepted == 2  # the consumer's connection, then its reconnection
    assert seen == [b"before", b"after"]
    await tube_settles(admin, tube_name, current_jobs_reserved=0, cmd_delete=2)


async def test_push_required_but_unknown_raises(client_beanstalkd: ServerProcess,
                                                tube_name: str) -> None:
    async with Client(*client_beanstalkd.address) as client, asyncio.timeout(WAIT_S):
        with pytest.raises(UnknownCommand):
            async for _ in client.consume(tube_name, push=True):
                pass


async def test_push_by_default_when_the_server_has_it(any_server: ServerProcess,
                                                      tube_name: str) -> None:
    expected = "push" if any_server.kind == "tubeq" else "reserve"
    async with connected(*any_server.address, tube_name) as admin, \
            Client(*any_server.address) as client, asyncio.timeout(WAIT_S):
        await admin.put(b"x")
        async with client.consume(tube_name, concurrency=4, connections=2) as jobs:
            async def decided() -> bool:  # (each connection decides as it connects)
                return None not in jobs.modes

            async for job in jobs:
                async with job:
                    pass
                await eventually(decided, "both connections chose how to get jobs")
                jobs.stop()
            assert jobs.modes == [expected, expected]
        await tube_settles(admin, tube_name, current_jobs_reserved=0, cmd_delete=1)


async def _watchers(admin: Client, tube: str, count: int) -> bool:
    return (await admin.stats_tube(tube))["current-watching"] == count


async def _held(consumer: Consumer, count: int) -> bool:
    return consumer.held == count


async def _count(items: list[int], count: int) -> bool:
    return len(items) >= count


async def _delete_all(admin: Client, tube: str) -> None:
    while True:
        try:
            job = await admin.peek_ready()
        except NotFound:
            return
        await admin.delete(job.id)


# A reserve timeout far beyond the test's own bound (WAIT_S): a delete queued behind a waiting
# reserve on beanstalkd is answered only when that reserve ends, i.e. after RESERVE_WAIT_S.
RESERVE_WAIT_S = 30


async def test_acks_are_not_held_behind_a_waiting_reserve(client_beanstalkd: ServerProcess,
                                                          tube_name: str) -> None:
    """beanstalkd answers a connection's commands in order: every delete of a drained queue is
    answered while the reserve timeout (30 s) is far from over, so no reserve was waiting in
    front of it. The old consumer sent its waiting reserve again right after each job came and
    before the job's delete, so the last deletes of the queue waited the full 30 s."""
    assert WAIT_S < RESERVE_WAIT_S / 2
    total = 12
    async with connected(*client_beanstalkd.address, tube_name) as admin:
        for i in range(total):
            await admin.put(b"%d" % i)
        deleted: list[int] = []
        async with Client(*client_beanstalkd.address) as client:
            consumer = client.consume(tube_name, concurrency=4, connections=1,
                                      reserve_timeout=RESERVE_WAIT_S)
            async with asyncio.timeout(WAIT_S), consumer as jobs:
                async for job in jobs:
                    async with job:  # ends once the delete was answered
                        pass
                    deleted.append(job.id)
                    if len(deleted) == total:
                        jobs.stop()
                assert jobs.modes == ["reserve"]
        assert len(deleted) == total
        stats = await admin.stats_tube(tube_name)
        assert (stats["cmd-delete"], stats["current-jobs-ready"],
                stats["current-jobs-reserved"]) == (total, 0, 0)


def test_a_consumer_opens_one_connection_per_16_jobs_in_flight_at_most_4() -> None:
    assert [default_connections(n) for n in (1, 16, 17, 32, 48, 64, 1000)] == \
        [1, 1, 2, 2, 3, 4, 4]
    client = Client("127.0.0.1", 1)  # never connected: lanes are made, not opened
    assert len(client.consume("t", concurrency=32)._lanes) == 2
    assert len(client.consume("t", concurrency=32, connections=4)._lanes) == 4
    assert len(client.consume("t", concurrency=3, connections=8)._lanes) == 3


async def test_run_holds_prefetched_jobs_back_from_its_handlers(target: Target, admin: Client,
                                                                tube_name: str) -> None:
    """concurrency 2 + prefetch 6: up to eight jobs held, never more than two handlers at
    once (run's own bound; the connections' credits allow all eight)."""
    total = 12
    for i in range(total):
        await admin.put(b"%d" % i)
    active = peak = done = 0
    async with Client(*target.server.address) as client:
        consumer = target.consume(client, tube_name, concurrency=2, prefetch=6)

        async def handler(job: Job) -> None:
            nonlocal active, peak, done
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.02)
            active -= 1
            done += 1
            if done == total:
                consumer.stop()

        async with asyncio.timeout(WAIT_S):
            await consumer.run(handler)
    assert done == total
    assert peak == 2


async def test_stop_gives_back_the_prefetched_jobs_at_once(any_server: ServerProcess,
                                                           tube_name: str) -> None:
    """concurrency 1 + prefetch 3: four jobs held, one handed out. stop() gives the other three
    back at once (tubeq: hand-back, no release counted; beanstalkd: a release at their own
    priority) while the handed one still runs, and it is deleted when its block ends."""
    tubeq = any_server.kind == "tubeq"
    async with connected(*any_server.address, tube_name) as admin, \
            Client(*any_server.address) as client, asyncio.timeout(WAIT_S):
        ids = [await admin.put(b"job", pri=7) for _ in range(4)]
        async with client.consume(tube_name, concurrency=1, prefetch=3, stop_signals=()) as jobs:
            async def held_all() -> bool:
                return jobs.held == 4

            async for job in jobs:
                await eventually(held_all, "the consumer holds four jobs")
                jobs.stop()

                async def back() -> bool:
                    return (await admin.stats_tube(tube_name))["current-jobs-ready"] == 3

                await eventually(back, "the three not handed out are ready again")
                async with job:
                    pass
        for other in ids:
            if other == job.id:
                continue
            stats = await admin.stats_job(other)
            assert (stats["state"], stats["pri"], stats["releases"]) == (
                "ready", 7, 0 if tubeq else 1)
        await tube_settles(admin, tube_name, current_jobs_reserved=0, cmd_delete=1)


async def test_a_quiet_from_the_server_stops_the_consumer(client_tubeq: ServerProcess,
                                                          tube_name: str) -> None:
    """quiet all (an operator's): the consumer's push connections hear QUIET, it stops and
    gives back what it held; the iteration ends."""
    async with connected(*client_tubeq.address, tube_name) as admin, \
            Client(*client_tubeq.address) as client, asyncio.timeout(WAIT_S):
        for _ in range(3):
            await admin.put(b"job")
        seen = []
        async for job in client.consume(tube_name, concurrency=1, prefetch=2, stop_signals=()):
            seen.append(job.id)
            await admin.quiet()
            async with job:
                pass
        assert len(seen) == 1
        await tube_settles(admin, tube_name, current_jobs_reserved=0, current_jobs_ready=2,
                           cmd_delete=1)


async def test_quiet_checks_its_arguments_before_sending() -> None:
    client = Client("127.0.0.1", 1)  # never connected: nothing is sent
    for kwargs in ({"tube": "a", "conn": "b"}, {"conn": "a b"}, {"conn": ""},
                   {"tube": "bad name"}):
        with pytest.raises(ValueError):
            await client.quiet(**kwargs)
    with pytest.raises(ValueError):
        Consumer(client, "t", prefetch=-1)


async def test_stop_signals_stop_consumers_and_leave_an_applications_handler_alone() -> None:
    """The handler consume() installs stops every consumer registered for the signal and goes
    back to the default when the last one closes; a signal the application handles already
    is not taken over. (SIGUSR2 stands for SIGTERM: the test process must survive.)"""
    sig = signal.SIGUSR2
    assert signal.getsignal(sig) == signal.SIG_DFL
    loop = asyncio.get_running_loop()
    client = Client("127.0.0.1", 1)
    first, second = (Consumer(client, "t", stop_signals=(sig,)) for _ in range(2))
    _STOP_ON_SIGNALS.add(first)
    _STOP_ON_SIGNALS.add(second)
    assert signal.getsignal(sig) != signal.SIG_DFL  # handled: the kill below is safe
    os.kill(os.getpid(), sig)
    await eventually(_async(lambda: first._stopping and second._stopping), "both stopped")
    await first.aclose()
    await second.aclose()  # (closing discards them)
    assert signal.getsignal(sig) == signal.SIG_DFL

    heard: list[int] = []
    loop.add_signal_handler(sig, heard.append, 1)
    try:
        third = Consumer(client, "t", stop_signals=(sig,))
        _STOP_ON_SIGNALS.add(third)
        os.kill(os.getpid(), sig)
        await eventually(_async(lambda: heard == [1]), "the application's handler ran")
        assert not third._stopping
        _STOP_ON_SIGNALS.discard(third)
        os.kill(os.getpid(), sig)  # still the application's
        await eventually(_async(lambda: heard == [1, 1]), "the application's handler ran again")
    finally:
        loop.remove_signal_handler(sig)


def _async(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def checked() -> bool:
        return check()

    return checked


MARK: contextvars.ContextVar[int] = contextvars.ContextVar("MARK", default=0)


async def test_handlers_that_never_suspend_each_run_in_a_context_of_their_own(
        target: Target, admin: Client, tube_name: str) -> None:
    """A context variable a handler sets is its own (the next handler, and the loop, do not
    see it)."""
    ids = [await admin.put(b"x") for _ in range(6)]
    seen: list[int] = []
    client = Client(*target.server.address)
    consumer = target.consume(client, tube_name, concurrency=3)

    async def handler(job: Job) -> None:
        seen.append(MARK.get())
        MARK.set(job.id)  # never suspends
        if len(seen) == len(ids):
            consumer.stop()

    async with asyncio.timeout(WAIT_S):
        await consumer.run(handler)
    assert seen == [0] * len(ids) and MARK.get() == 0
    stats = await tube_settles(admin, tube_name, current_jobs_reserved=0)
    assert stats["cmd-delete"] == len(ids)


async def test_a_handler_raising_cancelled_at_once_gives_its_job_back_and_the_loop_goes_on(
        target: Target, admin: Client, tube_name: str) -> None:
    """asyncio.CancelledError raised by a handler before it suspends is that handler's end,
    not the consumer's: the job goes back and the others run."""
    first = await admin.put(b"first")
    rest = [await admin.put(b"x") for _ in range(3)]
    done: list[int] = []
    tries: list[int] = []
    client = Client(*target.server.address)
    consumer = target.consume(client, tube_name, concurrency=1)

    async def handler(job: Job) -> None:
        tries.append(job.id)
        if job.id == first and tries.count(first) == 1:
            raise asyncio.CancelledError
        done.append(job.id)
        if len(done) == len(rest) + 1:
            consumer.stop()

    async with asyncio.timeout(WAIT_S):
        await consumer.run(handler)
    assert sorted(done) == sorted([first, *rest])  # the first ran again, once given back
    stats = await tube_settles(admin, tube_name, current_jobs_reserved=0)
    assert stats["current-jobs-ready"] == 0 and stats["cmd-delete"] == len(rest) + 1


async def test_a_handler_timeout_cancels_the_handler_not_the_consumer(
        target: Target, admin: Client, tube_name: str) -> None:
    """asyncio.timeout() in a handler cancels the task it entered in: the handler's own (the
    job fails and is buried, max_tries 1), never run()'s, which goes on with the others."""
    slow = await admin.put(b"slow")
    rest = [await admin.put(b"x") for _ in range(3)]
    done: list[int] = []
    client = Client(*target.server.address)
    consumer = target.consume(client, tube_name, concurrency=1, max_tries=1)

    async def handler(job: Job) -> None:
        if job.id == slow:
            async with asyncio.timeout(0.05):
                await asyncio.sleep(WAIT_S)
        done.append(job.id)
        if len(done) == len(rest):
            consumer.stop()

    async with asyncio.timeout(WAIT_S):
        await consumer.run(handler)
    assert sorted(done) == rest
    stats = await tube_settles(admin, tube_name, current_jobs_reserved=0)
    assert stats["current-jobs-buried"] == 1 and stats["cmd-delete"] == len(rest)


async def test_a_block_cancelled_while_its_delete_is_out_still_frees_its_job(
        target: Target, admin: Client, tube_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``async with job`` waits for its delete's answer; a block cancelled meanwhile leaves
    nobody to settle the job but the answer: when it comes the job is no longer held (its slot
    free), where it stayed held for good."""
    await admin.put(b"x")
    answer = asyncio.Event()
    original = Client._delete_many_on

    async def held_back(self: Client, link: object, ids: list[int]) -> list[bool]:
        await answer.wait()
        return await original(self, link, ids)  # type: ignore[arg-type]

    monkeypatch.setattr(Client, "_delete_many_on", held_back)
    client = Client(*target.server.address)
    async with asyncio.timeout(WAIT_S), target.consume(client, tube_name, concurrency=1) as jobs:
        job = await jobs.__anext__()

        async def block() -> None:
            async with job:
                pass

        blocked = asyncio.ensure_future(block())
        await asyncio.sleep(0.05)  # the delete is out: its answer held back
        assert not blocked.done()
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        assert jobs.held == 1
        answer.set()

        async def freed() -> bool:
            return jobs.held == 0

        await eventually(freed, "the job freed once its delete was answered")
        jobs.stop()
    stats = await tube_settles(admin, tube_name, current_jobs_reserved=0)
    assert stats["cmd-delete"] == 1
