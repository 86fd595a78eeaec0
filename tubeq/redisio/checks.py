"""What tubeq checks about its Redis before it serves: version, replication role and eviction
policy.

Owns: the start-up checks and :class:`StartupError`, the one exception whose message the command
line prints as is (no traceback) before it exits non-zero.

Rules:
* A Redis that may evict keys loses jobs silently: an evicted job hash is a job that was
  INSERTED and is gone, with no reply anywhere to say so. Only ``noeviction`` is safe (the
  ``volatile-*`` policies evict keys with a TTL, and tubeq's instance keys have none today, but
  nothing guarantees that of every key a future script writes). ``--allow-eviction`` lets an
  operator who knows better start anyway; the warning stays in the log.
* The checks read ``INFO server`` and ``INFO memory``, not ``CONFIG GET``: managed Redis services
  often disable CONFIG, never INFO.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from tubeq.redisio.client import RedisClient, RedisReplyError

log = structlog.get_logger(__name__)

# The oldest Redis tubeq runs on: 6.2 brought ZADD ... LT, which the delayed-job timers use
# (the store's lua/includes/jobs.lua); the suite runs on 7.0.
MIN_REDIS_VERSION = (6, 2)
SAFE_EVICTION_POLICY = "noeviction"


class StartupError(Exception):
    """tubeq cannot start; the message says why and what to do, in one line."""


@dataclass(frozen=True)
class RedisFacts:
    version: tuple[int, ...]
    eviction_policy: str
    role: str
    replicas: int  # connected replicas


def parse_info(text: bytes) -> dict[str, str]:
    """The ``field:value`` lines of an INFO reply."""
    fields: dict[str, str] = {}
    for line in text.decode(errors="replace").splitlines():
        name, sep, value = line.partition(":")
        if sep and not line.startswith("#"):
            fields[name.strip()] = value.strip()
    return fields


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` -> ``(7, 0, 15)``; unparsable parts count as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in text.split("."))


async def read_facts(client: RedisClient) -> RedisFacts:
    """Version, eviction policy and replication role of the Redis ``client`` is connected to."""
    server = await client.execute("INFO", "server")
    memory = await client.execute("INFO", "memory")
    replication = await client.execute("INFO", "replication")
    assert isinstance(server, bytes) and isinstance(memory, bytes)
    assert isinstance(replication, bytes)
    return RedisFacts(
        version=parse_version(parse_info(server).get("redis_version", "0")),
        eviction_policy=parse_info(memory).get("maxmemory_policy", "unknown"),
        role=parse_info(replication).get("role", "unknown"),
        replicas=int(parse_info(replication).get("connected_slaves", "0")))


def check_facts(facts: RedisFacts, where: str, *, allow_eviction: bool,
                min_replicas: int = 0) -> None:
    """Raise :class:`StartupError` if tubeq must not run on this Redis."""
    if facts.version < MIN_REDIS_VERSION:
        have = ".".join(map(str, facts.version))
        need = ".".join(map(str, MIN_REDIS_VERSION))
        raise StartupError(f"the Redis at {where} is version {have}; tubeq needs {need} or later")
    if facts.role != "master":
        raise StartupError(f"the Redis at {where} is a {facts.role}, not a master: point --redis "
                           "at the master, or use redis+sentinel:// to have it found")
    if facts.eviction_policy != SAFE_EVICTION_POLICY:
        if not allow_eviction:
            raise StartupError(
                f"the Redis at {where} has maxmemory-policy {facts.eviction_policy}: it may "
                "evict keys, and an evicted key is a lost job. Set maxmemory-policy noeviction "
                "(CONFIG SET maxmemory-policy noeviction, and in redis.conf), or start tubeq "
                "with --allow-eviction to accept that risk")
        log.warning("redis may evict keys: jobs can be lost (--allow-eviction)",
                    redis=where, maxmemory_policy=facts.eviction_policy)
    if facts.replicas < min_replicas:
        # Not fatal: replicas may be on their way. Until they are, every acknowledged change
        # answers INTERNAL_ERROR after the --min-replicas-timeout.
        log.warning("fewer replicas connected than --min-replicas: state changes will fail "
                    "until they connect", redis=where, replicas=facts.replicas,
                    min_replicas=min_replicas)


async def check_redis(client: RedisClient, where: str, *, allow_eviction: bool,
                      min_replicas: int = 0) -> None:
    """Read and check the facts of ``client``'s Redis; raise :class:`StartupError` if unfit."""
    try:
        facts = await read_facts(client)
    except RedisReplyError as error:
        raise StartupError(f"the Redis at {where} refused INFO: {error}") from None
    check_facts(facts, where, allow_eviction=allow_eviction, min_replicas=min_replicas)
