"""saq: ``Queue.enqueue``, ``Worker(concurrency=C)``.

Jobs are enqueued with ``ttl=-1`` (saq keeps no record of a finished job, as BullMQ's
removeOnComplete) and the default ``retries``/``timeout``. saq has no batch enqueue (``map``
waits for results): the batched phase keeps ``concurrency`` enqueues in flight, which saq itself
throttles to ``max_concurrent_ops`` (20). The worker runs in this process under
uvloop, as ``saq`` would run it, with concurrency C.

Request/reply (bench.peers.call): a caller is ``await queue.apply("echo", timeout=...,
payload=...)``, saq's own call (enqueue, then read the job until it is done, every
``poll_interval``, default 0.5 s: saq 0.26's apply polls, it does not listen), the callers
sharing one Queue (an asyncio client multiplexes its connection pool); results are kept by
saq's default ``ttl``. The worker: ``Worker(concurrency=C)`` with an ``echo`` function.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import uvloop
from saq import Queue, Worker

from bench.peers.call_common import (
    CALL_QUEUE,
    CALL_TIMEOUT_S,
    CallSettings,
    echo,
    phases_async,
)
from bench.peers.common import (
    QUEUE,
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
    queue = Queue.from_url(settings.url, name=QUEUE)
    await queue.connect()
    try:
        with Phase(settings.single, "enqueue, awaited") as single:
            for _ in range(settings.single):
                await queue.enqueue("noop", ttl=-1)
        with Phase(settings.batched, f"no batch API: {settings.concurrency} enqueues in "
                   "flight (saq caps them at 20)") as batched:
            await in_flight(settings.batched, settings.concurrency,
                            lambda: queue.enqueue("noop", ttl=-1))
    finally:
        await queue.disconnect()
    return {"single": single.result, "batched": batched.result}


def consume(settings: Settings) -> dict[str, Any]:
    return uvloop.run(_consume(settings))


async def _consume(settings: Settings) -> dict[str, Any]:
    global TALLY
    TALLY = Tally(settings.total)
    deadline = settings.deadline
    queue = Queue.from_url(settings.url, name=QUEUE)
    await queue.connect()
    worker = Worker(queue, functions=[noop], concurrency=settings.concurrency)
    runner = asyncio.ensure_future(worker.start())

    async def remaining() -> dict[str, int]:
        return {kind: await queue.count(kind) for kind in ("queued", "active", "incomplete")}

    try:
        await finished_async(TALLY, runner, deadline)
        empty_at, counts = await wait_empty_async(remaining, deadline)
    finally:
        await worker.stop()
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await queue.disconnect()
    return TALLY.result(empty_at, counts)


# -- request/reply (bench.peers.call) -----------------------------------------------------------

async def echo_job(ctx: dict[str, Any], *, payload: str) -> str:
    return echo(payload)


def serve(settings: CallSettings) -> dict[str, Any]:
    return uvloop.run(_serve(settings))


async def _serve(settings: CallSettings) -> dict[str, Any]:
    queue = Queue.from_url(settings.url, name=CALL_QUEUE)
    await queue.connect()
    worker = Worker(queue, functions=[("echo", echo_job)], concurrency=settings.concurrency)
    runner = asyncio.ensure_future(worker.start())
    try:
        await asyncio.wait_for(asyncio.shield(runner), settings.time_limit_s)
    except TimeoutError:
        return {"stopped": "time limit"}
    finally:
        await worker.stop()
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await queue.disconnect()
    return {"stopped": "worker ended"}


def call(settings: CallSettings) -> dict[str, Any]:
    return uvloop.run(_call(settings))


async def _call(settings: CallSettings) -> dict[str, Any]:
    queue = Queue.from_url(settings.url, name=CALL_QUEUE)
    await queue.connect()

    async def one(caller: int, request: str) -> str:
        answer: str = await queue.apply("echo", timeout=CALL_TIMEOUT_S, payload=request)
        return answer

    try:
        return await phases_async(settings, one)
    finally:
        await queue.disconnect()
