"""Helpers for the HTTP listener's tests: an in-process tubeq with its HTTP listener on free
ports (real sockets, the session's private Redis), a text-protocol client, and a scrape parser."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tubeq.http import HttpListener
from tubeq.server.process import Config, Server


@asynccontextmanager
async def running_server(redis_url: str, **config: Any) -> AsyncIterator[Server]:
    """A tubeq on 127.0.0.1 with its HTTP listener, both on ports the OS picks."""
    server = Server(Config(host="127.0.0.1", port=0, redis_url=redis_url,
                           prefix=f"http-{secrets.token_hex(4)}", http_host="127.0.0.1",
                           http_port=0, **config), http=HttpListener)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class Beanstalk:
    """A bare text-protocol connection: send a command, read its reply."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Beanstalk:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def ask(self, line: bytes, body: bytes | None = None) -> bytes:
        """Send one command (and a put's body); the reply line, with its data if it has some."""
        self.writer.write(line + b"\r\n" + (b"" if body is None else body + b"\r\n"))
        reply = await self.reader.readline()
        words = reply.split()
        if words and words[0] in (b"RESERVED", b"FOUND", b"OK"):
            reply += await self.reader.readexactly(int(words[-1]) + 2)
        return reply

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(session: aiohttp.ClientSession, base: str) -> Samples:
    """GET /metrics parsed: (sample name, sorted labels) -> value."""
    async with session.get(f"{base}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def sample(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; a missing sample fails the test with its name."""
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"no sample {name}{labels}"
    return samples[key]
