"""The command connection's round-trip sample (RedisClient.on_round_trip): one batch in
ROUND_TRIP_SAMPLE is timed, the first one included, each timing a real write-to-reply span."""

from __future__ import annotations

import pytest

from tubeq.redisio.client import ROUND_TRIP_SAMPLE, RedisClient

pytestmark = pytest.mark.asyncio


async def test_one_batch_in_the_sample_is_timed_from_the_first(redis_url: str) -> None:
    client = await RedisClient.connect(redis_url)
    timed: list[float] = []
    client.on_round_trip = timed.append
    try:
        batches = 3 * ROUND_TRIP_SAMPLE + 1
        for _ in range(batches):  # each awaited alone: one batch written per call
            assert await client.call(b"PING") == b"PONG"
        # batches 1, 1 + SAMPLE, 1 + 2 x SAMPLE, 1 + 3 x SAMPLE
        assert len(timed) == 4
        assert all(0 < seconds < 2.0 for seconds in timed)
    finally:
        await client.close()


async def test_no_hook_times_nothing(redis_url: str) -> None:
    client = await RedisClient.connect(redis_url)
    try:
        for _ in range(ROUND_TRIP_SAMPLE + 1):
            await client.call(b"PING")
        assert client._probe is None  # no call was marked for timing
    finally:
        await client.close()
