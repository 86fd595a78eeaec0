"""put-with's options and answer on the client side (protocol.md, "put-with").

:func:`put_with_line` checks the options a caller gives before anything is sent (ValueError for
a value the server would refuse with ``BAD_OPTION``) and builds the command line;
:class:`PutResult` says whether the job was inserted or a living job already had the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tubeq.client.args import _tube, _uint
from tubeq.client.tracing import current_traceparent, valid_traceparent
from tubeq.client.wire import MAX_MS, U32_MAX, U64_MAX

ON_EXPIRE: Final = ("bury", "delete")
_KEY_BYTES: Final = frozenset(range(0x21, 0x7F)) - {ord("=")}


@dataclass(frozen=True, slots=True)
class PutResult:
    """A put-with's outcome: the new job's id (``inserted``), or the id of the living job that
    already has the dedupe key (not inserted: nothing was enqueued)."""

    id: int
    inserted: bool


def _key(key: str) -> bytes:
    data = key.encode("utf-8")
    if not 1 <= len(data) <= 200 or not set(data) <= _KEY_BYTES:
        raise ValueError(f"key {key!r}: 1-200 printable ASCII bytes, no space, no '='")
    return data


# after=: at most this many parents (the server's tubeq.model.options.MAX_PARENTS).
MAX_PARENTS: Final = 1000


def _after(parents: Sequence[int]) -> bytes:
    ids = list(dict.fromkeys(_uint(p, "after", U64_MAX) for p in parents))
    if not 1 <= len(ids) <= MAX_PARENTS or 0 in ids:
        raise ValueError(f"after: 1 to {MAX_PARENTS} job ids, each at least 1")
    return b",".join(b"%d" % p for p in ids)


def put_with_line(pri: int, delay: int, ttr: int, size: int, *, delay_ms: int | None,
                  max_tries: int | None, backoff_ms: int | None, backoff_max_ms: int | None,
                  ttl_ms: int | None, on_expire: str | None, key: str | None,
                  after: Sequence[int] | None = None, result_ttl_ms: int | None = None,
                  group: str | None = None, traceparent: str | None = None) -> bytes:
    """The ``put-with`` command line (CRLF included) for these arguments and options.
    ``traceparent`` None: the current OpenTelemetry context's, if any (tubeq.client.tracing);
    "": none."""
    if delay_ms is not None and delay:
        raise ValueError("give delay (s) or delay_ms, not both")
    line = b"put-with %d %d %d %d" % (_uint(pri, "pri"), _uint(delay, "delay"),
                                      _uint(ttr, "ttr"), size)
    numbers = (("delay-ms", delay_ms, MAX_MS), ("max-tries", max_tries, U32_MAX),
               ("backoff-ms", backoff_ms, MAX_MS), ("backoff-max-ms", backoff_max_ms, MAX_MS),
               ("ttl-ms", ttl_ms, MAX_MS), ("result-ttl-ms", result_ttl_ms, MAX_MS))
    for name, value, maximum in numbers:
        if value is not None:
            line += b" %s=%d" % (name.encode(), _uint(value, name.replace("-", "_"), maximum))
    if on_expire is not None:
        if on_expire not in ON_EXPIRE:
            raise ValueError(f"on_expire must be one of {ON_EXPIRE}, not {on_expire!r}")
        line += b" on-expire=" + on_expire.encode()
    if key is not None:
        line += b" key=" + _key(key)
    if after is not None:
        line += b" after=" + _after(after)
    if group is not None:  # spelled as a tube name
        line += b" group=" + _tube(group)
    return line + traceparent_option(traceparent) + b"\r\n"


def traceparent_option(traceparent: str | None) -> bytes:
    """`` traceparent=...`` for put-with, or b"": ``traceparent`` None takes the current
    OpenTelemetry context's (none without opentelemetry-api or a current span), "" sends none;
    a value the server would refuse is a ValueError."""
    if traceparent is None:
        traceparent = current_traceparent()
    if not traceparent:
        return b""
    if not valid_traceparent(traceparent):
        raise ValueError(f"traceparent {traceparent!r}: a W3C traceparent of version 00")
    return b" traceparent=" + traceparent.encode("ascii")


def key_arg(key: str) -> bytes:
    """A dedupe key as peek-key sends it (ValueError for one the server would refuse)."""
    return _key(key)
