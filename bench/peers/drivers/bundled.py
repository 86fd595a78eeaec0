"""tubeq's bundled client (tubeq.client), against tubeq and against beanstalkd.

Enqueue one at a time: ``await client.put(body)``, each awaited. Batched: the client's batch
API, ``client.put_many`` of ``chunk`` bodies (against tubeq one ``put-many`` command of the
whole chunk, as BullMQ's addBulk and RQ's enqueue_many are one call; against beanstalkd, which
has no batches, the client sends them as pipelined puts in one write). Consume:
``client.consume(tube, concurrency=C).run(handler)``: the push extension against tubeq; against
beanstalkd it gets UNKNOWN_COMMAND and falls back to pipelined ``reserve-with-timeout``.

Request/reply (bench.peers.call), against tubeq only: a caller is ``await client.call(tube,
body, timeout=...)`` (one ``put-with ... notify-ms`` command: the put answered at once, the end
as a frame later), the callers sharing one Client as a web app's handlers would (``call``), or
each with a Client of its own (``call_apart``, the row "tubeq (a client per caller)"); the
worker is the same ``consume()`` with a handler that returns the answer, which finishes the
job with it. beanstalkd has no ``finish``:
its request/reply is the reply-tube pattern of bench/peers/drivers/reply_tube.py.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import uvloop

from bench.peers.call_common import CALL_QUEUE, CALL_TIMEOUT_S, CallSettings, echo, phases_async
from bench.peers.common import (
    QUEUE,
    Phase,
    Settings,
    Tally,
    chunks,
    finished_async,
    wait_empty_async,
)
from tubeq.client import Client, Job

BODY = b"{}"


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 11300


def produce(settings: Settings) -> dict[str, Any]:
    return uvloop.run(_produce(settings))


async def _produce(settings: Settings) -> dict[str, Any]:
    client = Client(*_address(settings.url))
    await client.connect()
    await client.use(QUEUE)
    try:
        with Phase(settings.single, "put, awaited") as single:
            for _ in range(settings.single):
                await client.put(BODY)
        with Phase(settings.batched, f"put_many of {settings.chunk}") as batched:
            for size in chunks(settings.batched, settings.chunk):
                ids = await client.put_many([BODY] * size)
                if not all(isinstance(i, int) for i in ids):
                    raise RuntimeError(f"put_many refused entries: {ids[:3]}")
    finally:
        await client.aclose()
    return {"single": single.result, "batched": batched.result}


def consume(settings: Settings) -> dict[str, Any]:
    return uvloop.run(_consume(settings))


async def _consume(settings: Settings) -> dict[str, Any]:
    deadline = settings.deadline
    tally = Tally(settings.total)
    client = Client(*_address(settings.url))
    consumer = client.consume(QUEUE, concurrency=settings.concurrency)

    async def handler(job: Job) -> None:
        tally.start()
        tally.done()

    runner = asyncio.create_task(consumer.run(handler))
    watcher = Client(*_address(settings.url))

    async def remaining() -> dict[str, int]:
        stats = await watcher.stats_tube(QUEUE)
        counts = {key: int(stats[f"current-jobs-{key}"])
                  for key in ("ready", "reserved", "delayed", "buried")}
        counts["not deleted"] = settings.total - int(stats["cmd-delete"])
        return counts

    try:
        await finished_async(tally, runner, deadline)
        empty_at, counts = await wait_empty_async(remaining, deadline)
        modes = consumer.modes
    finally:
        consumer.stop()
        await consumer.aclose()
        runner.cancel()
        await watcher.aclose()
    return {**tally.result(empty_at, counts), "modes": modes}


# -- request/reply (bench.peers.call) -----------------------------------------------------------

def serve(settings: CallSettings) -> dict[str, Any]:
    return uvloop.run(_serve(settings))


async def _serve(settings: CallSettings) -> dict[str, Any]:
    client = Client(*_address(settings.url))
    consumer = client.consume(CALL_QUEUE, concurrency=settings.concurrency)

    async def handler(job: Job) -> bytes:
        return echo(job.body.decode()).encode()

    try:
        await asyncio.wait_for(consumer.run(handler), settings.time_limit_s)
    except TimeoutError:
        return {"stopped": "time limit"}
    finally:
        await consumer.aclose()
    return {"stopped": "consumer ended"}


def call(settings: CallSettings) -> dict[str, Any]:
    return uvloop.run(_call(settings))


def call_apart(settings: CallSettings) -> dict[str, Any]:
    return uvloop.run(_call(settings, apart=True))


async def _call(settings: CallSettings, *, apart: bool = False) -> dict[str, Any]:
    clients = [Client(*_address(settings.url)) for _ in range(settings.callers if apart else 1)]
    await asyncio.gather(*(c.connect() for c in clients))

    async def one(caller: int, request: str) -> bytes:
        return await clients[caller % len(clients)].call(CALL_QUEUE, request,
                                                         timeout=CALL_TIMEOUT_S)

    try:
        return await phases_async(settings, one)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
