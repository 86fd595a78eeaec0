"""Backpressure for one client connection (protocol.md "Limits: flow control per connection").

Owns: :class:`FlowControl`, whether the connection reads its socket, whether its client takes
its replies, and whether the command pump stopped at a bound; and the bounds that are not
settings: ``TURN_BUDGET`` and ``HELD_INPUT_MAX``.

Rules: a connection's unanswered commands are bounded by count (``max_in_flight``), the commands
taken from it per event-loop turn by ``TURN_BUDGET`` (so one pipelined flood cannot starve the
other connections), and its unsent replies by the transport's high-water mark: whenever any bound
is reached the connection stops reading (pause_reading) and the client's own socket fills, as
with beanstalkd, which serves one command at a time. Reading resumes as replies leave. The
connection's pump checks its bounds against this state before each command, inline (the one
check every command pays). A connection that holds more than ``max_client_buffer`` bytes all
the same (unsent replies plus unparsed input: only replies far larger than usual can get
there) is aborted with a log line (:meth:`FlowControl.aborted_over_cap`), and its reservations
go back to ready as on any disconnect.
"""

from __future__ import annotations

import asyncio

import structlog

log = structlog.get_logger(__name__)

# Commands dispatched from one connection per event-loop turn before the others get theirs. A
# turn of 64 lets a client's whole pipeline (or one full Redis batch, REDIS_BATCH_CALLS) through
# in one go while a flood of small commands yields every few hundred microseconds.
TURN_BUDGET = 64
# A reserve that waits holds the commands sent after it; until this many bytes of them have
# arrived the connection keeps reading (so a client that closes is noticed, as beanstalkd
# notices a hang-up while a reserve waits), past it reading stops like any other backpressure.
HELD_INPUT_MAX = 256 * 1024


class FlowControl:
    """One connection's reading and writing state, as uvicorn's FlowControl keeps it."""

    __slots__ = ("reading", "throttled", "transport", "write_paused")

    def __init__(self) -> None:
        # Until the connection is made, and again once it is lost: reading is left alone.
        self.transport: asyncio.Transport | None = None
        self.reading = True  # not paused by flow control
        self.write_paused = False  # the transport's buffer is past its high-water mark
        self.throttled = False  # the pump stopped at a bound; a flush or resume restarts it

    @staticmethod
    def reads_behind_reserve(buffered: int) -> bool:
        """Whether reading goes on while a waiting reserve holds the ``buffered`` input."""
        return buffered < HELD_INPUT_MAX

    def aborted_over_cap(self, buffered: int, cap: int, token: str) -> bool:
        """Abort the connection if it holds more than ``cap`` bytes (unsent replies plus
        ``buffered`` input); whether it did. Its disconnect gives its jobs back."""
        assert self.transport is not None
        held = self.transport.get_write_buffer_size() + buffered
        if held <= cap:
            return False
        log.warning("connection over its buffer limit, closed", token=token, bytes=held,
                    limit=cap)
        self.transport.abort()  # the unsent replies go: the client was not taking them
        return True

    def set_reading(self, on: bool) -> None:
        if on is not self.reading and self.transport is not None:
            self.reading = on
            if on:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def pause_writing(self) -> None:
        # The client is not taking its replies: take no more commands from it (the pump stops
        # at the next command) and stop reading, so its own socket buffer fills.
        self.write_paused = True
        self.set_reading(False)

    def resume_writing(self) -> None:
        self.write_paused = False
