"""Redis Sentinel: the ``redis+sentinel://`` URL form and master discovery.

Owns: parsing the Sentinel URL and asking the sentinels where the master is. Discovery is
redis-py's (:class:`redis.asyncio.sentinel.Sentinel`: it asks each sentinel in turn and accepts
only a master that sentinel sees as up), not a protocol of tubeq's own. tubeq's own connections
(the pipelined client, the subscriber) ask again before every connect and reconnect, so a
failover is followed by reconnecting: see :class:`tubeq.redisio.client.Endpoint`.

URL form::

    redis+sentinel://[[user]:password@]host1:port1[,host2:port2,...]/master-name[/db]
                     [?sentinel_password=...]

The user and password are the master's (AUTH after connecting to it); ``sentinel_password`` is
the sentinels' own, when they require one. A port left out is Sentinel's 26379.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
# Bound on each sentinel's connect and answer: a dead seed costs at most this before the next.
SENTINEL_TIMEOUT_S = 2.0


class MasterNotFound(ConnectionError):
    """No sentinel named a master that is up (unreachable sentinels, an unknown name, or a
    failover under way)."""


@dataclass(frozen=True)
class SentinelTarget:
    """The sentinels to ask and the name of the master they watch."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    password: str | None = field(default=None, repr=False)  # the sentinels' own

    @property
    def seeds(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.sentinels)

    def __str__(self) -> str:
        return f"sentinel master {self.master!r} via {self.seeds}"

    async def discover(self) -> tuple[str, int]:
        """The master's address as the sentinels report it now; raises MasterNotFound."""
        # redis-py here, not at the top: importing it costs ~0.15 s of every start, and only
        # a Sentinel URL needs it.
        from redis.asyncio.retry import Retry
        from redis.asyncio.sentinel import Sentinel
        from redis.backoff import NoBackoff
        from redis.exceptions import RedisError

        # The sentinel connections' own settings (redis-py takes none from the master's when
        # sentinel_kwargs is given): bounded, and no retries, since the next sentinel is the
        # retry and the caller's reconnect loop the backoff.
        kwargs: dict[str, Any] = {
            "socket_timeout": SENTINEL_TIMEOUT_S, "socket_connect_timeout": SENTINEL_TIMEOUT_S,
            "retry": Retry(NoBackoff(), 0)}
        if self.password is not None:
            kwargs["password"] = self.password
        sentinel = Sentinel(list(self.sentinels), sentinel_kwargs=kwargs)  # type: ignore[no-untyped-call]
        try:
            host, port = await sentinel.discover_master(self.master)
        except RedisError:  # MasterNotFoundError (its text is a repr of every connection)
            raise MasterNotFound(
                f"no sentinel of {self.seeds} named an up master {self.master!r} "
                "(sentinels unreachable, an unknown master name, or a failover under way)"
            ) from None
        finally:
            for connection in sentinel.sentinels:
                await connection.aclose()
        return str(host), int(port)


def parse_sentinel_url(netloc: str, path: str, query: str
                       ) -> tuple[SentinelTarget, int, str | None, str | None]:
    """``(target, db, username, password)`` from the parts of a ``redis+sentinel://`` URL."""
    userinfo, _, hosts = netloc.rpartition("@")
    username: str | None = None
    password: str | None = None
    if userinfo:
        user, sep, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if sep else None
    sentinels: list[tuple[str, int]] = []
    for seed in filter(None, hosts.split(",")):
        host, sep, port = seed.rpartition(":")
        if not sep:
            host, port = seed, ""
        if not host or (port and not port.isdigit()):
            raise ValueError(f"bad sentinel address {seed!r}: use host:port")
        sentinels.append((host, int(port) if port else DEFAULT_SENTINEL_PORT))
    names = [unquote(part) for part in path.split("/") if part]
    if not sentinels or not names or len(names) > 2 or (len(names) == 2 and
                                                         not names[1].isdigit()):
        raise ValueError(f"use {SCHEME}://host1:port1,host2:port2/master-name[/db]")
    sentinel_password = parse_qs(query).get("sentinel_password", [None])[0]
    target = SentinelTarget(tuple(sentinels), names[0], sentinel_password)
    return target, int(names[1]) if len(names) == 2 else 0, username, password
