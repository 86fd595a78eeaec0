"""tubeq.server.tracing without a server: the spans a JobTracer makes of puts, grants and ends,
read back from the SDK's in-memory exporter (a fake store answers job_trace; a fake clock says
when). Every way a reservation ends, the early end, a job without a context, a deferred job, a
retry's link, the throttled export failures, and a start without the SDK."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.support.client_support import eventually
from tubeq.redisio.checks import StartupError
from tubeq.server import tracing
from tubeq.server.tracing import JobTracer, LoggedExporter, build_tracer, first_reservation
from tubeq.store.keys import Keys
from tubeq.store.records import JobTrace, Reservation

TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PRODUCER = 0x00F067AA0BA902B7
TP = f"00-{TRACE:032x}-{PRODUCER:016x}-01"
NS = 1_000_000


@dataclass
class FakeStore:
    """job_trace answers from ``records``; ``later`` holds the answer back until released."""

    records: dict[int, JobTrace | None] = field(default_factory=dict)
    keys: Keys = field(default_factory=lambda: Keys("ns"))
    later: bool = False
    held: list[tuple[asyncio.Future[JobTrace | None], JobTrace | None]] = field(
        default_factory=list)

    def job_trace(self, job_id: int) -> asyncio.Future[JobTrace | None]:
        future: asyncio.Future[JobTrace | None] = asyncio.get_running_loop().create_future()
        if self.later:
            self.held.append((future, self.records.get(job_id)))
        else:
            future.set_result(self.records.get(job_id))
        return future

    def answer(self) -> None:
        for future, record in self.held:
            future.set_result(record)
        self.held.clear()


@dataclass
class FakeHolder:
    token: str = "i:1"
    reserved: dict[int, int] = field(default_factory=dict)


@dataclass
class Setup:
    tracer: JobTracer
    spans: InMemorySpanExporter
    store: FakeStore
    holder: FakeHolder
    now: list[int]

    def finished(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    async def grant(self, job_id: int, record: JobTrace | None, *, ttr: int = 60) -> None:
        self.store.records[job_id] = record
        deadline = self.now[0] + ttr * 1000
        self.holder.reserved[job_id] = deadline
        self.tracer.reserved(self.store, self.holder,  # type: ignore[arg-type]
                             [Reservation(job_id, ttr, b"x", deadline, 0, "t")])
        await asyncio.sleep(0)  # the read's callback


@pytest.fixture
def setup() -> Setup:
    spans = InMemorySpanExporter()
    tracer = build_tracer(SimpleSpanProcessor(spans))
    now = [1_000_000]
    tracer.clock_ms = lambda: now[0]
    return Setup(tracer, spans, FakeStore(), FakeHolder(), now)


def links(span: ReadableSpan) -> list[tuple[int, int]]:
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


async def test_a_put_span_is_a_child_of_the_producer(setup: Setup) -> None:
    setup.now[0] = 1_000_020
    setup.tracer.put(TP, "t", "ns", 1_000_000, 7, "inserted")
    setup.tracer.put("not a traceparent", "t", "ns", 1_000_000, 8, "inserted")  # ignored
    (put,) = setup.finished("put t")
    assert put.parent is not None
    assert (put.context.trace_id, put.parent.span_id) == (TRACE, PRODUCER)
    assert put.kind is SpanKind.SERVER
    assert (put.start_time, put.end_time) == (1_000_000 * NS, 1_000_020 * NS)
    assert put.attributes is not None
    assert (put.attributes["tubeq.outcome"], put.attributes["messaging.message.id"]) == (
        "inserted", "7")


@pytest.mark.parametrize("how", ["deleted", "released", "hand-back", "buried", "finished",
                                 "failed", "cancelled"])
async def test_a_reservation_ends_how_its_holder_settled_it(setup: Setup, how: str) -> None:
    await setup.grant(7, JobTrace(TP, created_ms=999_000, ready_since_ms=0, reserves=1))
    (wait,) = setup.finished("queue-wait t")
    assert (wait.start_time, wait.end_time) == (999_000 * NS, 1_000_000 * NS)
    assert wait.parent is not None and wait.parent.span_id == PRODUCER
    assert setup.finished("reservation t") == []  # open until it ends
    setup.now[0] = 1_000_500
    setup.tracer.ended("i:1", [7], how)
    (held,) = setup.finished("reservation t")
    assert held.attributes is not None and held.attributes["tubeq.outcome"] == how
    assert (held.start_time, held.end_time) == (1_000_000 * NS, 1_000_500 * NS)
    assert held.parent is not None and held.parent.span_id == PRODUCER
    assert (TRACE, PRODUCER) in links(held)
    assert held.context.span_id == first_reservation(TRACE, 7, "ns")
    setup.tracer.ended("i:1", [7], "deleted")  # once ended, a later word changes nothing
    assert len(setup.finished("reservation t")) == 1


async def test_a_job_without_a_context_makes_no_span(setup: Setup) -> None:
    await setup.grant(7, None)
    setup.tracer.ended("i:1", [7], "deleted")
    assert setup.spans.get_finished_spans() == ()


async def test_a_context_not_sampled_makes_no_span(setup: Setup) -> None:
    """flags 00: the producer records nothing of this trace; a deferred job's first
    reservation (a root, which a sampler would sample on its own) included."""
    unsampled = TP[:-2] + "00"
    setup.tracer.put(unsampled, "t", "ns", 1_000_000, 7, "inserted")
    await setup.grant(7, JobTrace(unsampled, 990_000, ready_since_ms=995_000, reserves=1))
    setup.tracer.ended("i:1", [7], "deleted")
    assert setup.spans.get_finished_spans() == ()


async def test_an_end_heard_before_the_record_ends_the_span_when_it_comes(setup: Setup) -> None:
    setup.store.later = True
    await setup.grant(7, JobTrace(TP, 999_000, 0, 1))
    setup.now[0] = 1_000_100
    setup.tracer.ended("i:1", [7], "deleted")
    setup.now[0] = 1_000_900
    setup.store.answer()
    await asyncio.sleep(0)  # the read's callback
    (held,) = setup.finished("reservation t")
    assert held.attributes is not None and held.attributes["tubeq.outcome"] == "deleted"
    assert held.end_time == 1_000_100 * NS


async def test_a_reservation_not_touched_ends_at_its_deadline_a_touched_one_later(
        setup: Setup) -> None:
    await setup.grant(7, JobTrace(TP, 999_000, 0, 1), ttr=1)
    await setup.grant(8, JobTrace(TP, 999_000, 0, 1), ttr=1)
    setup.holder.reserved[8] = 1_000_000 + 1000 + 50  # touched: 50 ms more
    setup.now[0] = 1_001_000  # both deadlines passed for the clock the timers were armed by

    async def ended(count: int) -> bool:
        return len(setup.finished("reservation t")) == count

    setup.tracer._open["i:1"][7].timer.cancel()  # type: ignore[union-attr]
    setup.tracer._deadline(setup.tracer._open["i:1"][7])
    setup.tracer._open["i:1"][8].timer.cancel()  # type: ignore[union-attr]
    setup.tracer._deadline(setup.tracer._open["i:1"][8])  # touched: armed again, 50 ms on
    (expired,) = setup.finished("reservation t")
    assert expired.attributes is not None and expired.attributes["tubeq.outcome"] == "ttr"
    assert expired.end_time == 1_001_000 * NS
    setup.now[0] = 1_001_050
    await eventually(lambda: ended(2), "the touched reservation's new deadline", 5)
    touched = next(s for s in setup.finished("reservation t") if s is not expired)
    assert touched.end_time == 1_001_050 * NS


async def test_a_touch_of_a_holder_without_a_connection_moves_the_deadline(
        setup: Setup) -> None:
    """An HTTP reservation (tracing.Held): its touch reaches the tracer (moved)."""
    setup.holder = FakeHolder(token="i:h1")
    await setup.grant(7, JobTrace(TP, 999_000, 0, 1), ttr=1)
    setup.tracer.moved("i:h1", 7, 1_061_000)
    setup.tracer.moved("i:h1", 8, 1_061_000)  # not held: nothing
    setup.now[0] = 1_001_000
    opened = setup.tracer._open["i:h1"][7]
    assert opened.timer is not None
    opened.timer.cancel()
    setup.tracer._deadline(opened)  # the first deadline: moved, so still open
    assert setup.finished("reservation t") == []
    setup.tracer.ended("i:h1", [7], "deleted")
    assert len(setup.finished("reservation t")) == 1


async def test_a_job_back_to_the_same_connection_after_its_ttr_ends_the_first_span(
        setup: Setup) -> None:
    await setup.grant(7, JobTrace(TP, 999_000, 0, 1), ttr=60)
    setup.now[0] = 1_070_000  # its TTR ran out (the timer not fired yet) and it came back
    await setup.grant(7, JobTrace(TP, 999_000, 1_060_000, 2), ttr=60)
    (first,) = setup.finished("reservation t")
    assert first.attributes is not None and first.attributes["tubeq.outcome"] == "ttr"
    assert first.end_time == 1_060_000 * NS
    setup.tracer.ended("i:1", [7], "deleted")
    assert len(setup.finished("reservation t")) == 2


@pytest.mark.parametrize("how", ["disconnect", "shutdown"])
async def test_a_closed_connection_ends_its_reservations(setup: Setup, how: str) -> None:
    await setup.grant(7, JobTrace(TP, 999_000, 0, 1))
    await setup.grant(8, JobTrace(TP, 999_000, 0, 1))
    setup.tracer.closed("i:1", how)
    held = setup.finished("reservation t")
    assert len(held) == 2
    assert {s.attributes["tubeq.outcome"] for s in held if s.attributes} == {how}


async def test_a_deferred_job_is_linked_not_nested_and_a_retry_links_to_the_first(
        setup: Setup) -> None:
    await setup.grant(7, JobTrace(TP, 990_000, ready_since_ms=995_000, reserves=1))  # was delayed
    setup.tracer.ended("i:1", [7], "released")
    (first,) = setup.finished("reservation t")
    assert first.parent is None  # no parent: the producer's span is a link
    assert first.context.trace_id == TRACE  # ... in the producer's trace all the same
    assert links(first) == [(TRACE, PRODUCER)]
    (wait,) = setup.finished("queue-wait t")
    assert wait.start_time == 990_000 * NS  # from the put, delay included

    setup.now[0] = 1_002_000
    await setup.grant(7, JobTrace(TP, 990_000, ready_since_ms=1_001_000, reserves=2))
    setup.tracer.ended("i:1", [7], "deleted")
    retry = next(s for s in setup.finished("reservation t") if s is not first)
    assert retry.parent is not None and retry.parent.span_id == PRODUCER
    assert links(retry) == [(TRACE, PRODUCER), (TRACE, first.context.span_id)]
    assert retry.context.span_id != first.context.span_id
    second_wait = [w for w in setup.finished("queue-wait t") if w is not wait]
    assert second_wait[0].start_time == 1_001_000 * NS  # from its return to ready


class FailingExporter:
    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)

    def export(self, spans: Any) -> Any:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def test_failed_exports_are_logged_at_most_once_a_minute() -> None:
    clock = [100.0]
    exporter = LoggedExporter(FailingExporter(SpanExportResult.FAILURE, OSError("refused"),
                                              SpanExportResult.SUCCESS,
                                              SpanExportResult.FAILURE),
                              "http://c/v1/traces", clock=lambda: clock[0])
    with structlog.testing.capture_logs() as logged:
        assert exporter.export([1, 2]) is SpanExportResult.FAILURE
        clock[0] += 1
        assert exporter.export([3]) is SpanExportResult.FAILURE  # raised: a failure
        assert exporter.export([4]) is SpanExportResult.SUCCESS
        clock[0] += 60
        assert exporter.export([5, 6, 7]) is SpanExportResult.FAILURE
    failures = [e for e in logged if e["event"] == "span export failed"]
    assert [e["spans_lost"] for e in failures] == [2, 4]  # the second line counts 1 + 3


def test_without_the_sdk_traces_are_refused_with_how_to_get_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                        None)
    with pytest.raises(tracing.TracingUnavailable, match=r"tubeq\[otel\]"):
        tracing.start_tracing("http://127.0.0.1:4318")


async def test_a_server_asked_for_traces_without_the_sdk_does_not_start(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.http_support import running_server

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                        None)
    with pytest.raises(StartupError, match=r"tubeq\[otel\]"):
        async with running_server(redis_url, otel_endpoint="http://127.0.0.1:4318"):
            pass


def test_without_opentelemetry_the_server_and_client_import_and_trace_nothing() -> None:
    """opentelemetry made unimportable: the server's and the client's modules still import,
    nothing of OpenTelemetry is loaded, and the client has no context to send."""
    script = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "import tubeq.cli, tubeq.server.process, tubeq.http, tubeq.client\n"
        "from tubeq.client import tracing\n"
        "from tubeq.client.policies import traceparent_option\n"
        "assert tracing.current_traceparent() is None and not tracing.recording()\n"
        "assert traceparent_option(None) == b''\n"
        "with tracing.handler_span('00-' + '1' * 32 + '-' + '2' * 16 + '-01', 1, 't'):\n"
        "    pass\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry.')]\n"
        "assert not loaded, loaded\n"
    )
    _runs_clean(script)


def test_a_server_without_the_flag_loads_no_opentelemetry() -> None:
    script = (
        "import sys\n"
        "import tubeq.cli, tubeq.server.process, tubeq.server.tracing, tubeq.http\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "assert not loaded, loaded\n"
    )
    _runs_clean(script)


def test_a_tracer_provider_set_after_the_consumer_started_is_seen_within_the_recheck() -> None:
    """recording() is asked per job: its "no" is kept for RECORDING_RECHECK_S (asking
    OpenTelemetry costs ~1 us), so a provider set later is seen after that, and then for good.
    In a process of its own (the API sets a provider once per process); the clock is faked."""
    script = (
        "import types\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from tubeq.client import tracing\n"
        "clock = [100.0]\n"
        "tracing.time = types.SimpleNamespace(monotonic=lambda: clock[0])\n"
        "assert not tracing.recording()\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "clock[0] += tracing.RECORDING_RECHECK_S / 2\n"
        "assert not tracing.recording()  # the last no still holds\n"
        "clock[0] += tracing.RECORDING_RECHECK_S\n"
        "assert tracing.recording()\n"
        "clock[0] -= 1000\n"
        "assert tracing.recording()  # a yes holds for good\n"
    )
    _runs_clean(script)


def _runs_clean(script: str) -> None:
    """``script`` runs in a fresh Python process and exits 0 (its stderr's tail otherwise)."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
