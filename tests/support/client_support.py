"""Client test helpers: a scripted fake server, and a TCP proxy whose connections can be cut.

Both listen on a free loopback port of their own and are closed by the test that opened them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from tubeq.client import Client, Stats

LOOPBACK = "127.0.0.1"
# Every wait in these tests is bounded by one of these; none is asserted as a duration.
WAIT_S = 10.0
POLL_S = 0.02


@dataclass(frozen=True)
class Close:
    """A fake server's answer: write ``data``, then close the connection."""

    data: bytes = b""


Respond = Callable[[bytes], "bytes | Close"]


class FakeServer:
    """Answers each command line (a put's body is read and dropped) with ``respond(line)``."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.connections = 0
        self.lines: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> FakeServer:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    def client(self, **options: object) -> Client:
        return Client(LOOPBACK, self.port, **options)  # type: ignore[arg-type]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            while True:
                line = (await reader.readuntil(b"\r\n"))[:-2]
                self.lines.append(line)
                if line.startswith(b"put "):
                    await reader.readexactly(int(line.split()[-1]) + 2)
                answer = self.respond(line)
                if isinstance(answer, Close):
                    writer.write(answer.data)
                    await writer.drain()
                    break
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


class Proxy:
    """Forwards loopback connections to a server; :meth:`cut` drops every current one."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        await self._server.wait_closed()

    def cut(self) -> None:
        for down, up in list(self._pairs):
            down.transport.abort()
            up.transport.abort()
        self._pairs.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        pair = (writer, up_writer)
        self._pairs.add(pair)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        try:
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        finally:
            self._pairs.discard(pair)


async def eventually(check: Callable[[], Awaitable[bool]], what: str,
                     timeout: float = WAIT_S) -> None:
    """Wait (bounded) until ``check()`` is true; fail with ``what`` otherwise."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"not within {timeout:g} s: {what}") from None


async def tube_settles(admin: Client, tube: str, **expected: int) -> Stats:
    """Wait until stats-tube shows ``expected`` (keys with '_' for '-'); return the stats."""
    want = {key.replace("_", "-"): value for key, value in expected.items()}
    last: Stats = {}

    async def check() -> bool:
        nonlocal last
        last = await admin.stats_tube(tube)
        return all(last[key] == value for key, value in want.items())

    try:
        await eventually(check, f"stats-tube {tube} shows {want}")
    except AssertionError as error:
        raise AssertionError(f"{error}; last seen {last}") from None
    return last


@contextlib.asynccontextmanager
async def connected(host: str, port: int, *tubes: str) -> AsyncIterator[Client]:
    """A client that uses and watches ``tubes[0]`` (and watches the rest), not ``default``."""
    async with Client(host, port) as client:
        if tubes:
            await client.use(tubes[0])
            for tube in tubes:
                await client.watch(tube)
            await client.ignore("default")
        yield client
