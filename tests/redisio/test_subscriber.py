"""tubeq.redisio.pubsub against the private Redis: PUBLISH from a client and from Lua, patterns,
callback errors, and CLIENT KILL TYPE pubsub followed by re-subscription."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from tests.redisio.test_resp import WAIT, Relay, until
from tubeq.redisio.client import RedisClient, encode_command
from tubeq.redisio.pubsub import Subscriber


class Recorder:
    """Collects what a Subscriber hands to its callbacks."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[tuple[bytes, bytes]] = asyncio.Queue()
        self.reconnects = 0
        self.reconnected = asyncio.Event()

    def on_message(self, channel: bytes, data: bytes) -> None:
        self.messages.put_nowait((channel, data))

    def on_reconnect(self) -> None:
        self.reconnects += 1
        self.reconnected.set()

    async def next(self) -> tuple[bytes, bytes]:
        return await asyncio.wait_for(self.messages.get(), WAIT)


@pytest.fixture
async def admin(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A redis-py connection to the same private Redis, for PUBLISH and CLIENT KILL."""
    admin = redis.asyncio.Redis.from_url(redis_url)
    yield admin
    await admin.aclose()


@pytest.fixture
async def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def subscriber(redis_url: str, recorder: Recorder) -> AsyncIterator[Subscriber]:
    """Subscribed to b"wake" and b"tube:*" before start(), so both are live once it returns."""
    subscriber = Subscriber(redis_url, recorder.on_message, recorder.on_reconnect)
    subscriber.subscribe(b"wake")
    subscriber.psubscribe(b"tube:*")
    await asyncio.wait_for(subscriber.start(), WAIT)
    yield subscriber
    await asyncio.wait_for(subscriber.stop(), WAIT)


async def test_messages_from_publish_and_from_lua(redis_url: str, subscriber: Subscriber,
                                                  recorder: Recorder,
                                                  admin: redis.asyncio.Redis) -> None:
    assert await admin.publish("wake", b"from PUBLISH") == 1
    assert await recorder.next() == (b"wake", b"from PUBLISH")

    client = await RedisClient.connect(redis_url)
    try:
        script = "return redis.call('PUBLISH', KEYS[1], ARGV[1])"
        assert await client.execute("EVAL", script, 1, "wake", b"from \x00 Lua") == 1
    finally:
        await client.close()
    assert await recorder.next() == (b"wake", b"from \x00 Lua")


async def test_pattern_messages_carry_the_channel(subscriber: Subscriber, recorder: Recorder,
                                                  admin: redis.asyncio.Redis) -> None:
    await admin.publish("tube:emails", b"put")
    assert await recorder.next() == (b"tube:emails", b"put")


async def test_subscribe_after_start_and_idempotently(subscriber: Subscriber, recorder: Recorder,
                                                      admin: redis.asyncio.Redis) -> None:
    subscriber.subscribe(b"late")
    subscriber.subscribe(b"late")

    async def live() -> bool:
        return (await admin.pubsub_numsub("late"))[0][1] == 1
    await until(live)

    await admin.publish("late", b"1")
    await admin.publish("late", b"2")
    assert [await recorder.next(), await recorder.next()] == [(b"late", b"1"), (b"late", b"2")]
    assert recorder.messages.empty()


async def test_callback_errors_do_not_stop_the_reader(redis_url: str,
                                                      admin: redis.asyncio.Redis) -> None:
    received: list[bytes] = []

    def on_message(channel: bytes, data: bytes) -> None:
        received.append(data)
        if data == b"boom":
            raise RuntimeError("callback bug")

    subscriber = Subscriber(redis_url, on_message, lambda: None)
    subscriber.subscribe(b"wake")
    await subscriber.start()
    try:
        await admin.publish("wake", b"boom")
        await admin.publish("wake", b"still here")

        await until(lambda: len(received) == 2)
        assert received == [b"boom", b"still here"]
        assert subscriber.connected
    finally:
        await subscriber.stop()


async def test_reconnect_resubscribes_then_calls_on_reconnect_once(
        subscriber: Subscriber, recorder: Recorder, admin: redis.asyncio.Redis) -> None:
    assert recorder.reconnects == 0  # the first connect is not a reconnect
    assert await admin.client_kill_filter(_type="pubsub") == 1
    await asyncio.wait_for(recorder.reconnected.wait(), WAIT)
    # Published right after on_reconnect, with no grace period: on_reconnect must come only
    # after the re-subscription is live, or these would be lost.
    assert await admin.publish("wake", b"after") == 1
    assert await admin.publish("tube:default", b"after") == 1
    assert [await recorder.next(), await recorder.next()] == [
        (b"wake", b"after"), (b"tube:default", b"after")]
    assert recorder.reconnects == 1
    assert subscriber.connected


async def test_on_reconnect_waits_for_the_resubscription_to_be_confirmed(
        redis_url: str, recorder: Recorder, admin: redis.asyncio.Redis) -> None:
    relay = Relay(redis_url)
    subscriber = Subscriber(await relay.start_tcp(), recorder.on_message, recorder.on_reconnect)
    subscriber.subscribe(b"wake")
    await subscriber.start()
    try:
        relay.holding = True
        relay.drop()

        await until(lambda: relay.held_bytes().endswith(encode_command(("PING",))))
        assert relay.held_bytes() == (encode_command((b"SUBSCRIBE", b"wake"))
                                      + encode_command((b"PING",)))
        assert recorder.reconnects == 0  # sent, but Redis has not confirmed it yet

        relay.release()
        await asyncio.wait_for(recorder.reconnected.wait(), WAIT)
        assert recorder.reconnects == 1
        assert await admin.publish("wake", b"after") == 1
        assert await recorder.next() == (b"wake", b"after")
    finally:
        await subscriber.stop()
        await relay.close()


async def test_stop_closes_the_connection_for_good(subscriber: Subscriber, recorder: Recorder,
                                                   admin: redis.asyncio.Redis) -> None:
    await subscriber.stop()
    assert not subscriber.connected

    async def gone() -> bool:
        return (await admin.pubsub_numsub("wake"))[0][1] == 0
    await until(gone)
    subscriber.subscribe(b"while-stopped")  # remembered, nothing sent, no error
    assert recorder.reconnects == 0
