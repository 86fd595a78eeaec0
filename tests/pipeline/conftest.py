"""Fixtures the pipeline test modules share: the process's SparkSession (sparks.py), the
options of every JVM they start, and a client of the test's private Redis."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from pyspark.sql import SparkSession

from tests.pipeline.sparks import JVM_ENVIRONMENT, local_spark, stop_local_spark
from tubeq.redisio.process import RedisProcess


@pytest.fixture(scope="session", autouse=True)
def pipeline_jvms() -> Iterator[None]:
    """Every JVM a pipeline test starts gets sparks.JVM_OPTIONS; the process's SparkSession is
    stopped, and the environment restored, when the test process ends."""
    saved = {key: os.environ.get(key) for key in JVM_ENVIRONMENT}
    os.environ.update(JVM_ENVIRONMENT)
    try:
        yield
    finally:
        stop_local_spark()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    """The process's local SparkSession (local[2]), shared with the other pipeline modules."""
    return local_spark()


@pytest.fixture
def client(redis_process: RedisProcess) -> Iterator[redis.Redis]:
    """A client of the test's private redis-server (where the event streams are written)."""
    conn = redis.Redis.from_url(redis_process.url)
    yield conn
    conn.close()
