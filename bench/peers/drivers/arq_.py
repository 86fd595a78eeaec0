"""arq: ``ArqRedis.enqueue_job``, ``Worker(max_jobs=C, keep_result=0)``.

arq has no batch enqueue: the batched phase keeps ``concurrency`` enqueue_job calls in flight.
The worker runs in this process under uvloop with ``max_jobs=C`` and ``keep_result=0`` (no
result kept: as BullMQ's removeOnComplete), every other setting arq's default, including its
0.5 s ``poll_delay``: arq polls its queue rather than blocking on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import uvloop
from arq import create_pool
from arq.connections import RedisSettings
from arq.constants import default_queue_name, in_progress_key_prefix, job_key_prefix
from arq.worker import Worker

from bench.peers.common import (
    Phase,
    Settings,
    Tally,
    finished_async,
    in_flight,
    wait_empty_async,
)

TALLY = Tally(0)


async def noop(ctx: dict[str, Any]) -> None:
    TALLY.start()
    TALLY.done()


def produce(settings: Settings) -> dict[str, Any]:
    return uvloop.run(_produce(settings))


async def _produce(settings: Settings) -> dict[str, Any]:
    redis = await create_pool(RedisSettings.from_dsn(settings.url))
    try:
        with Phase(settings.single, "enqueue_job, awaited") as single:
            for _ in range(settings.single):
                await redis.enqueue_job("noop")
        with Phase(settings.batched, f"no batch API: {settings.concurrency} enqueue_job in "
                   "flight") as batched:
            await in_flight(settings.batched, settings.concurrency,
                            lambda: redis.enqueue_job("noop"))
    finally:
        await redis.aclose()
    return {"single": single.result, "batched": batched.result}


def consume(settings: Settings) -> dict[str, Any]:
    return uvloop.run(_consume(settings))


async def _consume(settings: Settings) -> dict[str, Any]:
    global TALLY
    TALLY = Tally(settings.total)
    deadline = settings.deadline
    worker = Worker(functions=[noop], redis_settings=RedisSettings.from_dsn(settings.url),
                    max_jobs=settings.concurrency, keep_result=0, handle_signals=False)
    runner = asyncio.ensure_future(worker.async_run())
    watcher = await create_pool(RedisSettings.from_dsn(settings.url))

    async def remaining() -> dict[str, int]:
        return {"queued": await watcher.zcard(default_queue_name),
                "in progress": len(await watcher.keys(in_progress_key_prefix + "*")),
                "job records": len(await watcher.keys(job_key_prefix + "*"))}

    try:
        await finished_async(TALLY, runner, deadline)
        empty_at, counts = await wait_empty_async(remaining, deadline)
    finally:
        await worker.close()
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await watcher.aclose()
    return TALLY.result(empty_at, counts)
