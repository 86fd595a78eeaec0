"""Traces end to end: a tubeq started with --otel-endpoint exports its spans over OTLP/HTTP to a
receiver this test runs (aiohttp, decoding ExportTraceServiceRequest with opentelemetry-proto);
a producer and a worker with the OpenTelemetry SDK, in a process of their own
(tests/support/traced_client.py), send theirs to the same receiver. The producer's trace id is
on the server's put, queue-wait and reservation spans and on the worker's handler span, with
the parents and links protocol.md ("Traces") gives; a retry is a new reservation span linked
to the first; a deferred job's first reservation has no parent, only the link."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.client_support import eventually
from tests.support.servers import TubeqCluster
from tubeq.server.tracing import first_reservation, traces_url, wanted


@dataclass(frozen=True)
class Received:
    """One span as the receiver decoded it (ids in hex; parent "" for a root)."""

    service: str
    name: str
    trace: str
    span: str
    parent: str
    links: tuple[tuple[str, str], ...]
    attributes: dict[str, object]


def _value(any_value: object) -> object:
    kind = any_value.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(any_value, kind) if kind else None


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[Received]]]:
    """An OTLP/HTTP traces endpoint on a free loopback port: its base URL and what it got."""
    received: list[Received] = []

    async def traces(request: web.Request) -> web.Response:
        data = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            data = gzip.decompress(data)
        message = ExportTraceServiceRequest()
        message.ParseFromString(data)
        for resource_spans in message.resource_spans:
            service = next((str(_value(a.value)) for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(Received(
                        service, span.name, span.trace_id.hex(), span.span_id.hex(),
                        span.parent_span_id.hex(),
                        tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        {a.key: _value(a.value) for a in span.attributes}))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        await runner.cleanup()


async def test_a_jobs_trace_crosses_the_queue(
        receiver: tuple[str, list[Received]], tubeq_cluster: TubeqCluster,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, received = receiver
    # The SDK's batch processor sends every 50 ms instead of every 5 s (its standard variable).
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    server = tubeq_cluster.start(label="tubeq-traces", flags=("--otel-endpoint", url))
    prefix = server.extra["prefix"]
    try:
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.traced_client", server.host, str(server.port),
            "traced", url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(client.communicate(), 60)
        assert client.returncode == 0, err.decode(errors="replace")[-3000:]
        produced = json.loads(out.decode().strip().splitlines()[-1])

        def server_spans(name: str, body: str) -> list[Received]:
            job = str(produced[body]["job"])
            return [s for s in received if s.service == "tubeq" and s.name == name
                    and s.attributes.get("messaging.message.id") == job]

        async def arrived() -> bool:
            return (len(server_spans("reservation traced", "retry")) == 2
                    and all(server_spans("reservation traced", b) for b in produced)
                    and sum(s.name.startswith("work ") for s in received) == 4)

        await eventually(arrived, "every span at the receiver", 20)
    finally:
        server.stop()

    for body, producer in produced.items():
        trace, parent = producer["trace"], producer["span"]
        (put,) = server_spans("put traced", body)
        assert (put.trace, put.parent, put.attributes["tubeq.outcome"]) == (
            trace, parent, "inserted")
        waits = server_spans("queue-wait traced", body)
        assert waits and all((w.trace, w.parent) == (trace, parent) for w in waits)
        reservations = server_spans("reservation traced", body)
        first = reservations[0] if len(reservations) == 1 else next(
            r for r in reservations if r.attributes["tubeq.reserves"] == 1)
        assert first.trace == trace
        assert (trace, parent) in first.links
        # its span id is the one every process derives from the job (a retry's link)
        assert first.span == f"{first_reservation(int(trace, 16), producer['job'], prefix):016x}"
        # The worker's handler span: a child of the producer's span, linked to it, and the
        # handler's own span inside it.
        handlers = [s for s in received if s.service == "traced-client"
                    and s.name == "process traced"
                    and s.attributes.get("messaging.message.id") == str(producer["job"])]
        assert handlers and all((h.trace, h.parent) == (trace, parent)
                                and (trace, parent) in h.links for h in handlers)
        works = [s for s in received if s.name == f"work {body}"]
        assert {w.parent for w in works} == {h.span for h in handlers}
        assert all(w.trace == trace for w in works)

    # An immediate job's reservation nests under the producer's span; a deferred one does not.
    (now,) = server_spans("reservation traced", "now")
    assert now.parent == produced["now"]["span"]
    assert now.attributes["tubeq.outcome"] == "deleted"
    (later,) = server_spans("reservation traced", "later")
    assert later.parent == ""
    assert (produced["later"]["trace"], produced["later"]["span"]) in later.links
    # The retry: the first reservation ended failed, the second is a new span linked to it.
    retried = server_spans("reservation traced", "retry")
    by_try = {r.attributes["tubeq.reserves"]: r for r in retried}
    assert by_try[1].attributes["tubeq.outcome"] == "failed"
    assert by_try[2].attributes["tubeq.outcome"] == "deleted"
    assert (by_try[1].trace, by_try[1].span) in by_try[2].links
    assert by_try[2].parent == produced["retry"]["span"]


def test_traces_are_on_with_the_flag_or_the_standard_variables_only() -> None:
    assert not wanted(None, {})
    assert wanted("http://collector:4318", {})
    assert wanted(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not wanted("http://collector:4318", {"OTEL_SDK_DISABLED": "true"})
    assert not wanted("http://collector:4318", {"OTEL_TRACES_EXPORTER": "none"})
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"


async def test_a_put_many_entry_with_a_traceparent_gets_its_put_span(
        receiver: tuple[str, list[Received]], tubeq_cluster: TubeqCluster,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry's traceparent= gives its job a put span in the producer's trace, as
    put-with's does; an entry without one none."""
    url, received = receiver
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    server = tubeq_cluster.start(label="tubeq-traces-many", flags=("--otel-endpoint", url))
    trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    try:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(f"use many-traced\r\nput-many 2\r\n0 0 60 1 traceparent=00-{trace}-{span}"
                     f"-01\r\na\r\n0 0 60 1\r\nb\r\n".encode())
        assert await reader.readline() == b"USING many-traced\r\n"
        assert await reader.readline() == b"BATCH 2\r\n"
        traced = int((await reader.readline()).split()[1])
        plain = int((await reader.readline()).split()[1])
        writer.close()

        def puts() -> list[Received]:
            return [s for s in received if s.service == "tubeq" and s.name == "put many-traced"]

        async def arrived() -> bool:
            return bool(puts())

        await eventually(arrived, "the entry's put span at the receiver", 20)
    finally:
        server.stop()
    (put,) = puts()
    assert (put.trace, put.parent) == (trace, span)
    assert put.attributes["messaging.message.id"] == str(traced)
    assert put.attributes["tubeq.outcome"] == "inserted"
    assert plain != traced
