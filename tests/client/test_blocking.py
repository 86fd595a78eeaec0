"""BlockingClient (tubeq.client.blocking): put, call and wait from code without an event loop,
against tubeq (and put against beanstalkd); a worker runs in a thread of its own."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support.servers import ServerProcess
from tubeq.client import (
    BlockingClient,
    CallTimedOut,
    Client,
    ClientConnectionError,
    JobNotFinished,
    NotFound,
    TimedOut,
)
from tubeq.client.ends import REPLY_GRACE_S

pytestmark = pytest.mark.timeout(60)


@contextmanager
def worker(server: ServerProcess, tube: str, jobs: int,
           settle: str = "finish") -> Iterator[None]:
    """A thread that reserves ``jobs`` jobs of ``tube`` and finishes each (or buries it)."""
    async def run() -> None:
        async with Client(*server.address) as client:
            await client.watch(tube)
            await client.ignore("default")  # other tests' jobs are not this worker's
            for _ in range(jobs):
                job = await client.reserve_with_timeout(20)
                if settle == "finish":
                    await job.finish(b"re: " + job.body)
                else:
                    await job.bury()

    thread = threading.Thread(target=asyncio.run, args=(run(),))
    thread.start()
    try:
        yield
    finally:
        thread.join(30)


def test_call_put_and_wait_without_an_event_loop(client_tubeq: ServerProcess,
                                                 tube_name: str) -> None:
    with BlockingClient(*client_tubeq.address) as client:
        with worker(client_tubeq, tube_name, 3):
            assert client.call(tube_name, b"one", timeout=10) == b"re: one"
            assert client.call(tube_name, "two", timeout=10) == b"re: two"
            job_id = client.put(b"three", tube=tube_name)
            assert client.wait(job_id, timeout=10) == b"re: three"
        end = client.wait_end(job_id, timeout=0)
        assert (end.id, end.how, end.data) == (job_id, "finished", b"re: three")
        with pytest.raises(CallTimedOut) as timed_out:
            client.call(tube_name, b"nobody", timeout=0.05)
        assert timed_out.value.job_id is not None
        with pytest.raises(TimedOut):
            client.wait(timed_out.value.job_id, timeout=0)
        with worker(client_tubeq, tube_name, 1, settle="bury"), \
                pytest.raises(JobNotFinished) as ended:
            client.wait(timed_out.value.job_id, timeout=10)
        assert ended.value.how == "buried"
        with pytest.raises(NotFound):
            client.wait(10 ** 12, timeout=0)


def test_a_server_that_does_not_answer_in_time_costs_the_connection_not_the_caller(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    """A stopped server: the call gives up at its timeout plus REPLY_GRACE_S, closes its
    connection (a late reply must not answer the next command), and the next call reconnects."""
    client = BlockingClient(*client_tubeq.address)
    client.put(b"warm", tube=tube_name)  # connected, and tube_name used
    client_tubeq.send_signal(signal.SIGSTOP)
    began = time.monotonic()
    try:
        with pytest.raises(CallTimedOut) as timed_out:
            client.call(tube_name, b"x", timeout=0.1)
    finally:
        client_tubeq.send_signal(signal.SIGCONT)
    assert timed_out.value.job_id is None  # no answer: stored or not, unknown
    assert time.monotonic() - began < 0.1 + REPLY_GRACE_S + 2
    assert client._sock is None
    assert client.put(b"after", tube=tube_name) > 0  # a new connection
    client.close()


def test_put_works_against_beanstalkd_and_a_refused_connection_is_one_error(
        client_beanstalkd: ServerProcess, tube_name: str) -> None:
    with BlockingClient(*client_beanstalkd.address) as client:
        assert client.put(b"x", tube=tube_name) > 0
    with pytest.raises(ClientConnectionError):
        BlockingClient("127.0.0.1", 1).connect()
