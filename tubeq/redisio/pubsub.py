"""The process's one pub/sub connection (CONVENTIONS §10): subscriptions kept, messages fanned out.

Owns: the subscription set and the pub/sub reply stream (RESP2 push frames). The connection
life cycle (open, lose, reconnect with backoff) is
:class:`tubeq.redisio.client.ReconnectingProtocol`'s.

Rules:
* Pub/sub is a hint, never the truth. Messages published while the connection is down are lost.
  So after every reconnect, once the re-subscription is confirmed, ``on_reconnect()`` runs exactly
  once, and the waiter registry wakes every waiter so each one re-checks with its Lua script.
* ``subscribe``/``psubscribe`` are idempotent and fire-and-forget. A message published before
  Redis has processed the SUBSCRIBE is missed. Waiters cover that window the same way: register,
  try, wait with a bound, try again.
* An exception from a callback is logged and dropped. It never stops the reader.

How a (re)connect is confirmed, as a timeline on one connection:
  t0  we write  [AUTH] [SELECT] SUBSCRIBE c1 c2 ... PSUBSCRIBE p1 ... PING
  t1  Redis answers each in order: OK, OK, a confirmation per channel and pattern, then pong
  t2  the pong proves every earlier command was processed, so every subscription is live
  t3  on_reconnect() (not on the first connect: start() returning is the signal there)
An error reply before the pong rejects the connection, and the backoff loop tries again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import structlog

from tubeq.redisio.client import (
    Arg,
    ReconnectingProtocol,
    RedisConnectionLost,
    RedisReplyError,
    Reply,
    encode_command,
)

log = structlog.get_logger(__name__)

_DELIVERED = (b"message", b"pmessage")  # [kind, (pattern,) channel, data]: channel, data last


class Subscriber(ReconnectingProtocol):
    """Subscriptions over one connection; ``on_message(channel, data)`` for each message."""

    def __init__(self, url: str, on_message: Callable[[bytes, bytes], None],
                 on_reconnect: Callable[[], None]) -> None:
        super().__init__(url)
        self._on_message = on_message
        self._on_reconnect = on_reconnect
        self._channels: set[bytes] = set()
        self._patterns: set[bytes] = set()
        self._confirmed: asyncio.Future[None] | None = None  # set while _on_open waits for pong

    async def start(self) -> None:
        """Connect and subscribe to everything subscribed so far; raises OSError or
        RedisReplyError if that fails (no retry on the first connect)."""
        await self._open()

    def subscribe(self, channel: bytes) -> None:
        """Subscribe to ``channel`` now (if connected) and after every reconnect."""
        if channel not in self._channels:
            self._channels.add(channel)
            self._write(encode_command((b"SUBSCRIBE", channel)))

    def psubscribe(self, pattern: bytes) -> None:
        """Subscribe to the glob ``pattern`` now (if connected) and after every reconnect."""
        if pattern not in self._patterns:
            self._patterns.add(pattern)
            self._write(encode_command((b"PSUBSCRIBE", pattern)))

    async def stop(self) -> None:
        """Close the connection and stop reconnecting."""
        await self._shutdown()

    async def _on_open(self) -> None:
        commands: list[tuple[Arg, ...]] = self._endpoint.handshake()
        if self._channels:
            commands.append((b"SUBSCRIBE", *self._channels))
        if self._patterns:
            commands.append((b"PSUBSCRIBE", *self._patterns))
        commands.append((b"PING",))
        self._confirmed = asyncio.get_running_loop().create_future()
        try:
            self._write(b"".join(encode_command(command) for command in commands))
            await self._confirmed
        finally:
            self._confirmed = None

    def _on_reply(self, reply: Reply | RedisReplyError) -> None:
        if isinstance(reply, list) and reply[0] in _DELIVERED:
            channel, data = cast(bytes, reply[-2]), cast(bytes, reply[-1])
            try:
                self._on_message(channel, data)
            except Exception:
                log.exception("subscriber on_message failed", channel=channel)
        elif (isinstance(reply, list) and reply[0] == b"pong") or reply == b"PONG":
            # PONG when nothing was subscribed; ["pong", ""] in subscribed mode.
            if self._confirmed is not None and not self._confirmed.done():
                self._confirmed.set_result(None)
        elif isinstance(reply, RedisReplyError):
            if self._confirmed is not None and not self._confirmed.done():
                self._confirmed.set_exception(reply)
            else:
                log.error("redis error on the subscriber connection", error=str(reply))
        # Anything else is a subscribe confirmation or the OK of AUTH/SELECT: nothing to do.

    def _on_lost(self, exc: Exception | None) -> None:
        if self._confirmed is not None and not self._confirmed.done():
            self._confirmed.set_exception(
                RedisConnectionLost(f"connection to {self._endpoint} lost while subscribing"))

    def _on_reconnected(self) -> None:
        try:
            self._on_reconnect()
        except Exception:
            log.exception("subscriber on_reconnect failed")
