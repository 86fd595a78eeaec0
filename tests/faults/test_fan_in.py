"""A fan-in through a fault: 1,000 parents (put-many, in three tubes) and one child put with
``after=`` all of them; workers on two tubeq processes finish the parents (the bundled client's
consumer, whose handler's return value finishes a job), and one of the processes is SIGKILLed
when about a third of them are done. On one Redis root and over four shards (the child's tube
and the parents' tubes then sit in different shards, so every end crosses shards).

Expected: the child is reserved exactly once (a second reserve times out), and only once every
parent has finished (the child's worker reads all 1,000 ends at that moment: each is
``finished``); a wait for the child, on a connection of the surviving process opened before the
kill, hears its end within its timeout; the surviving process's workers, connected before the
kill, finish the jobs the killed one held (after their TTR gives them back).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import ServerProcess, start_tubeq, unique_prefix
from tubeq.client import Client, Job, TimedOut
from tubeq.redisio.process import RedisProcess

PARENTS = 1000
PART_TUBES = 3
KILL_AFTER = PARENTS // 3
PARENT_TTR_S = 5
# Bounds of the test itself on two shared cores (the killed process's jobs come back after
# PARENT_TTR_S): never performance figures.
DONE_WITHIN_S = 60.0
WAIT_S = 90

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(params=[1, 4], ids=["one-root", "shards-4"])
def servers(redis: RedisProcess, tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    prefix = unique_prefix("tq-fan-in")
    flags = ("--shards", str(request.param))
    a = start_tubeq(redis.url, prefix, tmp_path / "logs", "tubeq-a", flags)
    b = start_tubeq(redis.url, prefix, tmp_path / "logs", "tubeq-b", flags)
    yield a, b
    for server in (a, b):
        server.stop()


async def _finish_parts(address: tuple[str, int], tubes: list[str], done: list[int]) -> None:
    """A worker process's consumers: each parent finished with its body as the result."""
    async with Client(*address) as client:
        async def answer(job: Job) -> bytes:
            done.append(job.id)
            return job.body

        await asyncio.gather(*(client.consume(tube, concurrency=4).run(answer)
                               for tube in tubes))


async def test_a_fan_in_of_1000_parents_runs_its_child_once_through_a_sigkill(
        servers: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = servers
    run = secrets.token_hex(3)
    tubes = [f"fan-part{i}-{run}" for i in range(PART_TUBES)]
    sum_tube = f"fan-sum-{run}"
    parents: list[int] = []
    async with Client(*a.address) as producer, Client(*a.address) as child_worker, \
            Client(*a.address) as waiter:
        for i, tube in enumerate(tubes):
            await producer.use(tube)
            share = PARENTS // PART_TUBES + (1 if i < PARENTS % PART_TUBES else 0)
            # a short TTR: the jobs the killed process held come back by it (reap.lua gives
            # back only what was handed to it unclaimed)
            parents += await producer.put_many([b"%d:%d" % (i, n) for n in range(share)],
                                               ttr=PARENT_TTR_S)
        await producer.use(sum_tube)
        child = await producer.put_with(b"sum", after=parents)
        assert child.inserted
        await child_worker.watch(sum_tube)
        await child_worker.ignore("default")
        waiting = asyncio.ensure_future(waiter.wait(child.id, timeout=WAIT_S))

        done_a: list[int] = []
        done_b: list[int] = []
        on_a = asyncio.ensure_future(_finish_parts(a.address, tubes, done_a))
        on_b = asyncio.ensure_future(_finish_parts(b.address, tubes, done_b))
        try:
            began = time.monotonic()
            while len(done_a) + len(done_b) < KILL_AFTER:
                assert time.monotonic() - began < DONE_WITHIN_S, (len(done_a), len(done_b))
                await asyncio.sleep(0.01)
            b.proc.kill()  # the process and every connection on it
            b.proc.wait()
            a_before_kill = len(done_a)
            job = await child_worker.reserve_with_timeout(int(DONE_WITHIN_S))
            assert job.id == child.id
            # at this moment every parent has finished: the child's worker reads their ends
            # (100 at a time: each wait-end's answer is due within the client's grace of its
            # own send, and a thousand pipelined at once on a loaded host came late)
            ends = [end for at in range(0, len(parents), 100) for end in await asyncio.gather(
                *(child_worker.wait_end(p, 0) for p in parents[at:at + 100]))]
            assert {end.how for end in ends} == {"finished"}
            assert sorted(end.data for end in ends) == sorted(
                b"%d:%d" % (i, n) for i, tube in enumerate(tubes)
                for n in range(PARENTS // PART_TUBES + (1 if i < PARENTS % PART_TUBES else 0)))
            await job.finish(b"total")
            assert await waiting == b"total"  # a wait from before the kill hears the end
            with pytest.raises(TimedOut):  # exactly once
                await child_worker.reserve_with_timeout(2)
            assert len(done_a) > a_before_kill  # A's workers went on after the kill
            stats = await producer.stats_tube(sum_tube)
            assert stats["total-jobs"] == 1
        finally:
            for task in (on_a, on_b, waiting):
                task.cancel()
            await asyncio.gather(on_a, on_b, waiting, return_exceptions=True)
        print(f"fan-in: {len(done_a)} parents finished on A, {len(done_b)} on B before its kill")
