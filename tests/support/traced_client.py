"""A producer and a worker with OpenTelemetry on, in a process of their own (the traces test,
tests/server/test_traces.py, runs it): spans go over OTLP/HTTP to the test's receiver, as the
server's do, and the API's global tracer provider is set in this process only.

Puts three jobs through the bundled client, each inside a producer span of its own: ``now``
(handled once), ``retry`` (its handler raises the first time: failed, then reserved again) and
``later`` (put-with delay-ms: deferred). One ``consume().run()`` worker handles them, opening a
span ``work <body>`` inside the handler. Prints, as one JSON line, each job's id and its
producer span's trace and span ids (hex).

    python -m tests.support.traced_client HOST PORT TUBE OTLP_BASE_URL
"""

from __future__ import annotations

import asyncio
import json
import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tubeq.client import Client, Job

BODIES = ("now", "retry", "later")


async def main(host: str, port: int, tube: str) -> dict[str, dict[str, object]]:
    tracer = trace.get_tracer("traced-client")
    produced: dict[str, dict[str, object]] = {}
    async with Client(host, port) as client:
        await client.use(tube)
        for body in BODIES:
            with tracer.start_as_current_span(f"produce {body}") as span:
                context = span.get_span_context()
                result = await client.put_with(
                    body, delay_ms=300 if body == "later" else None)
            produced[body] = {"job": result.id, "trace": f"{context.trace_id:032x}",
                              "span": f"{context.span_id:016x}"}
        failed_once: set[str] = set()
        done: set[str] = set()
        all_done = asyncio.Event()

        async def handle(job: Job) -> None:
            body = job.body.decode()
            with tracer.start_as_current_span(f"work {body}"):
                if body == "retry" and body not in failed_once:
                    failed_once.add(body)
                    raise RuntimeError("the first try fails")
            done.add(body)
            if done == set(BODIES):
                all_done.set()

        consumer = client.consume(tube, concurrency=1, backoff_base=0, max_tries=5)
        running = asyncio.create_task(consumer.run(handle))
        await asyncio.wait_for(all_done.wait(), 30)
        consumer.stop()
        await running
    return produced


if __name__ == "__main__":
    host, port, tube, otlp = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    provider = TracerProvider(resource=Resource.create({"service.name": "traced-client"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
        endpoint=otlp.rstrip("/") + "/v1/traces")))
    trace.set_tracer_provider(provider)
    out = asyncio.run(main(host, port, tube))
    provider.shutdown()  # sends the last spans
    print(json.dumps(out))
