"""arq: ``ArqRedis.enqueue_job``, ``Worker(max_jobs=C, keep_result=0)``.

arq has no batch enqueue: the batched phase keeps ``concurrency`` enqueue_job calls in flight.
The worker runs in this process under uvloop with ``max_jobs=C`` and ``keep_result=0`` (no
result kept: as BullMQ's removeOnComplete), every other setting arq's default, including its
0.5 s ``poll_delay``: arq polls its queue rather than blocking on it.

Request/reply (bench.peers.call): a caller is ``job = await redis.enqueue_job("echo", payload)``
then ``await job.result(timeout=...)`` (which reads the result every ``poll_delay``, default
0.5 s), the callers sharing one pool (redis-py's asyncio pool opens a connection per command in
flight). The worker keeps results (arq's default ``keep_result``, 3600 s), ``max_jobs=C``,
every other setting arq's default, its 0.5 s ``poll_delay`` too.
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

from bench.peers.call_common import CALL_TIMEOUT_S, CallSettings, phases_async
from bench.peers.call_common import echo as echo_text
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


# -- request/reply (bench.peers.call) -----------------------------------------------------------

async def echo(ctx: dict[str, Any], payload: str) -> str:
    return echo_text(payload)


def serve(settings: CallSettings) -> dict[str, Any]:
    return uvloop.run(_serve(settings))


async def _serve(settings: CallSettings) -> dict[str, Any]:
    worker = Worker(functions=[echo], redis_settings=RedisSettings.from_dsn(settings.url),
                    max_jobs=settings.concurrency, handle_signals=False)
    runner = asyncio.ensure_future(worker.async_run())
    try:
        await asyncio.wait_for(asyncio.shield(runner), settings.time_limit_s)
    except TimeoutError:
        return {"stopped": "time limit"}
    finally:
        await worker.close()
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    return {"stopped": "worker ended"}


def call(settings: CallSettings) -> dict[str, Any]:
    return uvloop.run(_call(settings))


async def _call(settings: CallSettings) -> dict[str, Any]:
    redis = await create_pool(RedisSettings.from_dsn(settings.url))

    async def one(caller: int, request: str) -> str:
        job = await redis.enqueue_job("echo", request)
        if job is None:
            raise RuntimeError("enqueue_job answered None (a job of that id exists)")
        answer: str = await job.result(timeout=CALL_TIMEOUT_S)
        return answer

    try:
        return await phases_async(settings, one)
    finally:
        await redis.aclose()
