"""Shared fixtures: private servers started and stopped by the tests themselves.

Nothing here touches a server the suite did not start: each Redis is a private redis-server on a
free loopback port in a temp directory (so flushing it is ours to do).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio

from tubeq.redis_process import RedisProcess


@pytest.fixture(scope="session")
def redis_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    proc = RedisProcess(Path(tmp_path_factory.mktemp("redis")))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
async def redis_url(redis_process: RedisProcess) -> AsyncIterator[str]:
    """The URL of the session's private Redis, flushed before each test."""
    client = redis.asyncio.Redis.from_url(redis_process.url)
    await client.flushall()
    await client.aclose()
    yield redis_process.url
