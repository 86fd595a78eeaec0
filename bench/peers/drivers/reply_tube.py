"""beanstalkd's request/reply: the reply-tube pattern, with tubeq's bundled client (tubeq.client).

beanstalkd has no result and no wait, so a caller names a tube of its own in the request and
the worker puts the answer there. A caller (a Client, so a connection, of its own) has used
the request tube and watches only its reply tube ``reply.<pid>.<caller>``; one call is
``put`` of ``<reply tube> <request>``, ``reserve-with-timeout`` on the reply tube, and
``delete`` of the reply: three round trips, all in the call's latency, since the caller cannot
send its next request on that connection before the reply job is settled (a reserved reply left
undeleted would come back after its TTR). Each caller has one call out at a time, so its reply
tube holds at most one job and the reply reserved is its own.

The worker is ``client.consume(tube, concurrency=C).run(handler)`` (pipelined
``reserve-with-timeout`` against beanstalkd, which has no push): the handler puts the answer
into the reply tube and returns, and consume() deletes the request. A put goes to the *used*
tube, a connection's state: two handlers sharing one connection would race between ``use``
and ``put``, so the worker keeps one connection per reply tube, ``use``d once (32 callers, 32
reply connections), and replies to different callers go out in parallel.

Against tubeq the same code runs unchanged (bench.peers.call's "tubeq (reply tubes)" row): the
pattern's cost on tubeq, beside ``client.call``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import urlsplit

import uvloop

from bench.peers.call_common import (
    CALL_QUEUE,
    CALL_TIMEOUT_S,
    CallSettings,
    echo,
    phases_async,
)
from tubeq.client import Client, Job


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 11300


def serve(settings: CallSettings) -> dict[str, Any]:
    return uvloop.run(_serve(settings))


async def _serve(settings: CallSettings) -> dict[str, Any]:
    address = _address(settings.url)
    client = Client(*address)
    consumer = client.consume(CALL_QUEUE, concurrency=settings.concurrency)
    # One connection per reply tube, opened by the first request that names it: a Task, so
    # that two requests naming a new tube at once share one connection.
    replies: dict[bytes, asyncio.Task[Client]] = {}

    async def open_reply(tube: bytes) -> Client:
        reply = Client(*address)
        await reply.connect()
        await reply.use(tube.decode())
        return reply

    async def handler(job: Job) -> None:
        tube, _, request = job.body.partition(b" ")
        if tube not in replies:
            replies[tube] = asyncio.ensure_future(open_reply(tube))
        reply = await replies[tube]
        await reply.put(echo(request.decode()).encode())
        # Returning None: consume() deletes the request.

    try:
        await asyncio.wait_for(consumer.run(handler), settings.time_limit_s)
    except TimeoutError:
        return {"stopped": "time limit"}
    finally:
        await consumer.aclose()
        for task in replies.values():
            if task.done() and not task.exception():
                await task.result().aclose()
    return {"stopped": "consumer ended"}


def call(settings: CallSettings) -> dict[str, Any]:
    return uvloop.run(_call(settings))


async def _call(settings: CallSettings) -> dict[str, Any]:
    address = _address(settings.url)
    tubes = [f"reply.{os.getpid()}.{i}" for i in range(settings.callers)]
    clients = [Client(*address) for _ in range(settings.callers)]

    async def open_caller(client: Client, tube: str) -> None:
        await client.connect()
        await client.use(CALL_QUEUE)
        await client.watch(tube)
        await client.ignore("default")

    await asyncio.gather(*(open_caller(c, t) for c, t in zip(clients, tubes, strict=True)))

    async def one(caller: int, request: str) -> bytes:
        client = clients[caller]
        await client.put(f"{tubes[caller]} {request}".encode())
        answer = await client.reserve_with_timeout(CALL_TIMEOUT_S)
        await answer.delete()
        return answer.body

    try:
        return await phases_async(settings, one)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
