"""The hot-path Redis client: one connection, auto-pipelined calls, replies resolved in order.

Owns: RESP command encoding, Redis URL parsing, and the connection life cycle shared with the
pub/sub subscriber (:class:`ReconnectingProtocol`: open, handshake, lose, reconnect with backoff).

Rules:
* ``call()`` never awaits. It encodes into a buffer and returns a future. The buffer goes out in
  one ``transport.write`` as soon as ``flush_at`` calls are buffered, or at the end of the loop
  tick. The ``flush_at`` cap avoids the lock-step convoy where Redis idles while Python handles
  a whole batch of replies (research/perf-baseline.md 3c: tick-only 54k/s, tick-or-16 76k/s).
  Holding a short buffer back until the replies in flight came back (tried until 2026-11) made
  fewer writes but cost round-trip-bound clients a Redis round trip per command (put 64x1:
  39-40k/s held back, 45-49k/s sent at the tick's end; 64x16 rows unchanged).
* ``call(..., decode=f)`` resolves to ``f(reply)``: one future per call, no chained futures.
  ``call_script`` sends EVALSHA and, should Redis have lost the script (NOSCRIPT), sends the
  EVAL itself and resolves the same future. A script bound to a library function
  (``bind_script(function=...)``) goes as FCALL, and falls back to the same EVAL should Redis
  not have that function (a restarted or flushed Redis, before its library is loaded again).
* Replies resolve futures strictly in FIFO order. A cancelled future still owns its slot: its reply
  is read and dropped, so the stream never desynchronises.
* A lost connection fails every pending future with :class:`RedisConnectionLost`. Calls made
  while disconnected fail at once and never wait. Reconnection runs in the background until
  ``close()``, with backoff from 50 ms doubling to 1 s. Nothing is retried automatically: a call
  that was in flight may or may not have run, and only its caller can know whether a retry is
  safe.
* Blocking commands (BLPOP...) hold the connection for every call behind them. Keep them off
  this client.
* Metrics (optional, ``on_round_trip`` / ``on_error``): one call at a time is timed, from the
  write of its batch to its reply (a probe on the last call of a batch; of the batches written
  once it answered, every ROUND_TRIP_SAMPLE-th is timed), so the cost is one identity check per
  reply; error replies and lost connections are counted.
* Sentinel (``redis+sentinel://``, :mod:`tubeq.redisio.sentinel`): every connect and reconnect asks
  the sentinels for the master first, and the client checks with ROLE that it reached a master. A
  READONLY reply means the master it is talking to was demoted: the call fails, and the client
  drops the connection so that the reconnect finds the new master. A demoted master does not
  always say so at once: after a failover Sentinel reconfigures a reachable old master only when
  it next looks at it (up to 10 s), and until then it takes writes that the new master will
  never see. So while connected the client asks the sentinels every ``SENTINEL_RECHECK_S`` and
  drops the connection as soon as they name another master.
* Replica acknowledgement (``min_replicas``, opt-in): a call bound with ``durable=True`` resolves
  only once a ``WAIT min_replicas timeout`` sent after it confirms that many replicas have it.
  One WAIT goes at the end of each flushed batch that holds such a call; Redis runs WAIT after
  everything before it, so its answer covers every reply read before its own.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, cast
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis
import structlog

from tubeq.redisio.futures import discard
from tubeq.redisio.sentinel import SCHEME as SENTINEL_SCHEME
from tubeq.redisio.sentinel import SentinelTarget, parse_sentinel_url

Reply: TypeAlias = bytes | int | list["Reply"] | None
Arg: TypeAlias = bytes | str | int | float

log = structlog.get_logger(__name__)

# Backoff between reconnect attempts. 50 ms is short enough for a Redis restart or a killed
# connection to go unnoticed, and 1 s keeps a long outage down to one attempt and one log
# line per second.
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 1.0
# How often a client on a Sentinel endpoint asks the sentinels whether the master moved: the
# longest a demoted master that has not yet been told keeps receiving tubeq's writes.
SENTINEL_RECHECK_S = 1.0
# Bound on the TCP connect plus handshake. Without it a black-holed host hangs for the kernel's
# SYN retry time (about 2 minutes).
CONNECT_TIMEOUT = 5.0
# How long a connection with calls in flight may go without any reply before it is taken for
# stalled (a frozen or overloaded Redis, a half-dead link) and dropped like a lost one: every
# call in flight then fails (it may or may not have run), later calls fail at once until a
# reconnect succeeds. No command tubeq sends runs anywhere near this long in a healthy Redis
# (the longest, a sweep of SWEEP_LIMIT jobs or a FUNCTION LOAD, take milliseconds); --min-replicas
# adds its WAIT timeout. --redis-timeout sets it; 0 turns the bound off.
DEFAULT_CALL_TIMEOUT = 2.0
# Metrics: of the batches written while no round trip is being timed, one in this many is (a
# sample: two clock reads and a histogram step per timed batch, a decrement per other).
ROUND_TRIP_SAMPLE = 8


Decoder: TypeAlias = Callable[[Any], Any]  # applied to a Reply


class ScriptCall(Protocol):
    """A bound script (:meth:`RedisClient.bind_script`): call it with the script's ARGV."""

    def __call__(self, *args: Arg, decode: Decoder | None = None) -> asyncio.Future[Any]: ...


# A command sent and not yet answered: its future, its decoder, and for a script call the EVAL
# source and args to fall back on after NOSCRIPT. A plain tuple: a NamedTuple's constructor
# showed up in the hot path's profile.
_Call: TypeAlias = tuple[
    asyncio.Future[Any], Decoder | None, tuple[bytes, tuple[Arg, ...]] | None]


class RedisReplyError(Exception):
    """An error reply. ``code`` is its first word ("ERR", "NOSCRIPT", "BUSY", ...)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = message.split(" ", 1)[0]


def _no_function(error: RedisReplyError) -> bool:
    """An FCALL that Redis could not run: no such function (its library is not loaded), or no
    FCALL at all (a Redis before 7.0)."""
    return error.code == "ERR" and str(error).startswith(
        ("ERR Function not found", "ERR unknown command 'FCALL'"))


def _log_failed_load(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("loading a function library again failed", error=str(future.exception()))


class RedisConnectionLost(ConnectionError):
    """The connection was lost (or closed) before the reply arrived, or is down right now."""


class RedisNotSent(RedisConnectionLost):
    """There was no connection to send the call on: it did not run."""


def never_ran(error: BaseException) -> bool:
    """Whether a call that failed with ``error`` surely did not run in Redis: Redis refused it
    (an error reply: OOM, MOVED, READONLY ...; tubeq's scripts write nothing before they could
    fail) or it was never sent. A connection lost while the call was out is not such a
    failure: it may have run."""
    return isinstance(error, (RedisReplyError, RedisNotSent))


class ReplicasBehind(Exception):
    """Fewer replicas than ``min_replicas`` acknowledged a write within the timeout. The write
    did happen on the master: only its safety against losing the master is not confirmed."""


def ran(error: BaseException) -> bool | None:
    """Whether a call that failed with ``error`` ran in Redis: False when it surely did not
    (:func:`never_ran`), True when it did and only its replicas are behind
    (:class:`ReplicasBehind`), None when nobody can know (the connection was lost or dropped as
    stalled while the call was out: Redis may have run it before or never)."""
    if never_ran(error):
        return False
    return True if isinstance(error, ReplicasBehind) else None


class _Durable:
    """The decoder of a call that resolves only after a WAIT confirms it (see the header)."""

    __slots__ = ("decode",)

    def __init__(self, decode: Decoder | None) -> None:
        self.decode = decode

    def __call__(self, reply: Any) -> Any:
        return reply if self.decode is None else self.decode(reply)


def encode_command(args: tuple[Arg, ...]) -> bytes:
    """Encode one command as a RESP array of bulk strings. Floats go as ``repr()``."""
    return b"*%d\r\n" % len(args) + encode_bulks(args)


def encode_bulks(args: tuple[Arg, ...]) -> bytes:
    """The bulk strings of a RESP array, without its ``*N`` header."""
    parts = []
    for arg in args:
        # Exact types first: this runs for every argument of every call.
        if type(arg) is bytes:
            data = arg
        elif type(arg) is str:
            data = arg.encode()
        elif type(arg) is int:
            data = b"%d" % arg
        elif isinstance(arg, (bytes, bytearray, memoryview)):
            data = bytes(arg)
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, int):
            data = b"%d" % arg
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            raise TypeError(f"cannot send {type(arg).__name__} to redis: {arg!r}")
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


@dataclass(frozen=True)
class Endpoint:
    """Where to connect and what to send first: ``redis://[[user]:pass@]host[:port][/db]``,
    ``unix:///path/to/socket[?db=N]`` or ``redis+sentinel://h1:p1,h2:p2/master[/db]``."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel: SentinelTarget | None = None  # ask it for host and port before every connect

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        if url.startswith(SENTINEL_SCHEME + "://"):
            rest = url[len(SENTINEL_SCHEME) + 3:]
            netloc, _, tail = rest.partition("/")
            path, _, query = tail.partition("?")
            target, number, user, secret = parse_sentinel_url(netloc, path, query)
            return cls(db=number, username=user, password=secret, sentinel=target)
        parts = urlsplit(url)
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        if parts.scheme == "redis":
            db = parts.path.strip("/")
            return cls(host=parts.hostname or "127.0.0.1", port=parts.port or 6379,
                       db=int(db) if db else 0, username=username, password=password)
        if parts.scheme == "unix" and parts.path:
            db = parse_qs(parts.query).get("db", ["0"])[0]
            return cls(path=parts.path, db=int(db), username=username, password=password)
        raise ValueError(f"unsupported redis url {url!r}: use redis://host:port/db, "
                         f"unix:///path?db=N or {SENTINEL_SCHEME}://host:port,.../master")

    def __str__(self) -> str:
        if self.sentinel is not None:
            return f"{self.sentinel}/{self.db}"
        where = f"unix:{self.path}" if self.path else f"{self.host}:{self.port}"
        return f"{where}/{self.db}"

    def handshake(self) -> list[tuple[Arg, ...]]:
        """The commands that prepare a fresh connection (AUTH, SELECT), in order."""
        commands: list[tuple[Arg, ...]] = []
        if self.password is not None:
            user: tuple[Arg, ...] = (self.username,) if self.username else ()
            commands.append((b"AUTH", *user, self.password))
        if self.db:
            commands.append((b"SELECT", self.db))
        return commands

    async def open(self, protocol: asyncio.Protocol) -> str:
        """Connect ``protocol``; returns where to (the master's address, for Sentinel)."""
        loop = asyncio.get_running_loop()
        if self.path is not None:
            await loop.create_unix_connection(lambda: protocol, self.path)
            return f"unix:{self.path}"
        host, port = (self.host, self.port) if self.sentinel is None else \
            await self.sentinel.discover()
        await loop.create_connection(lambda: protocol, host, port)
        return f"{host}:{port}"


class ReconnectingProtocol(asyncio.Protocol):
    """One Redis connection at a time, re-opened with backoff after a loss until shut down.

    Subclasses get each parsed reply (an error reply as a :class:`RedisReplyError` instance) in
    ``_on_reply``. They prepare a fresh connection in ``_on_open`` and are told of a loss in
    ``_on_lost`` and of a completed reconnect in ``_on_reconnected``. ``connected`` turns true
    only once ``_on_open`` has finished, so nothing is used half-prepared.
    """

    # Whether this connection asks the sentinels every SENTINEL_RECHECK_S if the master moved
    # (the hot-path client does; the subscriber follows it, see Server.start).
    WATCHES_MASTER = False
    # Called when data arrives (the server's idle poll: tubeq.server.idle_poll), if set.
    on_data: Callable[[], None] | None = None

    def __init__(self, url: str) -> None:
        self._endpoint = Endpoint.parse(url)
        self._transport: asyncio.Transport | None = None
        self._reader = hiredis.Reader(replyError=RedisReplyError)
        self._connected = False
        self._closing = False
        self._lost = asyncio.Event()
        self._reconnect_task: asyncio.Task[None] | None = None
        self._address = ""  # where the current connection goes (the master, for Sentinel)
        self._watch_task: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        return self._connected

    def _on_reply(self, reply: Reply | RedisReplyError) -> None:
        raise NotImplementedError

    async def _on_open(self) -> None:
        """Prepare the fresh connection; raise to reject it."""

    def _on_lost(self, exc: Exception | None) -> None:
        """The connection is gone (``_transport`` is already None)."""

    def _on_reconnected(self) -> None:
        """A reconnect (not the first connect) completed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports do not subclass asyncio.Transport.
        self._transport = cast(asyncio.Transport, transport)
        self._reader = hiredis.Reader(replyError=RedisReplyError)
        self._lost.clear()

    def data_received(self, data: bytes) -> None:
        if (on_data := self.on_data) is not None:
            on_data()
        self._reader.feed(data)
        try:
            while (reply := self._reader.gets()) is not False:
                self._on_reply(reply)
        except hiredis.ProtocolError as exc:
            log.error("redis protocol error, dropping the connection",
                      endpoint=str(self._endpoint), error=str(exc))
            if self._transport is not None:
                self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        was_connected = self._connected
        self._transport = None
        self._connected = False
        self._lost.set()
        self._on_lost(exc)
        # A loss during _open() (first connect or a reconnect attempt) is reported by _open()
        # raising; only the loss of an established connection starts a reconnect loop.
        if was_connected and not self._closing:
            log.warning("redis connection lost", endpoint=str(self._endpoint),
                        error=repr(exc) if exc else None)
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _open(self) -> None:
        """Connect and run ``_on_open``; raises OSError (incl. RedisConnectionLost,
        TimeoutError) or RedisReplyError if either fails."""
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                self._address = await self._endpoint.open(self)
                self._check_open()
                await self._on_open()
            self._check_open()
        except BaseException:
            if self._transport is not None:
                self._transport.abort()
            raise
        self._connected = True
        if self._endpoint.sentinel is not None and self.WATCHES_MASTER and \
                self._watch_task is None:
            self._watch_task = asyncio.get_running_loop().create_task(self._watch_master())

    async def _watch_master(self) -> None:
        """Drop the connection when the sentinels name a master other than the one we are on
        (see the module header); runs until shutdown."""
        assert self._endpoint.sentinel is not None
        while not self._closing:
            await asyncio.sleep(SENTINEL_RECHECK_S)
            if not self._connected:
                continue
            try:
                host, port = await self._endpoint.sentinel.discover()
            except OSError:
                continue  # no sentinel could tell: keep what we have
            if self._connected and f"{host}:{port}" != self._address:
                log.warning("the sentinels name another master: reconnecting",
                            endpoint=str(self._endpoint), was=self._address, now=f"{host}:{port}")
                self.drop()

    def drop(self) -> None:
        """Abort the current connection (the reconnect loop takes over), e.g. to follow a
        failover."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()

    def follow(self, address: str) -> None:
        """Reconnect if connected anywhere but ``address`` (another connection moved there)."""
        if self._connected and self._address != address:
            log.info("following the master", endpoint=str(self._endpoint), was=self._address,
                     now=address)
            self.drop()

    def _check_open(self) -> None:
        # connection_lost may run between any two awaits of _open(), e.g. on an immediate EOF.
        if self._transport is None:
            raise RedisConnectionLost(f"connection to {self._endpoint} lost while opening")

    async def _reconnect(self) -> None:
        delay = BACKOFF_FIRST
        while True:
            await asyncio.sleep(delay)
            try:
                await self._open()
            except (OSError, RedisReplyError) as exc:
                delay = min(delay * 2, BACKOFF_MAX)
                log.warning("redis reconnect failed", endpoint=str(self._endpoint),
                            error=repr(exc), retry_in=delay)
                continue
            log.info("redis reconnected", endpoint=str(self._endpoint), address=self._address)
            self._on_reconnected()
            return

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    async def _shutdown(self) -> None:
        """Stop reconnecting and close the connection; returns once it is gone."""
        self._closing = True
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.wait([self._watch_task])
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
            await asyncio.wait([self._reconnect_task])
        if self._transport is not None:
            self._transport.close()
            await self._lost.wait()


class RedisClient(ReconnectingProtocol):
    """Auto-pipelining client on one connection. Create it with :meth:`connect`."""

    WATCHES_MASTER = True

    def __init__(self, url: str, *, flush_at: int = 16, min_replicas: int = 0,
                 replicas_timeout_ms: int = 1000,
                 call_timeout: float = DEFAULT_CALL_TIMEOUT) -> None:
        if flush_at < 1:
            raise ValueError("flush_at must be at least 1")
        if min_replicas < 0 or replicas_timeout_ms < 0 or call_timeout < 0:
            raise ValueError("min_replicas, replicas_timeout_ms and call_timeout must not be "
                             "negative")
        super().__init__(url)
        # The stall bound (see DEFAULT_CALL_TIMEOUT), checked by a timer every quarter of it:
        # no reply for that long while calls are in flight drops the connection. A counter of
        # replies is all the hot path pays.
        self.call_timeout = call_timeout + (replicas_timeout_ms / 1000 if min_replicas else 0)
        self._replies_seen = 0
        self._replies_at_check = 0
        self._progress_at = 0.0
        self._stall_check: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self._flush_at = flush_at
        self._pending: deque[_Call] = deque()
        self._unsent: list[bytes] = []
        self._flush_scheduled = False
        self._reconnect_callbacks: list[Callable[[], None]] = []
        # Function libraries (name -> source) the callers loaded: loaded again first thing after
        # every reconnect (once each, however many callers use them), and when a call finds its
        # function missing (a Redis flushed under a live connection), one load at a time.
        self.libraries: dict[str, bytes] = {}
        self._reloading = False
        # Metrics hooks (tubeq.server.metrics): a round trip in seconds; an error's kind.
        self.on_round_trip: Callable[[float], None] | None = None
        self.on_error: Callable[[str], None] | None = None
        # Redis Cluster (tubeq.redisio.cluster): told when a reply says a slot lives elsewhere
        # (MOVED, ASK); the call itself fails like any error reply.
        self.on_moved: Callable[[], None] | None = None
        self._probe: asyncio.Future[Any] | None = None  # the call being timed
        self._probe_sent = 0.0
        self._probe_skip = 0  # batches to write before the next one timed
        self.min_replicas = min_replicas
        self._wait_command = encode_command((b"WAIT", min_replicas, replicas_timeout_ms))
        self._needs_wait = False  # a durable call went into _unsent since the last WAIT
        self._unconfirmed: list[tuple[asyncio.Future[Any], Any]] = []  # replied, not yet WAITed

    @classmethod
    async def connect(cls, url: str, *, flush_at: int = 16, min_replicas: int = 0,
                      replicas_timeout_ms: int = 1000,
                      call_timeout: float = DEFAULT_CALL_TIMEOUT) -> RedisClient:
        """Connect (and AUTH/SELECT) once; raises OSError or RedisReplyError if that fails."""
        client = cls(url, flush_at=flush_at, min_replicas=min_replicas,
                     replicas_timeout_ms=replicas_timeout_ms, call_timeout=call_timeout)
        await client._open()
        client._check_stalls()
        return client

    def _check_stalls(self) -> None:
        """Drop the connection when calls have been in flight with no reply for
        ``call_timeout``; runs every quarter of it until shutdown."""
        self._stall_check = None
        if self._closing or not self.call_timeout:
            return
        now = self._loop.time()
        if not self._pending or self._replies_seen != self._replies_at_check \
                or not self._connected:
            self._progress_at = now
        elif now - self._progress_at >= self.call_timeout and self._transport is not None:
            log.warning("redis did not answer in time: dropping the connection",
                        endpoint=str(self._endpoint), waited_s=round(now - self._progress_at, 2),
                        calls_in_flight=len(self._pending))
            self._progress_at = now
            self._transport.abort()
        self._replies_at_check = self._replies_seen
        self._stall_check = self._loop.call_later(self.call_timeout / 4, self._check_stalls)

    @property
    def address(self) -> str:
        """Where the current (or last) connection goes: for Sentinel, the master's address."""
        return self._address

    def call(self, *args: Arg, decode: Decoder | None = None) -> asyncio.Future[Any]:
        """Send one command; the future resolves to its reply (``decode(reply)`` if given) or
        fails with RedisReplyError or RedisConnectionLost."""
        if not self._connected:
            future: asyncio.Future[Any] = self._loop.create_future()
            future.set_exception(RedisNotSent(f"not connected to {self._endpoint}"))
            return future
        return self._send(args, decode)

    def call_script(self, sha: str, source: bytes, *args: Arg,
                    decode: Decoder | None = None) -> asyncio.Future[Any]:
        """EVALSHA ``sha`` with ``args`` (numkeys first); on NOSCRIPT, EVAL ``source`` instead,
        into the same future."""
        future = self.call("EVALSHA", sha, *args, decode=decode)
        if not future.done():
            self._pending[-1] = (future, decode, (source, args))
        return future

    def bind_script(self, sha: str, source: bytes, keys: tuple[Arg, ...],
                    bound: tuple[Arg, ...] = (), *, durable: bool = False,
                    function: str | None = None) -> ScriptCall:
        """``call_script`` for one script and fixed keys, its EVALSHA head encoded once (the
        same sha and keys go out call after call on the hot path). ``bound`` arguments are
        fixed too: every call's ARGV starts with them, at no cost per call. ``durable``: with
        ``min_replicas``, each call resolves only once that many replicas acknowledged it.
        ``function``: call the script as that library function (FCALL), the script's source
        the fallback."""
        eval_head: tuple[Arg, ...] = (len(keys), *keys, *bound)
        head = encode_bulks(("EVALSHA", sha, *eval_head) if function is None
                            else ("FCALL", function, *eval_head))
        fixed = 2 + len(eval_head)
        if durable and self.min_replicas:
            return self._bind_durable(sha, source, eval_head, head, fixed)

        def call(*args: Arg, decode: Decoder | None = None) -> asyncio.Future[Any]:
            if not self._connected:
                return self.call("EVALSHA", sha, *eval_head, *args)  # fails at once
            data = b"*%d\r\n%s%s" % (fixed + len(args), head, encode_bulks(args))
            return self._send_encoded(data, decode, (source, eval_head + args))

        return call

    def _bind_durable(self, sha: str, source: bytes, eval_head: tuple[Arg, ...], head: bytes,
                      fixed: int) -> ScriptCall:
        def call(*args: Arg, decode: Decoder | None = None) -> asyncio.Future[Any]:
            if not self._connected:
                return self.call("EVALSHA", sha, *eval_head, *args)  # fails at once
            data = b"*%d\r\n%s%s" % (fixed + len(args), head, encode_bulks(args))
            self._needs_wait = True
            return self._send_encoded(data, _Durable(decode), (source, eval_head + args))

        return call

    async def execute(self, *args: Arg) -> Reply:
        """``await call(*args)``."""
        reply: Reply = await self.call(*args)
        return reply

    def add_reconnect_callback(self, cb: Callable[[], None]) -> None:
        """Call ``cb()`` after every successful reconnect (not after the first connect)."""
        self._reconnect_callbacks.append(cb)

    async def close(self) -> None:
        """Close for good: pending and later calls fail with RedisConnectionLost."""
        if self._stall_check is not None:
            self._stall_check.cancel()
            self._stall_check = None
        await self._shutdown()

    def _send(self, args: tuple[Arg, ...], decode: Decoder | None = None,
              future: asyncio.Future[Any] | None = None) -> asyncio.Future[Any]:
        # Encode before taking a reply slot: a TypeError must not leave a slot without a command.
        return self._send_encoded(encode_command(args), decode, None, future)

    def _send_encoded(self, data: bytes, decode: Decoder | None,
                      fallback: tuple[bytes, tuple[Arg, ...]] | None,
                      future: asyncio.Future[Any] | None = None) -> asyncio.Future[Any]:
        self._unsent.append(data)
        if future is None:
            future = self._loop.create_future()
        self._pending.append((future, decode, fallback))
        if len(self._unsent) >= self._flush_at:
            self._flush()
        else:
            self._schedule_flush()
        return future

    def send_now(self) -> None:
        """Write the calls buffered so far at once, not at the end of the loop's turn: for a
        caller with more work of its own before the turn ends, so that Redis runs them
        meanwhile."""
        self._flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_at_tick_end)

    def _flush_at_tick_end(self) -> None:
        self._flush_scheduled = False
        self._flush()

    def _flush(self) -> None:
        if self._needs_wait:
            self._needs_wait = False
            self._unsent.append(self._wait_command)
            waited: asyncio.Future[Any] = self._loop.create_future()
            waited.add_done_callback(discard)  # its outcome goes to the calls it covers
            self._pending.append((waited, self._confirm, None))
        if self._unsent:
            self._write(b"".join(self._unsent))
            self._unsent.clear()
            if self._probe is None and self.on_round_trip is not None and self._pending:
                if self._probe_skip:
                    self._probe_skip -= 1
                else:
                    self._probe_skip = ROUND_TRIP_SAMPLE - 1
                    self._probe = self._pending[-1][0]
                    self._probe_sent = time.perf_counter()

    async def _on_open(self) -> None:
        # The PING makes "connected" mean "Redis answered": a peer that accepts and then drops
        # connections (a dying proxy) fails here and backs off, instead of counting as a
        # reconnect every 50 ms.
        await asyncio.gather(*(self._send(command)
                               for command in [*self._endpoint.handshake(), (b"PING",)]))
        if self._endpoint.sentinel is not None:
            # A sentinel may still name the old master for a moment after a failover.
            role = await self._send((b"ROLE",))
            if not (isinstance(role, list) and role and role[0] == b"master"):
                raise RedisConnectionLost(f"{self._address} is not the master (yet)")

    def _confirm(self, replicas: Any) -> None:
        """A WAIT's answer: settle every durable call replied before it."""
        unconfirmed, self._unconfirmed = self._unconfirmed, []
        error = None
        if int(replicas) < self.min_replicas:
            error = ReplicasBehind(f"{replicas} of {self.min_replicas} replicas acknowledged "
                                   "in time")
        for future, value in unconfirmed:
            if future.done():
                continue
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)

    def _fail_unconfirmed(self, error: Exception) -> None:
        unconfirmed, self._unconfirmed = self._unconfirmed, []
        for future, _ in unconfirmed:
            if not future.done():
                future.set_exception(error)

    def _on_reply(self, reply: Reply | RedisReplyError) -> None:
        self._replies_seen += 1
        if not self._pending:  # a bug somewhere: nothing on this stream can be trusted now
            if self._transport is not None and not self._transport.is_closing():
                log.error("redis reply with no pending call, dropping the connection",
                          endpoint=str(self._endpoint))
                self._transport.abort()
            return
        future, decode, fallback = self._pending.popleft()
        if future is self._probe:
            self._probe = None
            if self.on_round_trip is not None:
                self.on_round_trip(time.perf_counter() - self._probe_sent)
        if future.done():  # cancelled: the reply was only read to keep the stream in step
            return
        if isinstance(reply, RedisReplyError):
            if fallback is not None and (reply.code == "NOSCRIPT" or _no_function(reply)):
                source, args = fallback
                if str(reply).startswith("ERR Function not found"):
                    self._reload_libraries()
                if type(decode) is _Durable:
                    self._needs_wait = True
                self._send(("EVAL", source, *args), decode, future)
            else:
                if self.on_error is not None:
                    self.on_error(reply.code)
                future.set_exception(reply)
                if decode == self._confirm:  # the WAIT itself failed
                    self._fail_unconfirmed(reply)
                elif reply.code == "READONLY" and self._endpoint.sentinel is not None:
                    self._demoted()
                elif reply.code in ("MOVED", "ASK") and self.on_moved is not None:
                    self.on_moved()
        elif decode is None:
            future.set_result(reply)
        else:
            try:
                value = decode(reply)
            except Exception as error:  # a reply of an unexpected shape
                future.set_exception(error)
                return
            if type(decode) is _Durable:
                self._unconfirmed.append((future, value))
            else:
                future.set_result(value)

    def _reload_libraries(self) -> None:
        if self._reloading or not self.libraries:
            return
        self._reloading = True

        def done(future: asyncio.Future[Any]) -> None:
            self._reloading = False
            _log_failed_load(future)

        for source in self.libraries.values():
            self._send(("FUNCTION", "LOAD", "REPLACE", source)).add_done_callback(done)

    def _demoted(self) -> None:
        # The server we write to became a replica (a failover): reconnecting asks the
        # sentinels again. Pending calls fail with RedisConnectionLost as on any loss.
        if self._transport is not None and not self._transport.is_closing():
            log.warning("redis answered READONLY: the master was demoted, reconnecting",
                        endpoint=str(self._endpoint), address=self._address)
            self.drop()

    def _on_lost(self, exc: Exception | None) -> None:
        reason = f"connection to {self._endpoint} lost" + (f": {exc}" if exc else "")
        self._unsent.clear()
        self._probe = None
        if self.on_error is not None:
            self.on_error("connection_lost")
        self._needs_wait = False
        self._fail_unconfirmed(RedisConnectionLost(reason))
        pending, self._pending = self._pending, deque()
        for future, _, _ in pending:
            if not future.done():
                future.set_exception(RedisConnectionLost(reason))

    def _on_reconnected(self) -> None:
        # Before any caller's command on the fresh connection: a Redis restarted empty has
        # no functions.
        for source in self.libraries.values():
            self._send(("FUNCTION", "LOAD", "REPLACE", source)).add_done_callback(
                _log_failed_load)
        for callback in list(self._reconnect_callbacks):
            try:
                callback()
            except Exception:
                log.exception("redis reconnect callback failed", callback=repr(callback))
