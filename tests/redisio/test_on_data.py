"""A connection's data hook (ReconnectingProtocol.on_data, the server's idle poll): called
once per read that brought replies or messages, before they are handled; none unset."""

from __future__ import annotations

import asyncio

import pytest

from tubeq.redisio.client import RedisClient
from tubeq.redisio.pubsub import Subscriber

pytestmark = pytest.mark.asyncio


async def test_a_reply_calls_the_hook_before_its_caller_hears_it(redis_url: str) -> None:
    client = await RedisClient.connect(redis_url)
    heard: list[str] = []
    client.on_data = lambda: heard.append("data")
    try:
        call = client.call(b"PING")
        call.add_done_callback(lambda _: heard.append("reply"))
        assert await call == b"PONG"
        assert heard[:2] == ["data", "reply"]
        client.on_data = None
        assert await client.call(b"PING") == b"PONG"
        assert heard.count("data") == 1  # unset: not called
    finally:
        await client.close()


async def test_a_pubsub_message_calls_the_hook(redis_url: str) -> None:
    messages: list[bytes] = []
    subscriber = Subscriber(redis_url, lambda channel, data: messages.append(data),
                            lambda: None)
    calls: list[None] = []
    subscriber.on_data = lambda: calls.append(None)
    publisher = await RedisClient.connect(redis_url)
    try:
        subscriber.subscribe(b"on-data-test")
        await subscriber.start()  # (its confirmation called the hook already)
        calls.clear()
        deadline = asyncio.get_running_loop().time() + 5
        while not messages:
            assert asyncio.get_running_loop().time() < deadline, "no message came"
            await publisher.call(b"PUBLISH", b"on-data-test", b"hello")
            await asyncio.sleep(0.02)
        assert calls  # the message's read called it
    finally:
        await publisher.close()
        await subscriber.stop()
