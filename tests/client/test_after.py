"""The bundled client's side of dependencies: put_with(after=...) holds a job until its parents
finished (a consume() handler's return value finishes them), UnknownParent for an id the server
does not know, and the arguments checked before anything is sent."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.client_support import WAIT_S, connected
from tests.support.servers import ServerProcess
from tubeq.client import Client, Job, TimedOut, UnknownParent

pytestmark = pytest.mark.timeout(60)


async def test_a_fan_in_child_runs_after_the_handlers_finished_every_parent(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    async with connected(*client_tubeq.address, tube_name) as producer, \
            Client(*client_tubeq.address) as worker:
        parents = await producer.put_many([b"%d" % i for i in range(5)])
        child = await producer.put_with(b"sum", after=parents)
        assert child.inserted
        consumer = worker.consume(tube_name, concurrency=2)
        seen: list[bytes] = []

        async def handler(job: Job) -> bytes | None:
            seen.append(job.body)
            if job.id == child.id:  # the child reads its parents' results
                results = [(await producer.wait(p, timeout=1)) for p in parents]
                assert results == [b"%d!" % i for i in range(5)]
                return None
            return job.body + b"!"

        running = asyncio.ensure_future(consumer.run(handler))
        try:
            async with asyncio.timeout(WAIT_S):
                while b"sum" not in seen:
                    await asyncio.sleep(0.02)
        finally:
            consumer.stop()
            await running
        assert seen[-1] == b"sum" and sorted(seen[:-1]) == [b"%d" % i for i in range(5)]


async def test_an_unknown_parent_is_refused_and_nothing_is_stored(
        client_tubeq: ServerProcess, tube_name: str) -> None:
    async with connected(*client_tubeq.address, tube_name) as client:
        with pytest.raises(UnknownParent) as refused:
            await client.put_with(b"x", after=[987654321])
        assert refused.value.parent == 987654321
        with pytest.raises(TimedOut):
            await client.reserve_with_timeout(0)
        for bad in ([], [0], [-1], [2**64], list(range(1, 1002))):
            with pytest.raises(ValueError):
                await client.put_with(b"x", after=bad)
