"""Jobs that answer, on the client side (protocol.md, "Ends"): the ``wait`` and request/reply
lines and their answers.

:class:`Ended` is how a job ended; :func:`wait_line` builds a ``wait-ms`` and :func:`result_of`
turns an end into a result or the error saying how else the job ended. ``Client.wait`` and
``Client.call`` send them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Protocol

from tubeq.client.args import _job_id, _uint
from tubeq.client.errors import JobNotFinished
from tubeq.client.parser import Reply
from tubeq.client.wire import U32_MAX

# The longest wait the server takes, in ms (its u32 seconds, in ms).
MAX_WAIT_MS: Final = U32_MAX * 1000
# How long past its timeout a wait or call waits for the server's answer before it gives up
# on its own (the server answers within 0.25 s of the timeout unless it is stopped or cut
# off): no call hangs past its timeout by more than this.
REPLY_GRACE_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class Ended:
    """How job ``id`` ended: ``how`` is ``finished`` (``data``: its result), ``deleted``,
    ``buried`` (``data``: why tubeq buried it, then the last error after a newline) or
    ``expired``."""

    id: int
    how: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Progress:
    """A living job's ``seq``-th progress report (its holder's ``Job.progress``)."""

    id: int
    seq: int
    data: bytes


def wait_ms(timeout: float) -> int:
    """A timeout in seconds as the server's milliseconds (ValueError when out of range)."""
    if not 0 <= timeout <= MAX_WAIT_MS / 1000:
        raise ValueError(f"timeout must be between 0 and {MAX_WAIT_MS // 1000} s, not {timeout}")
    return round(timeout * 1000)


def wait_line(job_id: int, timeout: float, progress_after: int | None = None) -> bytes:
    line = b"wait-ms %d %d" % (_job_id(job_id), wait_ms(timeout))
    if progress_after is not None:
        line += b" progress=%d" % _uint(progress_after, "progress_after")
    return line + b"\r\n"


def progress_of(reply: Reply) -> Progress:
    """A ``PROGRESS <id> <n> <bytes>`` reply as a :class:`Progress`."""
    assert reply.body is not None
    return Progress(reply.int_arg(0), reply.int_arg(1), reply.body)


def ended_of(reply: Reply) -> Ended:
    """An ``ENDED <id> <how> <bytes>`` reply as an :class:`Ended`."""
    assert reply.body is not None
    return Ended(reply.int_arg(0), reply.args[1].decode("ascii", "replace"), reply.body)


def result_of(end: Ended) -> bytes:
    """A finished job's result; :class:`JobNotFinished` for any other end."""
    if end.how != "finished":
        raise JobNotFinished(end.id, end.how, end.data)
    return end.data


class Codec(Protocol):
    """How values become job bodies and results and back (``Client.call``/``wait`` and
    ``consume(codec=...)``): :data:`JSON`, or any object with these two methods."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """Values as compact UTF-8 JSON (``json.dumps`` with ``ensure_ascii=False``)."""

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()

    def decode(self, data: bytes) -> Any:
        return json.loads(data)


JSON: Final = JsonCodec()
