"""Fixtures the pipeline test modules share (each module still starts its own SparkSession)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tubeq.redisio.process import RedisProcess


@pytest.fixture
def client(redis_process: RedisProcess) -> Iterator[redis.Redis]:
    """A client of the test's private redis-server (where the event streams are written)."""
    conn = redis.Redis.from_url(redis_process.url)
    yield conn
    conn.close()
