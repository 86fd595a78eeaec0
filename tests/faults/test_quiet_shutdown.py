"""Quiet shutdowns through the faults a deploy makes: (a) a worker process (the bundled
client's ``consume()``, concurrency 32 and prefetch 64) gets SIGTERM while it holds 32 jobs in
its handlers and 64 prefetched; (b) the tubeq process a push consumer is connected to gets
SIGTERM while a second process serves on.

Expected, every time: every job ends either finished (a handler that ended within the grace)
or ready again, with its tries, releases and timeouts unchanged (given back with hand-back, or
taken back by the stopping server: no try counted); nothing reserved, buried, delayed or lost;
the connections opened before the fault are served after it; and a wait opened before the
fault answers within its timeout.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.support.servers import ServerProcess, start_tubeq, unique_prefix
from tubeq.client import Client, Job, NotFound, TimedOut
from tubeq.client.ends import REPLY_GRACE_S
from tubeq.redisio.process import RedisProcess

CONCURRENCY = 32
PREFETCH = 64
SHORT_S = 0.5  # a handler that ends within the grace
LONG_S = 120.0  # one that does not: cancelled at the grace, its job given back
GRACE_S = 3.0
WAIT_S = 2.0  # the timeout of the wait opened before the fault
BOUND_S = 30.0  # bound on each wait below; never asserted as a duration
SLACK_S = 1.0  # the test's own scheduling on two shared cores

pytestmark = pytest.mark.timeout(180)


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not await check():
        assert time.monotonic() < deadline, f"not within {BOUND_S:g} s: {what}"
        await asyncio.sleep(0.05)


async def put_jobs(client: Client, tube: str, count: int) -> dict[int, bytes]:
    """``count`` jobs, short and long in turn: their ids and bodies."""
    await client.use(tube)
    jobs = {}
    for n in range(count):
        body = b"sleep:%g" % (SHORT_S if n % 2 else LONG_S)
        jobs[await client.put(body, ttr=300)] = body
    return jobs


async def wait_when_held(look: Client, waiter: Client, tube: str, jobs: dict[int, bytes],
                         who: str) -> asyncio.Future[bytes]:
    """Once ``who`` holds 32 jobs and 64 prefetched: a wait (WAIT_S) on the first long job,
    opened before the fault."""
    async def holding() -> bool:
        stats = await look.stats_tube(tube)
        return stats["current-jobs-reserved"] == CONCURRENCY + PREFETCH

    await until(holding, f"{who} holds 32 jobs and 64 prefetched")
    first_long = min(i for i, b in jobs.items() if b.endswith(b"%g" % LONG_S))
    waited = asyncio.ensure_future(waiter.wait(first_long, timeout=WAIT_S))
    await asyncio.sleep(0.1)  # (the wait is sent before the fault)
    return waited


async def check_every_job(look: Client, jobs: dict[int, bytes]) -> dict[str, int]:
    """Each job finished (short ones only) or ready with its policy counts unchanged."""
    seen = {"finished": 0, "ready": 0}
    await look.extensions()  # stats-job then shows tubeq's keys (tries)
    for job_id, body in jobs.items():
        try:
            stats = await look.stats_job(job_id)
        except NotFound:
            end = await look.wait_end(job_id, timeout=0)
            assert end.how == "finished", (job_id, end)
            assert body.endswith(b"%g" % SHORT_S), f"job {job_id} ({body!r}) finished"
            seen["finished"] += 1
            continue
        got = (stats["state"], stats["tries"], stats["releases"], stats["timeouts"])
        assert got == ("ready", 0, 0, 0), (job_id, body, stats)
        seen["ready"] += 1
    return seen


async def test_sigterm_of_a_consumer_holding_32_jobs_and_64_prefetched(
        redis: RedisProcess, tmp_path: Path) -> None:
    tube = "quiet-worker"
    server = start_tubeq(redis.url, unique_prefix("tq-quiet"), tmp_path / "logs", "tubeq")
    worker: subprocess.Popen[bytes] | None = None
    try:
        async with Client(*server.address) as look, Client(*server.address) as other, \
                Client(*server.address) as waiter:
            jobs = await put_jobs(look, tube, 2 * (CONCURRENCY + PREFETCH))
            await other.watch("other")  # a connection of before the fault, another tube
            worker = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.quiet_consumer", *map(str, server.address),
                 tube, str(CONCURRENCY), str(PREFETCH), str(GRACE_S)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

            waited = await wait_when_held(look, waiter, tube, jobs, "the worker")
            began = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            with pytest.raises(TimedOut):  # it was handed back, not ended: the wait times out
                await waited
            assert time.monotonic() - began <= WAIT_S + REPLY_GRACE_S + SLACK_S
            output, _ = await asyncio.to_thread(worker.communicate, timeout=BOUND_S)
            assert worker.returncode == 0 and b"stopped" in output, output.decode()[-2000:]

            seen = await check_every_job(look, jobs)
            stats = await look.stats_tube(tube)
            assert (stats["current-jobs-reserved"], stats["current-jobs-buried"],
                    stats["current-jobs-delayed"]) == (0, 0, 0)
            # the short ones among the 32 in hand finished within the grace
            assert 0 < seen["finished"] <= CONCURRENCY, seen
            assert seen["finished"] + seen["ready"] == len(jobs)
            # the connections of before the fault are served
            await other.use("other")
            job_id = await other.put(b"after")
            assert (await other.reserve_with_timeout(5)).id == job_id
            await look.watch(tube)
            assert (await look.reserve_with_timeout(5)).id in jobs
            print(f"SIGTERM of a consumer: {seen}")
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        server.stop()


async def test_sigterm_of_the_server_a_push_consumer_uses(redis: RedisProcess,
                                                          tmp_path: Path) -> None:
    tube = "quiet-server"
    prefix = unique_prefix("tq-quiet")
    stopping = start_tubeq(redis.url, prefix, tmp_path / "logs", "tubeq-stopping",
                           ("--shutdown-grace", "60"))
    staying: ServerProcess = start_tubeq(redis.url, prefix, tmp_path / "logs", "tubeq-staying")
    try:
        async with Client(*staying.address) as look, Client(*stopping.address) as client, \
                Client(*staying.address) as waiter:
            jobs = await put_jobs(look, tube, 2 * (CONCURRENCY + PREFETCH))
            handled: list[int] = []

            async def handle(job: Job) -> bytes:
                handled.append(job.id)
                await asyncio.sleep(float(job.body.decode().split(":", 1)[1]))
                return b"done"

            consumer = client.consume(tube, concurrency=CONCURRENCY, prefetch=PREFETCH,
                                      grace=GRACE_S, stop_signals=())
            running = asyncio.ensure_future(consumer.run(handle))

            waited = await wait_when_held(look, waiter, tube, jobs, "the consumer")
            began = time.monotonic()
            stopping.send_signal(signal.SIGTERM)  # QUIET: the consumer stops, gives back
            await asyncio.wait_for(running, BOUND_S)  # it ended: the server asked it to
            with pytest.raises(TimedOut):
                await waited
            assert time.monotonic() - began <= WAIT_S + REPLY_GRACE_S + SLACK_S
            # the server's grace (60 s) ends as soon as no connection holds a job
            assert await asyncio.to_thread(stopping.proc.wait, BOUND_S) == 0
            seen = await check_every_job(look, jobs)
            assert 0 < seen["finished"] <= CONCURRENCY, seen
            stats = await look.stats_tube(tube)
            assert (stats["current-jobs-reserved"], stats["current-jobs-buried"],
                    stats["current-jobs-delayed"]) == (0, 0, 0)
            # the staying process's connections of before the fault are served
            await look.watch(tube)
            assert (await look.reserve_with_timeout(5)).id in jobs
            print(f"SIGTERM of the push consumer's server: {seen}, handled {len(handled)}")
    finally:
        stopping.stop()
        staying.stop()
