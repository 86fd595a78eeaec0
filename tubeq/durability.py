"""What tubeq checks about its Redis before it serves: version and eviction policy, and each
namespace's data layout version.

Owns: the start-up checks and :class:`StartupError`, the one exception whose message the command
line prints as is (no traceback) before it exits non-zero.

Rules:
* A Redis that may evict keys loses jobs silently: an evicted job hash is a job that was
  INSERTED and is gone, with no reply anywhere to say so. Only ``noeviction`` is safe (the
  ``volatile-*`` policies evict keys with a TTL, and tubeq's instance keys have none today, but
  nothing guarantees that of every key a future script writes). ``--allow-eviction`` lets an
  operator who knows better start anyway; the warning stays in the log.
* A namespace's data layout version (tubeq.keys.LAYOUT_VERSION) is recorded in it. A process
  records its own in a namespace without one, takes over a record of an older layout it reads
  as it is, and refuses to start on a newer one (it would misread what that layout wrote) or on
  one too old to read as it is. There is no flag to override that: README, "Upgrades and
  rollback", says how to set the record by hand and what that risks.
* The checks read ``INFO server`` and ``INFO memory``, not ``CONFIG GET``: managed Redis services
  often disable CONFIG, never INFO.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from tubeq import __version__
from tubeq.keys import LAYOUT_VERSION, UPGRADES_IN_PLACE_FROM, Keys
from tubeq.resp import RedisClient, RedisReplyError
from tubeq.scripts import load_all

log = structlog.get_logger(__name__)

# The oldest Redis tubeq runs on: 6.2 brought ZADD ... LT, which the delayed-job timers use
# (lua/includes/jobs.lua); the suite runs on 7.0.
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


async def claim_layout_version(client: RedisClient, keys: Keys, where: str) -> None:
    """Record LAYOUT_VERSION for the namespace of ``keys`` (its unsplit root), or take over the
    record of an older layout this build reads as it is; raise :class:`StartupError` when the
    record is newer than this build, too old for it, or unreadable (lua/layout.lua, which also
    re-arms the TTL timer a layout-1 process may have removed)."""
    script = load_all()["layout"]
    try:
        before, now = await client.call("EVAL", script.source, 1, keys.root, LAYOUT_VERSION,
                                        UPGRADES_IN_PLACE_FROM)
    except RedisReplyError as error:
        raise StartupError(f"the Redis at {where} refused the data layout record "
                           f"{keys.layout}: {error}") from None
    recorded = now.decode(errors="replace")
    namespace = f"namespace {keys.prefix!r} at {where}"
    if not recorded.isdigit():
        raise StartupError(
            f"{namespace} has an unreadable data layout record ({keys.layout} = {recorded!r}): "
            f"set it to the layout its data has (tubeq {__version__} writes {LAYOUT_VERSION}); "
            "see README, Upgrades and rollback")
    version = int(recorded)
    if version > LAYOUT_VERSION:
        raise StartupError(
            f"{namespace} has data layout {version}, newer than tubeq {__version__} knows "
            f"(layout {LAYOUT_VERSION}): run a tubeq that knows layout {version} (the version "
            "that wrote it, or later); see README, Upgrades and rollback")
    if version < LAYOUT_VERSION:
        raise StartupError(
            f"{namespace} has data layout {version}, older than tubeq {__version__} reads as it "
            f"is (layouts {UPGRADES_IN_PLACE_FROM} to {LAYOUT_VERSION}): upgrade it with a "
            "tubeq in between first; see README, Upgrades and rollback")
    if before and before != now:
        log.info("namespace data layout upgraded", namespace=keys.prefix,
                 layout_from=before.decode(errors="replace"), layout_to=version)
