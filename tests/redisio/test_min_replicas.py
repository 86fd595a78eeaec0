"""The Sentinel URL form; the replica acknowledgement of tubeq.redisio.client (``min_replicas``): a
durable call resolves only after a WAIT confirmed it, one WAIT per batch, and too few replicas
make it fail (the write itself happened, as the error says); a READONLY reply on a Sentinel
endpoint makes the client look for the master again."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio

from tubeq.redisio.client import (
    Endpoint,
    RedisClient,
    RedisConnectionLost,
    RedisReplyError,
    ReplicasBehind,
)
from tubeq.redisio.process import RedisProcess
from tubeq.redisio.sentinel import SentinelTarget

SCRIPT = b"return redis.call('INCR', KEYS[1])"


def test_sentinel_urls() -> None:
    endpoint = Endpoint.parse("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2/jobs/3"
                              "?sentinel_password=watch")
    assert endpoint.sentinel == SentinelTarget((("10.0.0.1", 26379), ("10.0.0.2", 26379)),
                                               "jobs", "watch")
    assert (endpoint.db, endpoint.password, endpoint.username) == (3, "s3cret", None)
    assert str(endpoint) == "sentinel master 'jobs' via 10.0.0.1:26379,10.0.0.2:26379/3"
    assert Endpoint.parse("redis+sentinel://h:1/m").sentinel == SentinelTarget(
        (("h", 1),), "m")
    for bad in ("redis+sentinel://h:1", "redis+sentinel:///m", "redis+sentinel://h:x/m",
                "redis+sentinel://h:1/m/notadb", "redis+sentinel://h:1/m/0/extra"):
        with pytest.raises(ValueError):
            Endpoint.parse(bad)


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[RedisProcess, RedisProcess]]:
    master = RedisProcess(tmp_path / "master")
    master.start()
    replica = RedisProcess(tmp_path / "replica",
                           extra=("--replicaof", master.host, str(master.port)))
    replica.start()
    yield master, replica
    replica.stop()
    master.stop()


async def _in_sync(master: RedisProcess) -> None:
    admin = redis.asyncio.Redis.from_url(master.url)
    try:
        async with asyncio.timeout(20):
            while (await admin.info("replication")).get("connected_slaves") != 1:
                await asyncio.sleep(0.05)
    finally:
        await admin.aclose()


async def test_durable_calls_wait_for_the_replica(
        replicated: tuple[RedisProcess, RedisProcess]) -> None:
    master, replica = replicated
    await _in_sync(master)
    client = await RedisClient.connect(master.url, min_replicas=1, replicas_timeout_ms=5000)
    sent: list[bytes] = []
    try:
        durable = client.bind_script(_sha(), SCRIPT, ("counter",), durable=True)
        plain = client.bind_script(_sha(), SCRIPT, ("other",))
        write = client._write
        client._write = lambda data: (sent.append(data), write(data))[1]  # type: ignore[method-assign]
        results = await asyncio.gather(*(durable() for _ in range(5)), plain())
        assert results == [1, 2, 3, 4, 5, 1]
        # One batch, one WAIT at its end (NOSCRIPT fallbacks go in a second batch with theirs).
        assert b"".join(sent).count(b"WAIT") == len(sent)
        assert b"".join(sent).endswith(b"$4\r\nWAIT\r\n$1\r\n1\r\n$4\r\n5000\r\n")
        on_replica = redis.asyncio.Redis.from_url(replica.url)
        assert await on_replica.get("counter") == b"5"  # WAIT said so: it is there already
        await on_replica.aclose()
    finally:
        await client.close()


async def test_too_few_replicas_fail_the_call_not_the_write(tmp_path: Path) -> None:
    lone = RedisProcess(tmp_path / "lone")
    lone.start()
    client = await RedisClient.connect(lone.url, min_replicas=1, replicas_timeout_ms=50)
    try:
        durable = client.bind_script(_sha(), SCRIPT, ("counter",), durable=True)
        with pytest.raises(ReplicasBehind, match="0 of 1 replicas"):
            await durable()
        assert await client.execute("GET", "counter") == b"1"  # done, only not confirmed
        assert await client.call("PING") == b"PONG"  # the connection serves on
    finally:
        await client.close()
        lone.stop()


def _sha() -> str:
    return hashlib.sha1(SCRIPT).hexdigest()


async def test_readonly_on_a_sentinel_endpoint_drops_the_connection(
        replicated: tuple[RedisProcess, RedisProcess]) -> None:
    """A READONLY reply means the master we write to was demoted: the call fails, and the
    connection is dropped so that the reconnect asks the sentinels again."""
    _, replica = replicated
    client = await RedisClient.connect(replica.url)
    try:
        # As if the sentinels had named this server (now a replica) the master.
        client._endpoint = dataclasses.replace(
            client._endpoint, sentinel=SentinelTarget((("127.0.0.1", 1),), "gone"))
        with pytest.raises(RedisReplyError, match="READONLY"):
            await client.execute("SET", "k", "v")
        async with asyncio.timeout(10):
            while client.connected:
                await asyncio.sleep(0.01)
        with pytest.raises(RedisConnectionLost):
            await client.execute("GET", "k")  # fails at once while it looks for the master
    finally:
        await client.close()
