"""tubeq.redisio.client against the private Redis: reply order and types, errors, write batching,
cancellation, and connection loss (CLIENT KILL, a relay that goes down and comes back)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from tubeq.redisio.client import (
    Endpoint,
    RedisClient,
    RedisConnectionLost,
    RedisReplyError,
    encode_command,
)
from tubeq.redisio.process import free_port

WAIT = 5.0  # bound on every wait; none of these tests measures time


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[RedisClient]:
    client = await RedisClient.connect(redis_url)
    yield client
    await client.close()


@pytest.fixture
async def admin(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A redis-py connection to the same private Redis, for checks and CLIENT KILL."""
    admin = redis.asyncio.Redis.from_url(redis_url)
    yield admin
    await admin.aclose()


def with_db(url: str, db: int) -> str:
    return url.rsplit("/", 1)[0] + f"/{db}"


async def until(condition: Callable[[], bool | Awaitable[bool]]) -> None:
    """Poll ``condition`` (plain or async) until it holds, for at most WAIT seconds."""
    async def holds() -> bool:
        result = condition()
        return await result if inspect.isawaitable(result) else result

    async def poll() -> None:
        while not await holds():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), WAIT)


def test_encode_command() -> None:
    assert encode_command((b"SET", "k\u00e9", 42, -1, 1.5)) == (
        b"*5\r\n$3\r\nSET\r\n$3\r\nk\xc3\xa9\r\n$2\r\n42\r\n$2\r\n-1\r\n$3\r\n1.5\r\n")
    assert encode_command((0.1, 1e300)) == b"*2\r\n$3\r\n0.1\r\n$6\r\n1e+300\r\n"
    with pytest.raises(TypeError):
        encode_command((None,))  # type: ignore[arg-type]


def test_endpoint_parse() -> None:
    tcp = Endpoint.parse("redis://127.0.0.1:7000/3")
    assert (tcp.host, tcp.port, tcp.path, tcp.db) == ("127.0.0.1", 7000, None, 3)
    assert tcp.handshake() == [(b"SELECT", 3)]
    assert Endpoint.parse("redis://127.0.0.1:7000").handshake() == []
    unix = Endpoint.parse("unix:///run/redis.sock?db=2")
    assert (unix.path, unix.db) == ("/run/redis.sock", 2)
    secret = Endpoint.parse("redis://app:p%40ss@127.0.0.1:7000/0")
    assert secret.handshake() == [(b"AUTH", "app", "p@ss")]
    assert "p@ss" not in repr(secret) and "p@ss" not in str(secret)
    with pytest.raises(ValueError):
        Endpoint.parse("rediss://127.0.0.1:7000/0")


async def test_replies_resolve_in_call_order(client: RedisClient) -> None:
    echoes = await asyncio.gather(*(client.execute("ECHO", i) for i in range(2000)))
    assert echoes == [str(i).encode() for i in range(2000)]

    async def worker(n: int) -> None:
        for k in range(50):
            assert await client.execute("ECHO", f"{n}:{k}") == f"{n}:{k}".encode()
            assert await client.execute("INCR", f"counter:{n}") == k + 1

    await asyncio.wait_for(asyncio.gather(*(worker(n) for n in range(64))), WAIT)


async def test_reply_types(client: RedisClient) -> None:
    assert await client.execute("SET", "k", b"\x00\xff") == b"OK"
    assert await client.execute("GET", "k") == b"\x00\xff"
    assert await client.execute("GET", "missing") is None
    assert await client.execute("INCRBY", "n", -5) == -5
    assert await client.execute("INCRBYFLOAT", "f", 0.25) == b"0.25"
    assert await client.execute("RPUSH", "l", "a", "b") == 2
    assert await client.execute("LRANGE", "l", 0, -1) == [b"a", b"b"]
    assert await client.execute("LRANGE", "missing", 0, -1) == []


async def test_eval_returns_nested_arrays(client: RedisClient) -> None:
    script = "return {1, 'two', {3, {'four', false}}, {}, 5.9}"
    assert await client.execute("EVAL", script, 0) == [1, b"two", [3, [b"four", None]], [], 5]


async def test_error_replies_carry_their_code(client: RedisClient) -> None:
    await client.execute("SET", "s", "not a number")
    with pytest.raises(RedisReplyError) as err:
        await client.execute("INCR", "s")
    assert err.value.code == "ERR"
    assert "not an integer" in str(err.value)
    with pytest.raises(RedisReplyError) as err:
        await client.execute("LPUSH", "s", "x")
    assert err.value.code == "WRONGTYPE"
    with pytest.raises(RedisReplyError) as err:
        await client.execute("EVAL", "return redis.error_reply('TUBEQ_GONE job 7')", 0)
    assert (err.value.code, str(err.value)) == ("TUBEQ_GONE", "TUBEQ_GONE job 7")
    # Errors take their slot like any reply: the calls around them still get their own.
    results = await asyncio.gather(client.execute("ECHO", "a"), client.execute("NOSUCHCMD"),
                                   client.execute("ECHO", "b"), return_exceptions=True)
    assert results[0] == b"a" and results[2] == b"b"
    assert isinstance(results[1], RedisReplyError) and results[1].code == "ERR"


async def test_bound_script_sends_its_keys_and_args_and_falls_back_to_eval(
        client: RedisClient) -> None:
    source = b"return {KEYS[1], ARGV[1], ARGV[2]}"
    unknown = client.bind_script("0" * 40, source, ("key",))  # NOSCRIPT: EVAL of the source
    assert await unknown(b"a", 7) == [b"key", b"a", b"7"]
    sha = await client.execute("SCRIPT", "LOAD", source)
    assert isinstance(sha, bytes)
    bound = client.bind_script(sha.decode(), source, ("key",))
    assert await bound("b", 8, decode=len) == 3
    assert await asyncio.gather(bound("c", 1), bound("d", 2)) == [[b"key", b"c", b"1"],
                                                                  [b"key", b"d", b"2"]]


async def test_evalsha_of_unknown_script_is_noscript(client: RedisClient) -> None:
    with pytest.raises(RedisReplyError) as err:
        await client.execute("EVALSHA", "0" * 40, 0)
    assert err.value.code == "NOSCRIPT"
    sha = await client.execute("SCRIPT", "LOAD", "return 1")
    assert isinstance(sha, bytes)
    assert await client.execute("EVALSHA", sha, 0) == 1


class CountingTransport:
    """Wraps the client's transport and records every write."""

    def __init__(self, inner: asyncio.Transport) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize(("flush_at", "calls_per_write"), [
    (16, [16] * 6 + [4]),   # six writes as the buffer fills, the rest at the end of the tick
    (1000, [100]),          # one write at the end of the tick
    (1, [1] * 100),         # every call written at once
])
async def test_calls_in_one_tick_are_batched(redis_url: str, flush_at: int,
                                             calls_per_write: list[int]) -> None:
    client = await RedisClient.connect(redis_url, flush_at=flush_at)
    counter = CountingTransport(client._transport)  # type: ignore[arg-type]
    client._transport = counter  # type: ignore[assignment]
    try:
        futures = [client.call("ECHO", f"{i:03d}") for i in range(100)]  # no await: one tick
        echoes = await asyncio.wait_for(asyncio.gather(*futures), WAIT)
        assert echoes == [f"{i:03d}".encode() for i in range(100)]
        assert [write.count(b"ECHO") for write in counter.writes] == calls_per_write
        assert b"".join(counter.writes) == b"".join(
            encode_command(("ECHO", f"{i:03d}")) for i in range(100))
    finally:
        await client.close()


async def test_send_now_writes_the_calls_buffered_so_far_before_the_tick_ends(
        redis_url: str) -> None:
    client = await RedisClient.connect(redis_url, flush_at=1000)
    counter = CountingTransport(client._transport)  # type: ignore[arg-type]
    client._transport = counter  # type: ignore[assignment]
    try:
        first = [client.call("ECHO", f"a{i}") for i in range(3)]
        client.send_now()
        assert [write.count(b"ECHO") for write in counter.writes] == [3]  # within the tick
        client.send_now()  # nothing buffered: nothing written
        later = client.call("ECHO", "b")  # buffered again until the tick ends
        assert len(counter.writes) == 1
        replies = await asyncio.wait_for(asyncio.gather(*first, later), WAIT)
        assert replies == [b"a0", b"a1", b"a2", b"b"]
        assert [write.count(b"ECHO") for write in counter.writes] == [3, 1]
    finally:
        await client.close()


async def test_cancelled_calls_do_not_desync(client: RedisClient, admin: redis.asyncio.Redis
                                             ) -> None:
    futures = [client.call("ECHO", i) for i in range(60)]
    for future in futures[::3]:
        future.cancel()
    kept = [(i, f) for i, f in enumerate(futures) if i % 3]
    assert await asyncio.gather(*(f for _, f in kept)) == [str(i).encode() for i, _ in kept]

    # A cancelled task awaiting a blocked call: its reply comes later and must be dropped, not
    # handed to the call queued behind it.
    blocked = asyncio.create_task(client.execute("BLPOP", "jobs", 0))
    await asyncio.sleep(0)
    blocked.cancel()
    behind = client.call("ECHO", "behind")
    await admin.rpush("jobs", "for the cancelled BLPOP")
    assert await asyncio.wait_for(behind, WAIT) == b"behind"
    assert blocked.cancelled()
    assert await admin.llen("jobs") == 0  # the BLPOP did run; its reply was read and dropped


@pytest.mark.parametrize("kill_by", ["ID", "TYPE normal"])
async def test_connection_loss_fails_pending_calls_then_reconnects(
        redis_url: str, admin: redis.asyncio.Redis, kill_by: str) -> None:
    client = await RedisClient.connect(with_db(redis_url, 3))
    reconnects: list[int] = []
    reconnected = asyncio.Event()

    def on_reconnect() -> None:
        reconnects.append(1)
        reconnected.set()

    client.add_reconnect_callback(on_reconnect)
    try:
        await client.execute("SET", "before", 1)
        old_id = await client.execute("CLIENT", "ID")
        assert isinstance(old_id, int)
        pending = [client.call("BLPOP", "never", 0), *(client.call("ECHO", i) for i in range(10))]
        await asyncio.sleep(0)  # let the end-of-tick flush write them
        # The admin connection itself is spared: CLIENT KILL defaults to SKIPME yes.
        if kill_by == "ID":
            assert await admin.client_kill_filter(_id=str(old_id)) == 1
        else:
            assert await admin.client_kill_filter(_type="normal") == 1
        for future in pending:
            with pytest.raises(RedisConnectionLost):
                await asyncio.wait_for(future, WAIT)

        # Down (the first reconnect attempt is 50 ms away): calls fail at once, never wait.
        assert not client.connected
        down = client.call("PING")
        assert down.done()
        with pytest.raises(RedisConnectionLost):
            down.result()

        await asyncio.wait_for(reconnected.wait(), WAIT)
        assert client.connected and reconnects == [1]
        assert await client.execute("CLIENT", "ID") != old_id
        await client.execute("SET", "after", 2)  # still in db 3: SELECT is replayed
        db3 = redis.asyncio.Redis.from_url(with_db(redis_url, 3))
        try:
            assert await db3.mget("before", "after") == [b"1", b"2"]
        finally:
            await db3.aclose()
    finally:
        await client.close()


async def test_close_fails_pending_and_later_calls(client: RedisClient) -> None:
    pending = client.call("BLPOP", "never", 0)
    await asyncio.sleep(0)
    await asyncio.wait_for(client.close(), WAIT)
    with pytest.raises(RedisConnectionLost):
        await pending
    assert not client.connected
    with pytest.raises(RedisConnectionLost):
        await client.execute("PING")
    with pytest.raises(RedisConnectionLost):
        await client.bind_script("0" * 40, b"return 1", ("k",))("arg")


async def test_connect_to_nothing_fails_fast() -> None:
    with pytest.raises(OSError):
        await asyncio.wait_for(RedisClient.connect(f"redis://127.0.0.1:{free_port()}/0"), WAIT)


class Relay:
    """A loopback relay to the private Redis that a test can cut, take down and hold back.

    ``drop()`` cuts the current connections. While ``relaying`` is false it accepts and at once
    drops every new connection, counting them in ``refused``, so reconnect attempts are visible
    without timing anything. While ``holding`` is true, bytes from clients to Redis are kept in
    ``held`` until ``release()``: a test can see what a client sent before Redis answers it.
    Tests of this module and of tubeq.redisio.pubsub share it.
    """

    def __init__(self, redis_url: str) -> None:
        endpoint = Endpoint.parse(redis_url)
        self.target = (endpoint.host, endpoint.port)
        self.relaying = True
        self.refused = 0
        self.holding = False
        self.held: list[tuple[asyncio.StreamWriter, bytes]] = []
        self.links: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start_tcp(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def start_unix(self, path: Path) -> str:
        self.server = await asyncio.start_unix_server(self._accept, str(path))
        return f"unix://{path}?db=2"

    def drop(self) -> None:
        for writer in self.links:
            writer.transport.abort()
        self.links.clear()

    def down(self) -> None:
        self.relaying = False
        self.drop()

    def held_bytes(self) -> bytes:
        return b"".join(data for _, data in self.held)

    def release(self) -> None:
        self.holding = False
        for writer, data in self.held:
            writer.write(data)
        self.held.clear()

    async def close(self) -> None:
        self.down()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.relaying:
            self.refused += 1
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.links += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer, upstream=True),
                             self._pipe(up_reader, writer, upstream=False))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    upstream: bool) -> None:
        try:
            while data := await reader.read(65536):
                if upstream and self.holding:
                    self.held.append((writer, data))
                    continue
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.transport.abort()


async def test_calls_fail_fast_while_redis_is_unreachable_and_recover(redis_url: str) -> None:
    relay = Relay(redis_url)
    client = await RedisClient.connect(await relay.start_tcp())
    reconnects: list[int] = []
    client.add_reconnect_callback(lambda: reconnects.append(1))
    try:
        blocked = client.call("BLPOP", "never", 0)
        await asyncio.sleep(0)
        relay.down()
        with pytest.raises(RedisConnectionLost):
            await asyncio.wait_for(blocked, WAIT)

        await until(lambda: relay.refused >= 3)  # attempts keep coming, with backoff; all fail
        assert not client.connected and reconnects == []
        with pytest.raises(RedisConnectionLost):
            client.call("PING").result()

        relay.relaying = True

        await until(lambda: client.connected)
        assert reconnects == [1]
        assert await client.execute("PING") == b"PONG"

        relay.refused = 0
        relay.down()  # close() while reconnect attempts are failing must not hang
        await until(lambda: relay.refused >= 1)
    finally:
        await asyncio.wait_for(client.close(), WAIT)
        await relay.close()
    with pytest.raises(RedisConnectionLost):
        await client.execute("PING")


async def test_unix_socket_url_with_db(redis_url: str, tmp_path: Path) -> None:
    relay = Relay(redis_url)
    client = await RedisClient.connect(await relay.start_unix(tmp_path / "redis.sock"))
    try:
        await client.execute("SET", "via-unix", "yes")
        db2 = redis.asyncio.Redis.from_url(with_db(redis_url, 2))
        try:
            assert await db2.get("via-unix") == b"yes"
        finally:
            await db2.aclose()
    finally:
        await client.close()
        await relay.close()


async def test_reconnect_counts_only_once_the_handshake_is_answered(redis_url: str) -> None:
    relay = Relay(redis_url)
    client = await RedisClient.connect(with_db(await relay.start_tcp(), 5))
    reconnects: list[int] = []
    client.add_reconnect_callback(lambda: reconnects.append(1))
    try:
        relay.holding = True
        relay.drop()

        await until(lambda: relay.held_bytes().endswith(encode_command(("PING",))))
        assert relay.held_bytes() == encode_command((b"SELECT", 5)) + encode_command(("PING",))
        # Connected at the TCP level, but Redis has not answered: not connected yet.
        assert not client.connected and reconnects == []
        with pytest.raises(RedisConnectionLost):
            client.call("PING").result()

        relay.release()

        await until(lambda: client.connected)
        assert reconnects == [1]
        info = await client.execute("CLIENT", "INFO")
        assert isinstance(info, bytes) and b" db=5 " in info
    finally:
        await client.close()
        await relay.close()
