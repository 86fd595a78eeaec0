"""OpenTelemetry spans of traced jobs (put-with ``traceparent=``), exported by the SDK over
OTLP/HTTP: one per put, a queue wait from the put to the reserve that only the server sees, and
one per reservation until its end (protocol.md, "Traces").

Owns: this process's tracer provider, built by :func:`start_tracing` only with
``--otel-endpoint`` (or the standard ``OTEL_EXPORTER_OTLP_*`` endpoint variables), which is the
only place the SDK is imported; the open reservation spans, by connection token and job id, and
their TTR timers; the log of failed exports.

Rules:

* Off costs nothing: the server then holds None instead of a :class:`JobTracer`, and each of its
  hooks (a put-with, a grant, a settle, a disconnect) is one ``is None`` test. A job without a
  traceparent costs a traced server one HMGET per reservation (:meth:`Store.job_trace`) and no span.
* Only sampled contexts (traceparent flags 01) make spans: the producer's sampling decides,
  and a span costs the SDK ~0.1 ms of CPU to make and as much to encode (bench/RESULTS-traces.md).
* Serving never waits for the exporter: a span ends into the SDK's batch processor (a bounded
  queue, 2,048 spans unless ``OTEL_BSP_MAX_QUEUE_SIZE`` says otherwise; a full queue drops
  spans), whose own thread exports them. Failed exports are logged at most once a minute, with
  how many spans they lost, never once per span.
* Shapes. The put span (SERVER) is a child of the producer's span. The queue wait (INTERNAL)
  runs from the put (a retry's: from its return to ready) to the reserve, a child of the
  producer's span and linked to it. A reservation span (CONSUMER) runs from the reserve to
  its end: ``deleted``, ``released``, ``hand-back``, ``buried``, ``finished``, ``failed``,
  ``cancelled``, ``ttr`` (its deadline passed untouched), ``disconnect`` or ``shutdown``; it
  is a child of the producer's span and linked to it, except for a deferred job (one that did
  not go straight from its put to ready: delayed, held by after=, kicked): its first
  reservation has no parent, only the link (a job that runs hours later is not part of the
  request that put it), but keeps the producer's trace id, so the trace still finds it. A
  retry (a later reservation) is a new span, a child of the producer's, linked to the
  producer's and to the first reservation's, whose span id every process derives from the job
  (:func:`first_reservation`): nothing more is stored with the job.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

import structlog

from tubeq.store.base import JobStore
from tubeq.store.records import JobTrace, Reservation

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, SpanContext, Tracer

log = structlog.get_logger("tubeq.tracing")

# A failed export is logged at most this often (s), with the spans lost since the last line.
EXPORT_FAILURE_LOG_S: Final = 60.0
# How long a stopping server waits for its last spans to leave (s).
SHUTDOWN_FLUSH_S: Final = 5.0
# The OTLP/HTTP path of traces, appended to --otel-endpoint as to OTEL_EXPORTER_OTLP_ENDPOINT.
TRACES_PATH: Final = "/v1/traces"
# The W3C traceparent put-with takes (tubeq.model.options checked it already).
_TRACEPARENT: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_NS_PER_MS: Final = 1_000_000
# The last hex digit of a sampled traceparent's flags (bit 0 set).
_SAMPLED_LAST_DIGITS: Final = frozenset("13579bdf")


class TracingUnavailable(Exception):
    """Traces were asked for and the OpenTelemetry SDK is not installed."""


class Holder(Protocol):
    """What the tracer reads of a connection holding jobs (tubeq.server.context.Session):
    its token, and its reserved jobs' TTR deadlines, which touch moves."""

    token: str
    reserved: dict[int, int]


@dataclass(eq=False)
class Held:
    """A holder without a connection: an HTTP API reservation (its token, and the one job it
    holds with its deadline, which the HTTP touch moves: :meth:`JobTracer.moved`)."""

    token: str
    reserved: dict[int, int]


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of ``--otel-endpoint``: the collector's base URL, to which
    ``/v1/traces`` is added (a URL that already ends in it is taken as it is)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def wanted(endpoint: str | None, environ: dict[str, str] | None = None) -> bool:
    """Whether this process exports traces: ``--otel-endpoint`` given, or an OTLP endpoint in
    the standard variables; ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turns
    either off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(endpoint) or bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                                  or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def first_reservation(trace_id: int, job_id: int, prefix: str) -> int:
    """The span id of job ``job_id``'s first reservation in namespace ``prefix``, put in trace
    ``trace_id``: derived, not random, so a retry on any process links to it."""
    digest = hashlib.blake2b(f"{trace_id:032x}:{prefix}:{job_id}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") or 1


@dataclass(eq=False)
class _Open:
    """A reservation span not ended yet."""

    span: Span
    holder: Holder
    job_id: int
    deadline_ms: int
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class _Pending:
    """A grant whose job_trace read is out; an end heard meanwhile waits here."""

    ended: tuple[str, int] | None = None  # (how, when in ms)


@dataclass(eq=False)
class JobTracer:
    """The spans of one tubeq process (every namespace it serves)."""

    provider: TracerProvider
    tracer: Tracer
    ids: _PresetIds
    clock_ms: Any = field(default=lambda: time.time_ns() // _NS_PER_MS)
    _open: dict[str, dict[int, _Open]] = field(default_factory=dict)  # by token, job id
    _pending: dict[tuple[str, int], _Pending] = field(default_factory=dict)

    # -- put ----------------------------------------------------------------------------------

    def put(self, traceparent: str, tube: str, prefix: str, start_ms: int, job_id: int,
            outcome: str) -> None:
        """A put-with that carried ``traceparent``, from ``start_ms`` to now: ``outcome``
        'inserted' (job ``job_id``), 'duplicate' (of ``job_id``) or the refusal."""
        parent = _span_context(traceparent)
        if parent is None:
            return
        from opentelemetry import trace

        span = self.tracer.start_span(
            f"put {tube}", context=trace.set_span_in_context(trace.NonRecordingSpan(parent)),
            kind=trace.SpanKind.SERVER, start_time=start_ms * _NS_PER_MS,
            attributes={**_job_attributes(tube, job_id, prefix), "tubeq.outcome": outcome,
                        "messaging.operation.type": "send"})
        span.end(end_time=self.clock_ms() * _NS_PER_MS)

    # -- reservations -------------------------------------------------------------------------

    def reserved(self, store: JobStore, holder: Holder, jobs: Iterable[Reservation]) -> None:
        """``holder`` was granted ``jobs``: the traced ones get their queue-wait span and an
        open reservation span once their record is read."""
        for job in jobs:
            key = (holder.token, job.id)
            pending = self._pending[key] = _Pending()
            store.job_trace(job.id).add_done_callback(
                functools.partial(self._read, store, holder, job, pending))

    def _read(self, store: JobStore, holder: Holder, job: Reservation, pending: _Pending,
              f: asyncio.Future[JobTrace | None]) -> None:
        key = (holder.token, job.id)
        if self._pending.get(key) is pending:
            del self._pending[key]
        if f.cancelled() or f.exception() is not None:
            return
        record = f.result()
        parent = None if record is None else _span_context(record.traceparent)
        if record is None or parent is None:
            return
        from opentelemetry import trace

        prefix = store.keys.prefix
        reserved_ms = job.deadline_ms - job.ttr * 1000
        first = record.reserves <= 1
        in_producer = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        attributes = _job_attributes(job.tube, job.id, prefix)
        waited_from = record.created_ms if first or not record.ready_since_ms \
            else record.ready_since_ms
        wait = self.tracer.start_span(
            f"queue-wait {job.tube}", context=in_producer, kind=trace.SpanKind.INTERNAL,
            start_time=waited_from * _NS_PER_MS, links=[trace.Link(parent)],
            attributes={**attributes, "tubeq.reserves": record.reserves})
        wait.end(end_time=max(reserved_ms, waited_from) * _NS_PER_MS)

        first_span = first_reservation(parent.trace_id, job.id, prefix)
        deferred = first and record.ready_since_ms > 0
        links = [trace.Link(parent, {"tubeq.link": "producer"})]
        if not first:
            links.append(trace.Link(trace.SpanContext(
                parent.trace_id, first_span, is_remote=True, trace_flags=parent.trace_flags),
                {"tubeq.link": "first-reservation"}))
        if first:  # (a deferred one, with no parent, keeps the producer's trace id)
            self.ids.preset(parent.trace_id if deferred else None, first_span)
        try:
            span = self.tracer.start_span(
                f"reservation {job.tube}",
                context=trace.set_span_in_context(trace.INVALID_SPAN) if deferred else in_producer,
                kind=trace.SpanKind.CONSUMER, start_time=reserved_ms * _NS_PER_MS, links=links,
                attributes={**attributes, "tubeq.reserves": record.reserves,
                            "messaging.operation.type": "receive"})
        finally:
            self.ids.preset(None, None)
        opened = _Open(span, holder, job.id, job.deadline_ms)
        if pending.ended is not None:  # settled before its record came back
            self._end(opened, *pending.ended)
            return
        held = self._open.setdefault(holder.token, {})
        earlier = held.get(job.id)
        if earlier is not None:  # its TTR ran out and it came back to the same connection
            self._end(earlier, "ttr", min(earlier.deadline_ms, reserved_ms))
        held[job.id] = opened
        self._arm(opened, job.deadline_ms)

    def _arm(self, opened: _Open, deadline_ms: int) -> None:
        opened.deadline_ms = deadline_ms
        loop = asyncio.get_running_loop()
        delay_s = max(0.0, (deadline_ms - self.clock_ms()) / 1000)
        opened.timer = loop.call_later(delay_s, self._deadline, opened)

    def _deadline(self, opened: _Open) -> None:
        """A reservation's TTR deadline: touched meanwhile, wait for the new one; else its
        span ends at the deadline, as expire.lua ends the reservation."""
        opened.timer = None
        deadline = opened.holder.reserved.get(opened.job_id, opened.deadline_ms)
        if deadline > self.clock_ms():
            self._arm(opened, deadline)
            return
        held = self._open.get(opened.holder.token)
        if held is not None and held.get(opened.job_id) is opened:
            self._drop(opened.holder.token, opened.job_id)
            self._end(opened, "ttr", deadline)

    def ended(self, token: str, job_ids: Iterable[int], how: str) -> None:
        """Connection ``token`` no longer holds ``job_ids``: ``how`` (the reply's word in lower
        case: deleted, released, buried, finished, failed, cancelled)."""
        now = self.clock_ms()
        for job_id in job_ids:
            opened = self._drop(token, job_id)
            if opened is not None:
                self._end(opened, how, now)
            else:
                pending = self._pending.get((token, job_id))
                if pending is not None:
                    pending.ended = (how, now)

    def moved(self, token: str, job_id: int, deadline_ms: int) -> None:
        """``token``'s reservation of ``job_id`` got a new TTR deadline (a touch of a holder
        without a connection: a connection's own reserved map says it already)."""
        opened = self._open.get(token, {}).get(job_id)
        if opened is not None:
            opened.holder.reserved[job_id] = deadline_ms

    def closed(self, token: str, how: str = "disconnect") -> None:
        """Connection ``token`` went away (``how``: 'disconnect', or 'shutdown' when its
        stopping server closed it): what it held returns to the queue."""
        now = self.clock_ms()
        for opened in self._open.pop(token, {}).values():
            self._end(opened, how, now)
        for key, pending in self._pending.items():
            if key[0] == token and pending.ended is None:
                pending.ended = (how, now)

    def _drop(self, token: str, job_id: int) -> _Open | None:
        held = self._open.get(token)
        if held is None:
            return None
        opened = held.pop(job_id, None)
        if not held:
            del self._open[token]
        return opened

    @staticmethod
    def _end(opened: _Open, how: str, at_ms: int) -> None:
        if opened.timer is not None:
            opened.timer.cancel()
        opened.span.set_attribute("tubeq.outcome", how)
        opened.span.end(end_time=at_ms * _NS_PER_MS)

    # -- process ------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """End what is open (the process stops: its connections are closed) and send the
        last spans, waiting at most SHUTDOWN_FLUSH_S."""
        for token in list(self._open):
            self.closed(token)
        with_bound = asyncio.to_thread(self.provider.shutdown)
        try:
            await asyncio.wait_for(with_bound, SHUTDOWN_FLUSH_S)
        except TimeoutError:
            log.warning("traces not all sent at shutdown", waited_s=SHUTDOWN_FLUSH_S)


def _span_context(traceparent: str) -> SpanContext | None:
    """The producer's context, or None when it makes no span here: not a traceparent, or not
    sampled (flags bit 0 clear: the producer records nothing of this trace, so the server does
    not either, as the SDK's parent-based sampler decides; a deferred job's first reservation,
    a root, would otherwise be sampled on its own)."""
    if traceparent[-1:] not in _SAMPLED_LAST_DIGITS:  # most traffic: decided without the regex
        return None
    found = _TRACEPARENT.fullmatch(traceparent)
    if found is None:
        return None
    from opentelemetry import trace

    return trace.SpanContext(int(found[1], 16), int(found[2], 16), is_remote=True,
                             trace_flags=trace.TraceFlags(int(found[3], 16)))


def _job_attributes(tube: str, job_id: int, prefix: str) -> dict[str, str | int]:
    return {"messaging.system": "tubeq", "messaging.destination.name": tube,
            "messaging.message.id": str(job_id), "tubeq.namespace": prefix}


class _PresetIds:
    """The SDK's id generator, but for the one span whose ids are derived (a first
    reservation): preset just before that span starts, on the event loop's thread."""

    def __init__(self) -> None:
        import random

        self._random = random.SystemRandom()
        self._trace: int | None = None
        self._span: int | None = None
        self._thread = threading.get_ident()

    def preset(self, trace_id: int | None, span_id: int | None) -> None:
        self._trace, self._span = trace_id, span_id

    def generate_span_id(self) -> int:
        if self._span is not None and threading.get_ident() == self._thread:
            return self._span
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        if self._trace is not None and threading.get_ident() == self._thread:
            return self._trace
        return self._random.getrandbits(128) or 1


class LoggedExporter:
    """A span exporter (the SDK's SpanExporter, by its methods) whose failures are counted and
    logged at most once every EXPORT_FAILURE_LOG_S, with the spans lost since the last line;
    an exception from the exporter is such a failure (its batch is lost, nothing more)."""

    def __init__(self, inner: Any, where: str, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self._inner = inner
        self._where = where
        self._clock = clock
        self._results = SpanExportResult
        self.lost = 0  # spans lost since the last line
        self._logged_at = float("-inf")

    def export(self, spans: Sequence[Any]) -> Any:
        error = ""
        try:
            result = self._inner.export(spans)
        except Exception as exc:
            result, error = self._results.FAILURE, repr(exc)
        if result is not self._results.SUCCESS:
            self.lost += len(spans)
            now = self._clock()
            if now - self._logged_at >= EXPORT_FAILURE_LOG_S:
                log.warning("span export failed", spans_lost=self.lost, endpoint=self._where,
                            error=error or None)
                self.lost, self._logged_at = 0, now
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


def build_tracer(processor: Any) -> JobTracer:
    """A JobTracer whose spans go to ``processor`` (an SDK span processor), with the derived
    ids of first reservations (_PresetIds). Raises :class:`TracingUnavailable` without the
    SDK."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.id_generator import IdGenerator
    except ImportError as error:
        raise TracingUnavailable(
            f"traces need the OpenTelemetry SDK and OTLP exporter: pip install 'tubeq[otel]' "
            f"({error})") from None

    class Ids(_PresetIds, IdGenerator):
        pass

    ids = Ids()
    resource = Resource.create({} if os.environ.get("OTEL_SERVICE_NAME")
                               else {"service.name": "tubeq"})
    provider = TracerProvider(resource=resource, id_generator=ids)
    provider.add_span_processor(processor)
    return JobTracer(provider, provider.get_tracer("tubeq"), ids)


def start_tracing(endpoint: str | None) -> JobTracer:
    """The process's tracer, exporting over OTLP/HTTP to ``endpoint`` (its base URL; None or
    "": where the OTEL_EXPORTER_OTLP_* variables say), batched. Raises
    :class:`TracingUnavailable` without the SDK and exporter (``pip install 'tubeq[otel]'``)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as error:
        raise TracingUnavailable(
            f"traces need the OpenTelemetry SDK and OTLP exporter: pip install 'tubeq[otel]' "
            f"({error})") from None
    # The exporter logs every failed batch itself; LoggedExporter says it once a minute.
    logging.getLogger("opentelemetry.exporter.otlp.proto.http").setLevel(logging.CRITICAL)
    url = traces_url(endpoint) if endpoint else None
    where = url or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "") + TRACES_PATH)
    # (LoggedExporter is a SpanExporter by its methods: defined without the SDK's base class,
    # as this module is imported where the SDK is not installed)
    exporter = cast("SpanExporter", LoggedExporter(OTLPSpanExporter(endpoint=url), where))
    tracer = build_tracer(BatchSpanProcessor(exporter))
    log.info("exporting traces", endpoint=where)
    return tracer
