"""Traces through the HTTP API: a reservation made over HTTP gets its queue-wait and
reservation spans, ended by the route that settles it (delete, release, bury, hand-back) and
moved by its touch; an in-process tubeq whose namespaces are given a JobTracer that writes to
the SDK's in-memory exporter."""

from __future__ import annotations

from typing import Any

import aiohttp
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.http_support import running_server
from tubeq.server.tracing import build_tracer

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_http_reservations_are_traced_to_their_end(redis_url: str) -> None:
    spans = InMemorySpanExporter()
    async with running_server(redis_url) as server, aiohttp.ClientSession() as session:
        tracer = build_tracer(SimpleSpanProcessor(spans))
        for ctx in server.namespaces.values():
            ctx.tracer = tracer
        base = f"http://127.0.0.1:{server.http_port}/api"

        async def call(method: str, path: str, **params: Any) -> Any:
            async with session.request(method, base + path,
                                       params={k: str(v) for k, v in params.items()}) as r:
                assert r.status in (200, 201), await r.text()
                return await r.json()

        ids = [(await call("POST", "/tubes/tp-http/jobs", traceparent=TP))["id"]
               for _ in range(4)]
        outcomes = {}
        for route, how in (("delete", "deleted"), ("release", "released"),
                           ("bury", "buried"), ("hand-back", "hand-back")):
            job = await call("POST", "/tubes/tp-http/reserve", timeout=0)
            token = job["reservation"]
            if route == "delete":
                await call("POST", f"/jobs/{job['id']}/touch", reservation=token)
                await call("DELETE", f"/jobs/{job['id']}", reservation=token)
            elif route == "release":  # delayed: the next reserve takes the next job
                await call("POST", f"/jobs/{job['id']}/release", reservation=token, delay=60)
            else:
                await call("POST", f"/jobs/{job['id']}/{route}", reservation=token)
            outcomes[job["id"]] = how
        assert sorted(outcomes) == sorted(ids)

    finished = spans.get_finished_spans()
    reservations = {int(s.attributes["messaging.message.id"]): s for s in finished
                    if s.name == "reservation tp-http" and s.attributes}
    assert {job: s.attributes["tubeq.outcome"] for job, s in reservations.items()
            if s.attributes} == outcomes
    assert all(s.parent is not None and s.parent.span_id == 0x00F067AA0BA902B7
               for s in reservations.values())
    waits = [s for s in finished if s.name == "queue-wait tp-http"]
    puts = [s for s in finished if s.name == "put tp-http"]
    assert (len(waits), len(puts)) == (4, 4)
