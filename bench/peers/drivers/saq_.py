"""saq: ``Queue.enqueue``, ``Worker(concurrency=C)``.

Jobs are enqueued with ``ttl=-1`` (saq keeps no record of a finished job, as BullMQ's
removeOnComplete) and the default ``retries``/``timeout``. saq has no batch enqueue (``map``
waits for results): the batched phase keeps ``concurrency`` enqueues in flight, which saq itself
throttles to ``max_concurrent_ops`` (20). The worker runs in this process under
uvloop, as ``saq`` would run it, with concurrency C.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import uvloop
from saq import Queue, Worker

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
