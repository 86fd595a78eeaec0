"""OpenTelemetry on the client's side, optional: the producer's context as put-with's
``traceparent``, and a consumer handler's span in the job's trace (protocol.md, "Traces").

Rules: opentelemetry-api is the optional extra ``tubeq[otel]``; it is imported on first use,
and without it every function here answers "nothing to do" (None, False, no span) at the cost
of one call. A handler's span is made only where the application has set a tracer provider of
its own (an SDK): the API's default provider records nothing, and the job's context would then
cost the consumer a ``stats-job`` for nothing. The span follows the OpenTelemetry messaging
conventions for a consumer: kind CONSUMER, a child of the job's context (the producer's span)
and linked to it, named ``process <tube>``.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Final

# A W3C traceparent of version 00 (the server checks the same: tubeq.model.options).
_TRACEPARENT: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@functools.cache
def _api() -> ModuleType | None:
    """opentelemetry.trace, or None when opentelemetry-api is not installed."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


def valid_traceparent(text: str) -> bool:
    """Whether ``text`` is a traceparent the server takes (version 00, lowercase hex; the server
    also refuses all-zero ids)."""
    return _TRACEPARENT.fullmatch(text) is not None


def current_traceparent() -> str | None:
    """The current OpenTelemetry span's context as a W3C traceparent, or None (no
    opentelemetry-api, or no valid span current)."""
    trace = _api()
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


# How long recording()'s "no" holds before OpenTelemetry is asked again: asking costs ~1 us
# (the API reads the environment each time no provider is set), a tenth of a consume()
# worker's CPU per job when asked per job. An application that sets its provider after its
# consumer started is seen within this long; a "yes" holds for good (the API sets a provider
# once).
RECORDING_RECHECK_S = 1.0


class _Recording:
    """recording()'s last answer: True for good, or False until ``until`` (monotonic)."""

    __slots__ = ("until", "yes")

    def __init__(self) -> None:
        self.yes = False
        self.until = float("-inf")


_recording = _Recording()


def recording() -> bool:
    """Whether the application set a tracer provider of its own, so a handler's span would be
    recorded (the API's default, a proxy with nothing behind it, records nothing); a "no" is
    asked again at most every RECORDING_RECHECK_S."""
    last = _recording
    if last.yes:
        return True
    now = time.monotonic()
    if now < last.until:
        return False
    trace = _api()
    last.yes = trace is not None and not isinstance(trace.get_tracer_provider(),
                                                    trace.ProxyTracerProvider)
    last.until = now + RECORDING_RECHECK_S
    return last.yes


@contextlib.contextmanager
def handler_span(traceparent: str | None, job_id: int, tube: str | None) -> Iterator[None]:
    """A CONSUMER span around a handler, child of ``traceparent`` and linked to it (the job's
    context); with no valid ``traceparent`` (or no opentelemetry-api) no span at all."""
    trace = _api()
    found = _TRACEPARENT.fullmatch(traceparent or "")
    if trace is None or found is None:
        yield
        return
    parent = trace.SpanContext(int(found[1], 16), int(found[2], 16), is_remote=True,
                               trace_flags=trace.TraceFlags(int(found[3], 16)))
    attributes: dict[str, str | int] = {"messaging.system": "tubeq",
                                        "messaging.operation.type": "process",
                                        "messaging.message.id": str(job_id)}
    if tube is not None:
        attributes["messaging.destination.name"] = tube
    tracer = trace.get_tracer("tubeq.client")
    with tracer.start_as_current_span(
            f"process {tube or ''}".rstrip(), kind=trace.SpanKind.CONSUMER,
            context=trace.set_span_in_context(trace.NonRecordingSpan(parent)),
            links=[trace.Link(parent)], attributes=attributes):
        yield
