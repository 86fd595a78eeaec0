"""put-with traceparent=: the parser byte by byte, then a real tubeq on a real Redis (the job
keeps the context; stats-job shows it last and only when set; a malformed one is refused and
nothing stored), then the HTTP API's put and job JSON."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.protocol.test_protocol import cases, check, line
from tests.support.http_support import running_server
from tests.support.servers import ServerProcess
from tests.support.wire import Wire
from tubeq.client import Client, NewJob
from tubeq.protocol import replies
from tubeq.protocol.commands import PutWith, Rejected
from tubeq.server.process import Server

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def inserted_id(reply: bytes) -> int:
    assert reply.startswith(b"INSERTED "), reply
    return int(reply.split()[1])


def bad_traceparent() -> Rejected:
    return Rejected(reply=replies.bad_option("traceparent"))


@cases(
    (line(b"put-with 0 0 1 2 traceparent=" + TP.encode()) + line(b"hi"),
     [PutWith(0, 0, 1, b"hi", (("traceparent", TP),))]),
    # in the spec's order, after the others, whatever order it came in
    (line(b"put-with 0 0 1 2 traceparent=" + TP.encode() + b" max-tries=2") + line(b"hi"),
     [PutWith(0, 0, 1, b"hi", (("max-tries", 2), ("traceparent", TP)))]),
    # upper-case hex, all-zero trace or span id, another version, cut or longer: refused
    (line(b"put-with 0 0 1 2 traceparent=" + TP.upper().encode()) + line(b"hi"),
     [bad_traceparent()]),
    (line(b"put-with 0 0 1 2 traceparent=00-" + b"0" * 32 + b"-00f067aa0ba902b7-01")
     + line(b"hi"), [bad_traceparent()]),
    (line(b"put-with 0 0 1 2 traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-" + b"0" * 16
          + b"-01") + line(b"hi"), [bad_traceparent()]),
    (line(b"put-with 0 0 1 2 traceparent=01" + TP[2:].encode()) + line(b"hi"),
     [bad_traceparent()]),
    (line(b"put-with 0 0 1 2 traceparent=" + TP[:-1].encode()) + line(b"hi"),
     [bad_traceparent()]),
    (line(b"put-with 0 0 1 2 traceparent=" + TP.encode() + b"-00") + line(b"hi"),
     [bad_traceparent()]),
    (line(b"put-with 0 0 1 2 traceparent=") + line(b"hi"), [bad_traceparent()]),
)
def test_put_with_traceparent(data: bytes, expected: list[object]) -> None:
    check(data, expected)  # type: ignore[arg-type]


@pytest.mark.parametrize("delay", ["", " delay-ms=60000", " after=999999999"])
def test_the_job_keeps_its_traceparent_and_stats_job_shows_it_last(
        server: ServerProcess, delay: str) -> None:
    """Ready, delayed, and refused for an unknown parent (nothing stored)."""
    with Wire(server.host, server.port) as plain, Wire(server.host, server.port) as ext:
        ext.ask("use tp-stats")
        reply = ext.ask(f"put-with 0 0 60 1 traceparent={TP}{delay}\r\nx\r\n".encode())
        if "after" in delay:
            assert reply == b"UNKNOWN_PARENT 999999999\r\n"
            assert ext.ask("peek-ready") == b"NOT_FOUND\r\n"
            return
        job_id = inserted_id(reply)
        doc = ext.yaml(f"stats-job {job_id}")
        assert list(doc)[-2:] == ["parents-pending", "traceparent"]
        assert doc["traceparent"] == TP
        assert list(plain.yaml(f"stats-job {job_id}"))[-1] == "kicks"  # beanstalkd's, exactly
        assert ext.ask(f"delete {job_id}") == b"DELETED\r\n"


def test_put_many_entries_keep_their_traceparents(server: ServerProcess) -> None:
    """A put-many entry's traceparent= is kept as put-with's is, beside a group or alone; an
    entry without one has none; a malformed one refuses its entry only."""
    with Wire(server.host, server.port) as w:
        w.ask("use tp-many")
        w.send(f"put-many 4\r\n0 0 60 1 traceparent={TP}\r\na\r\n"
               f"0 100 60 1 group=g traceparent={TP}\r\nb\r\n0 0 60 1\r\nc\r\n"
               f"0 0 60 1 traceparent={TP.upper()}\r\nd\r\n".encode())
        assert w.reply() == b"BATCH 4\r\n"
        replies_ = [w.reply() for _ in range(4)]
        assert replies_[3] == b"BAD_OPTION traceparent\r\n"
        ready, delayed, plain = (inserted_id(r) for r in replies_[:3])
        assert w.yaml(f"stats-job {ready}")["traceparent"] == TP
        assert w.yaml(f"stats-job {delayed}")["traceparent"] == TP
        assert "traceparent" not in w.yaml(f"stats-job {plain}")
        assert w.yaml("stats-tube tp-many")["current-jobs-ready"] == "2"
        for job_id in (ready, delayed, plain):
            assert w.ask(f"delete {job_id}") == b"DELETED\r\n"


async def test_the_client_puts_many_with_traceparents(server: ServerProcess) -> None:
    async with Client(server.host, server.port) as client:
        await client.use("tp-many-client")
        ids = await client.put_many([NewJob(b"a", traceparent=TP), NewJob(b"b", group="g"),
                                     b"c"])
        assert all(isinstance(i, int) for i in ids)
        stats = [await client.stats_job(i) for i in ids if isinstance(i, int)]
        assert [s.get("traceparent") for s in stats] == [TP, None, None]
        with pytest.raises(ValueError, match="traceparent"):
            await client.put_many([NewJob(b"x", traceparent=TP.upper())])
        for job_id in ids:
            assert isinstance(job_id, int)
            await client.delete(job_id)


def test_a_job_without_traceparent_shows_no_such_key(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as ext:
        ext.ask("use tp-none")
        job_id = inserted_id(ext.ask(b"put-with 0 0 60 1 max-tries=2\r\nx\r\n"))
        assert list(ext.yaml(f"stats-job {job_id}"))[-1] == "parents-pending"
        assert ext.ask(f"delete {job_id}") == b"DELETED\r\n"


@pytest.mark.parametrize("value", [TP.upper(), "00-xyz", TP + "-00", "ff" + TP[2:]])
def test_a_malformed_traceparent_is_refused_and_nothing_is_stored(
        server: ServerProcess, value: str) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use tp-refused")
        assert w.ask(f"put-with 0 0 60 1 traceparent={value}\r\nx\r\n".encode()) == (
            b"BAD_OPTION traceparent\r\n")
        assert w.ask("peek-ready") == b"NOT_FOUND\r\n"
        assert w.ask("list-tube-used") == b"USING tp-refused\r\n"  # and it keeps serving


# -- the HTTP API -------------------------------------------------------------------------------


@pytest.fixture
async def http_server(redis_url: str) -> AsyncIterator[Server]:
    async with running_server(redis_url) as s:
        yield s


async def test_an_http_put_takes_a_traceparent_and_the_job_json_shows_it(
        http_server: Server) -> None:
    base = f"http://127.0.0.1:{http_server.http_port}"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/api/tubes/tp-http/jobs", data=b"x",
                                params={"traceparent": TP}) as r:
            assert r.status == 201, await r.text()
            raw_id = (await r.json())["id"]
        async with session.post(f"{base}/api/tubes/tp-http/jobs",
                                json={"body": "y", "traceparent": TP}) as r:
            assert r.status == 201, await r.text()
            json_id = (await r.json())["id"]
        async with session.post(f"{base}/api/tubes/tp-http/jobs", data=b"z") as r:
            plain_id = (await r.json())["id"]
        for job_id, expected in ((raw_id, TP), (json_id, TP), (plain_id, "")):
            async with session.get(f"{base}/api/jobs/{job_id}") as r:
                assert (await r.json())["traceparent"] == expected
        async with session.post(f"{base}/api/tubes/tp-http/jobs", data=b"x",
                                params={"traceparent": "00-nope"}) as r:
            assert r.status == 400
            assert "traceparent" in (await r.json())["error"]
        async with session.post(f"{base}/api/tubes/tp-http/jobs",
                                json={"body": "y", "traceparent": 7}) as r:
            assert r.status == 400
        async with session.get(f"{base}/api/tubes/tp-http") as r:
            assert (await r.json())["total-jobs"] == 3  # the refused puts stored nothing
        # The W3C header (an instrumented HTTP client's span) when no option gives one; an
        # invalid header is ignored, as W3C Trace Context says; the option wins over it.
        other = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
        for headers, params, expected in (({"traceparent": TP}, {}, TP),
                                          ({"traceparent": "garbage"}, {}, ""),
                                          ({"traceparent": other}, {"traceparent": TP}, TP)):
            async with session.post(f"{base}/api/tubes/tp-http/jobs", data=b"h",
                                    headers=headers, params=params) as r:
                assert r.status == 201, await r.text()
                job_id = (await r.json())["id"]
            async with session.get(f"{base}/api/jobs/{job_id}") as r:
                assert (await r.json())["traceparent"] == expected
