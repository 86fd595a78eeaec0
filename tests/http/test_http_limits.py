"""What a hostile but ordinary HTTP client can hold or provoke (issue 35), against a real tubeq:
its timeouts (request head, body, idle connection; short ones configured so each test is
quick), its connection cap beside --max-connections, /metrics behind --auth, and input the
API refuses with the JSON error shape and one log line at most, where it answered 500 or
aiohttp's text and logged a traceback. Raw sockets where an HTTP client library would not send
such bytes; loopback only."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.support.http_support import Beanstalk, running_server
from tubeq.server.access import AccessConfig

# Short bounds, so a test waits for one in well under a second; WITHIN is how long a test
# allows the server to act on one, generous for a busy 2-core host.
SHORT_S = 0.5
WITHIN_S = 5.0

OPERATOR = "operator-token-0123456789"  # the default namespace's: reads /metrics
BILLING = "billing-token-0123456789"
EMAILS = "emails-token-0123456789a"
SCRAPER = "scraper-token-0123456789"  # [scrapers]: /metrics and nothing else
ACCESS = AccessConfig(tokens={OPERATOR: "default", BILLING: "billing", EMAILS: "emails"},
                      scrapers={SCRAPER: "prometheus"})


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        assert self.headers.get("content-type", "").startswith("application/json"), self
        return json.loads(self.body)


class RawClient:
    """One HTTP connection driven by hand: bytes out, responses parsed as they come back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> RawClient:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def response(self, within: float = WITHIN_S) -> RawResponse:
        """The next response (its body by Content-Length), or fail after ``within`` s."""
        async with asyncio.timeout(within):
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return RawResponse(status, headers, body)

    async def closed_within(self, within: float = WITHIN_S) -> bool:
        """Whether the server closes the connection within ``within`` s (what it sends
        meanwhile is dropped)."""
        try:
            async with asyncio.timeout(within):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        return True

    def close(self) -> None:
        self.writer.close()


@asynccontextmanager
async def http_server(redis_url: str, **config: Any) -> AsyncIterator[tuple[int, int]]:
    """A tubeq with short HTTP bounds unless ``config`` says otherwise: (http, protocol) port."""
    bounds = {"http_header_timeout_s": SHORT_S, "http_body_timeout_s": SHORT_S,
              "http_idle_timeout_s": SHORT_S}
    async with running_server(redis_url, **{**bounds, **config}) as server:
        yield server.http_port, server.port


@contextmanager
def log_lines(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
              ) -> Iterator[list[str]]:
    """The lines logged meanwhile: tubeq's (structlog, printed) and aiohttp's (logging)."""
    capsys.readouterr()
    before = len(caplog.records)
    lines: list[str] = []
    yield lines
    captured = capsys.readouterr()
    lines += (captured.out + captured.err).splitlines()
    lines += [r.getMessage() for r in caplog.records[before:]]
    lines += [str(r.exc_info) for r in caplog.records[before:] if r.exc_info]


def _get(path: str, extra: bytes = b"") -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n" + extra + b"\r\n"


# -- timeouts ---------------------------------------------------------------------------------

async def _trickle_until_closed(client: RawClient) -> bytes:
    """Send a header line every SHORT_S / 4 until the server closes the connection; what it
    answered meanwhile. Fails if it is still open after WITHIN_S."""
    answered = b""
    try:
        async with asyncio.timeout(WITHIN_S):
            while True:
                client.send(b"X-Slow: 1\r\n")
                try:
                    chunk = await asyncio.wait_for(client.reader.read(65536), SHORT_S / 4)
                except TimeoutError:
                    continue
                if not chunk:
                    return answered
                answered += chunk
    except ConnectionError:  # closed while this side was still sending: a reset
        return answered


async def test_a_trickled_request_head_is_answered_408_and_closed(redis_url: str) -> None:
    """The issue's 200 connections sending a header line every 2 s, scaled down: each is closed
    once the head timeout passes (answered 408, unless the close met a line still arriving and
    became a reset); a head that stops short is answered 408; one that comes whole in two
    parts is served."""
    async with http_server(redis_url) as (port, _):
        clients = [await RawClient.open(port) for _ in range(50)]
        for c in clients:
            c.send(b"GET /api/stats HTTP/1.1\r\nHost: t\r\n")
        started = time.monotonic()
        answers = await asyncio.gather(*(_trickle_until_closed(c) for c in clients))
        assert time.monotonic() - started < WITHIN_S
        assert all(a == b"" or a.startswith(b"HTTP/1.1 408 ") for a in answers), answers
        for c in clients:
            c.close()
        stalled = await RawClient.open(port)
        stalled.send(b"GET /api/stats HTTP/1.1\r\nHost: t\r\n")
        answer = await stalled.response()
        assert answer.status == 408
        assert answer.json() == {
            "error": f"request line and headers not received within {SHORT_S:g} s"}
        assert answer.headers["connection"] == "close"
        assert await stalled.closed_within()
        whole = await RawClient.open(port)
        whole.send(b"GET /api/stats HTTP/1.1\r\n")
        await asyncio.sleep(SHORT_S / 5)
        whole.send(b"Host: t\r\n\r\n")
        assert (await whole.response()).status == 200
        whole.close()


async def test_a_body_short_of_its_content_length_is_answered_408_and_closed(
        redis_url: str) -> None:
    async with http_server(redis_url) as (port, protocol_port):
        for content_type in (b"application/octet-stream", b"application/json"):
            client = await RawClient.open(port)
            client.send(b"POST /api/tubes/slow/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: "
                        + content_type + b"\r\nContent-Length: 10\r\n\r\n{\"b")
            answer = await client.response()
            assert answer.status == 408
            assert answer.json() == {"error": f"request body not received within {SHORT_S:g} s"}
            assert await client.closed_within()
        # A route that answers without reading its body: answered, then closed all the same.
        client = await RawClient.open(port)
        client.send(_get("/api/stats", b"Content-Length: 10\r\n")[:-2] + b"\r\nabc")
        assert (await client.response()).status == 200
        assert await client.closed_within()
        # Nothing was stored.
        beanstalk = await Beanstalk.open(protocol_port)
        assert await beanstalk.ask(b"stats-tube slow") == b"NOT_FOUND\r\n"
        await beanstalk.close()


async def test_an_idle_connection_is_closed_but_a_long_poll_is_not(redis_url: str) -> None:
    async with http_server(redis_url) as (port, _):
        never_spoke = await RawClient.open(port)
        kept_alive = await RawClient.open(port)
        kept_alive.send(_get("/api/stats"))
        assert (await kept_alive.response()).status == 200  # then keep-alive, idle
        assert await never_spoke.closed_within()
        assert await kept_alive.closed_within()
        # A route that runs longer than the idle timeout (a 2 s long poll) is not idle.
        polling = await RawClient.open(port)
        polling.send(b"POST /api/tubes/none/reserve?timeout=2 HTTP/1.1\r\nHost: t\r\n"
                     b"Content-Length: 0\r\n\r\n")
        assert (await polling.response()).status == 204
        assert await polling.closed_within()  # and idle after it


# -- the connection cap -----------------------------------------------------------------------

async def test_connections_past_the_cap_get_503_and_leave_the_protocol_port_alone(
        redis_url: str) -> None:
    async with http_server(redis_url, http_max_connections=3, max_connections=2,
                           http_idle_timeout_s=60.0) as (port, protocol_port):
        held = [await RawClient.open(port) for _ in range(3)]
        held[0].send(_get("/api/stats"))
        assert (await held[0].response()).status == 200  # all three were accepted
        refused = await RawClient.open(port)
        answer = await refused.response()
        assert answer.status == 503
        assert "too many connections" in answer.json()["error"]
        assert await refused.closed_within()
        # The protocol port's own cap is untouched by the HTTP connections.
        beanstalk = [await Beanstalk.open(protocol_port) for _ in range(2)]
        for b in beanstalk:
            assert (await b.ask(b"use t")) == b"USING t\r\n"
        # A connection given back makes room for one more.
        held.pop().close()
        for _ in range(50):
            await asyncio.sleep(0.05)
            again = await RawClient.open(port)
            again.send(_get("/api/stats"))
            served = (await again.response()).status == 200
            again.close()
            if served:
                break
        else:
            pytest.fail("a closed connection's room was not given back")
        for c in held:
            c.close()
        for b in beanstalk:
            await b.close()


# -- /metrics and tokens ----------------------------------------------------------------------

async def test_metrics_take_a_scraper_token_or_one_of_the_default_namespace(redis_url: str) -> None:
    async with http_server(redis_url, access=ACCESS) as (port, _), \
            aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{port}/metrics"
        async with http.get(url) as r:
            assert r.status == 401 and "requires a token" in (await r.json())["error"]
        async with http.get(url, headers={"Authorization": "Bearer wrong-token-0123456789"}) as r:
            assert (r.status, await r.json()) == (401, {"error": "unknown token"})
        async with http.get(url, headers={"Authorization": f"Bearer {BILLING}"}) as r:
            assert r.status == 403 and "default namespace" in (await r.json())["error"]
        for token in (OPERATOR, SCRAPER):
            for kwargs in ({"headers": {"Authorization": f"Bearer {token}"}},
                           {"params": {"token": token}}):
                async with http.get(url, **kwargs) as r:
                    assert r.status == 200 and "tubeq_info" in await r.text()
        # A scraper's token reads /metrics alone: it enters no namespace.
        for path in ("/api/stats", "/api/tubes", "/"):
            async with http.get(f"http://127.0.0.1:{port}{path}",
                                headers={"Authorization": f"Bearer {SCRAPER}"}) as r:
                assert r.status == 401, path


async def test_the_authorization_header_wins_over_the_query_token(redis_url: str) -> None:
    async with http_server(redis_url, access=ACCESS) as (port, _), \
            aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{port}"
        async with http.post(f"{base}/api/tubes/t/jobs", params={"token": EMAILS}, data=b"x",
                             headers={"Authorization": f"Bearer {BILLING}"}) as r:
            assert r.status == 201
        for token, ready in ((BILLING, 1), (EMAILS, None)):  # it went to billing
            async with http.get(f"{base}/api/tubes/t", params={"token": token}) as r:
                assert (await r.json()).get("current-jobs-ready") == ready
        # A bearer token that is wrong is not saved by a right one in the query.
        async with http.get(f"{base}/api/stats", params={"token": EMAILS},
                            headers={"Authorization": "Bearer wrong-token-0123456789"}) as r:
            assert r.status == 401
        # Another scheme in the header is no credential: the query's token is.
        async with http.get(f"{base}/api/stats", params={"token": EMAILS},
                            headers={"Authorization": "Basic dXNlcjpwYXNz"}) as r:
            assert r.status == 200


# -- input: one JSON 4xx, one log line at most --------------------------------------------------

async def test_bodies_that_failed_with_500_are_a_400_with_one_log_line(
        redis_url: str, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    bodies = {
        "lone surrogate": b'{"body": "\\ud800"}',
        "lone surrogate key": b'{"\\udfff": 1, "body": "x"}',
        "nested 100,000 deep": b'{"body": "x", "pri": ' + b"[" * 100_000 + b"]" * 100_000
                               + b"}",
    }
    async with http_server(redis_url) as (port, _), aiohttp.ClientSession() as http:
        for name, body in bodies.items():
            with log_lines(capsys, caplog) as lines:
                async with http.post(f"http://127.0.0.1:{port}/api/tubes/t/jobs", data=body,
                                     headers={"Content-Type": "application/json"}) as r:
                    assert r.status == 400, name
                    assert "error" in await r.json(), name
            assert len(lines) <= 1, (name, lines)


async def test_json_input_as_protocol_md_says(redis_url: str) -> None:
    async with http_server(redis_url) as (port, _), aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{port}/api/tubes/t/jobs"
        refused = {
            b'{"body": "x", "pri": 5, "pri": 6}': "'pri' is given twice",
            b'{"body": "x", "body": "y"}': "'body' is given twice",
            b'{"body": "x", "pri": "5"}': "pri must be a whole number",
            b'{"body": "x", "ttr": "60"}': "ttr must be a whole number",
            b'{"body": "x", "max-tries": "3"}': "option 'max-tries'",
            b'{"body": "x", "key": 5}': "option 'key'",
            b'{"body": "x", "on-expire": true}': "option 'on-expire'",
        }
        for body, error in refused.items():
            async with http.post(url, data=body,
                                 headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400, body
                assert error in (await r.json())["error"], body
        # The same values as JSON numbers and strings, and as query text, are taken.
        async with http.post(url, json={"body": "x", "pri": 5, "max-tries": 3, "key": "k1",
                                        "on-expire": "delete"}) as r:
            assert r.status == 201, await r.text()
        async with http.post(url, params={"pri": "5", "max-tries": "3", "key": "k2"},
                             data=b"x") as r:
            assert r.status == 201, await r.text()
        # Every GET route refuses an option it does not take, as the other routes do.
        for path in ("/api/stats", "/api/servers", "/api/tubes", "/api/tubes/t",
                     "/api/tubes/t/peek/ready", "/api/jobs/1"):
            async with http.get(f"http://127.0.0.1:{port}{path}?verbose=1") as r:
                assert r.status == 400, path
                assert "unknown option 'verbose'" in (await r.json())["error"], path


async def test_requests_aiohttp_refuses_get_the_json_shape_and_one_log_line(
        redis_url: str, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    requests = {
        "request line too long": _get("/api/stats?" + "a" * 20_000),
        "header too long": _get("/api/stats", b"X-Big: " + b"b" * 20_000 + b"\r\n"),
        "Content-Length -1": b"POST /api/tubes/t/jobs HTTP/1.1\r\nHost: t\r\n"
                             b"Content-Length: -1\r\n\r\nx",
        "Content-Length and Transfer-Encoding": b"POST /api/tubes/t/jobs HTTP/1.1\r\nHost: t"
                                                b"\r\nContent-Length: 1\r\nTransfer-Encoding: "
                                                b"chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
        "not HTTP": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n",
        "broken chunk": b"POST /api/tubes/t/jobs HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: "
                        b"chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n",
    }
    async with http_server(redis_url) as (port, _):
        for name, data in requests.items():
            with log_lines(capsys, caplog) as lines:
                client = await RawClient.open(port)
                client.send(data)
                answer = await client.response()
                assert await client.closed_within(), name
            assert 400 <= answer.status < 500, (name, answer)
            assert set(answer.json()) == {"error"}, name
            assert len(lines) <= 1 and not any("Traceback" in line for line in lines), \
                (name, lines)


async def test_a_long_poll_names_at_most_max_watch_tubes(redis_url: str) -> None:
    async with http_server(redis_url, max_watch=2) as (port, _), aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{port}/api/tubes"
        async with http.post(f"{base}/a,b,c/reserve", params={"timeout": "0"}) as r:
            assert r.status == 400 and "--max-watch" in (await r.json())["error"]
        async with http.post(f"{base}/a,b,a/reserve", params={"timeout": "0"}) as r:
            assert r.status == 204  # two tubes, one named twice: within the limit
