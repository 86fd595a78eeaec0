"""What one HTTP connection may hold: the listener's connection cap and the three timeouts.

Owns the bounds of the HTTP listener's connections (the flags are in README's table):

* the cap, ``--http-max-connections``: connections open at once in this process, counted beside
  the protocol's ``--max-connections``, not within it (a socket on the HTTP port needs no token,
  so it must not take the protocol port's room). One more is answered 503 with the JSON error
  shape and closed before anything of it is read.
* ``--http-idle-timeout``: a connection with no request under way (since its accept, or since
  its last route answered) is closed, without a reply, as HTTP keep-alive closes.
* ``--http-header-timeout``: from a request's first byte, its line and headers must have
  arrived; else a 408 JSON reply, then close.
* ``--http-body-timeout``: from the end of the headers, the whole body must have arrived. The
  route's next read of it raises :class:`tubeq.http.common.BodyTimeout`, which
  common.json_errors answers 408 and closes; a route that answered without reading it has its
  connection closed.

Each bound is one timer of the connection, started and stopped as its request moves along;
nothing polls. A connection's timeline::

    accept --idle--> first byte --head--> headers parsed: route runs --> route answers --idle-->
                                          \\--body (from here until the body is whole)--/

aiohttp parses and dispatches. :class:`GuardedRequestHandler`, its request handler (the
asyncio protocol of each connection), watches the bytes arrive, hears from the middleware
:func:`request_phases` when a route starts and ends, and answers what aiohttp refuses before
any route runs (a malformed or over-long request line or header, a bad Content-Length, both
Content-Length and Transfer-Encoding) with the JSON error shape and one log line, where aiohttp
would answer text and log a traceback.
"""

from __future__ import annotations

import asyncio
import enum
import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, cast

from aiohttp import StreamReader, web

from tubeq.http.common import BodyTimeout, Handler, error_response, log
from tubeq.server.context import Capacity

if TYPE_CHECKING:
    from tubeq.server.process import Config

# How much of aiohttp's reason for refusing a request goes into the error body and the log.
MAX_REASON: Final = 200


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The listener's bounds: connections at once (0: no cap) and the three timeouts (s)."""

    max_connections: int
    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float

    @classmethod
    def of(cls, config: Config) -> HttpLimits:
        return cls(config.http_max_connections, config.http_header_timeout_s,
                   config.http_body_timeout_s, config.http_idle_timeout_s)


class Phase(enum.Enum):
    IDLE = "idle"  # no request under way: the idle timer runs
    HEAD = "head"  # a request's first bytes arrived, not yet its whole head: the head timer
    ROUTE = "route"  # the route runs (and may be reading the body)
    DRAIN = "drain"  # the route answered; its body is still arriving (the body timer bounds it)


def raw_json_response(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response with the JSON error body, for the moments no aiohttp response
    can be made (no request was parsed); it asks the client to close."""
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            "Content-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class GuardedRequestHandler(web.RequestHandler):
    """aiohttp's request handler for one connection, with the listener's bounds."""

    __slots__ = ("_body", "_body_timer", "_counted", "_limits", "_phase", "_slots", "_timer",
                 "_timers_loop")

    def __init__(self, manager: web.Server, limits: HttpLimits, slots: Capacity,
                 loop: asyncio.AbstractEventLoop) -> None:
        options: dict[str, Any] = {
            "access_log": None,
            # aiohttp's own keep-alive timer is only the backstop: ours always fire first.
            "keepalive_timeout": limits.idle_timeout_s + limits.header_timeout_s,
        }
        super().__init__(manager, loop=loop, **options)
        self._limits = limits
        self._slots = slots
        self._timers_loop = loop
        self._counted = False
        self._phase = Phase.IDLE
        self._timer: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None  # a body still arriving
        self._body_timer: asyncio.TimerHandle | None = None

    # -- asyncio's protocol calls ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._slots.take():
            # Over the cap: one clear answer, then closed; aiohttp never sees the connection.
            writer = cast(asyncio.Transport, transport)  # uvloop's do not subclass asyncio's
            writer.write(raw_json_response(
                503, f"too many connections: at most {self._slots.limit} "
                     "(--http-max-connections)"))
            writer.close()
            unlogged = self._slots.refusal_to_log()
            if unlogged is not None:
                log.warning("http connection refused: --http-max-connections reached",
                            peer=transport.get_extra_info("peername"),
                            refused_unlogged_before=unlogged)
            return
        self._counted = True
        super().connection_made(transport)
        self._enter(Phase.IDLE)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._counted:  # refused: aiohttp never had it
            return
        self._counted = False
        self._slots.open -= 1
        self._cancel_timer()
        self._cancel_body_timer()
        self._body = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase is Phase.IDLE and data:
            self._enter(Phase.HEAD)
        super().data_received(data)

    # -- what the middleware tells -----------------------------------------------------------

    def route_started(self, request: web.BaseRequest) -> None:
        """The request's head is parsed and its route runs: the body timer starts if a body
        is still to come."""
        self._enter(Phase.ROUTE)
        self._cancel_body_timer()
        body = request.content
        if not body.is_eof():
            self._body = body
            self._body_timer = self._timers_loop.call_later(self._limits.body_timeout_s,
                                                            self._body_timed_out)
            body.on_eof(self._body_received)

    def route_finished(self) -> None:
        """The route answered (its response is about to be written)."""
        if not self._counted:  # the connection is gone
            return
        if self._body is not None:
            self._phase = Phase.DRAIN  # aiohttp reads the rest; the body timer bounds it
        else:
            self._enter(Phase.IDLE)

    # -- timers ------------------------------------------------------------------------------

    def _enter(self, phase: Phase) -> None:
        self._cancel_timer()
        self._phase = phase
        timeout = (self._limits.idle_timeout_s if phase is Phase.IDLE
                   else self._limits.header_timeout_s if phase is Phase.HEAD else None)
        if timeout is not None:
            self._timer = self._timers_loop.call_later(timeout, self._timed_out)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _timed_out(self) -> None:
        self._timer = None
        transport = self.transport
        if transport is None:
            return
        if self._phase is Phase.HEAD:
            seconds = self._limits.header_timeout_s
            transport.write(raw_json_response(
                408, f"request line and headers not received within {seconds:g} s"))
            log.info("http request timed out", phase="head", timeout_s=seconds,
                     peer=transport.get_extra_info("peername"))
        self.force_close()

    def _body_received(self) -> None:
        self._cancel_body_timer()
        self._body = None
        if self._phase is Phase.DRAIN:
            self._enter(Phase.IDLE)

    def _body_timed_out(self) -> None:
        self._body_timer = None
        body, self._body = self._body, None
        if body is not None and self._phase is Phase.ROUTE:
            # The route's read raises it (at once if it is reading): it answers 408 and the
            # connection closes; aiohttp takes a TimeoutError from the rest of the body as
            # the end of its reading.
            body.set_exception(BodyTimeout(self._limits.body_timeout_s))
        else:
            self.force_close()

    # -- aiohttp's refusals ------------------------------------------------------------------

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse (or, were it to happen, a route
        failing outside common.json_errors): the JSON error shape, one log line, and the
        connection closed, as aiohttp closes it."""
        if request.writer.output_size > 0:  # a response was started: nothing more can be said
            raise ConnectionError("a response was sent already; cannot send an error")
        if status < 500:
            told = message or getattr(exc, "message", None) or str(exc or "")
            # aiohttp's parser draws a caret under the bad byte: one line is enough here.
            reason = " ".join(told.split())[:MAX_REASON] or HTTPStatus(status).phrase
            log.info("http request refused", status=status, error=reason, peer=request.remote)
            response = error_response(status, f"bad request: {reason}")
        else:
            log.error("http request failed", status=status, peer=request.remote,
                      exc_info=exc)
            response = error_response(status, "internal error")
        response.force_close()
        return response


@web.middleware
async def request_phases(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection when its route starts and ends (the outermost middleware)."""
    connection = request.protocol
    if not isinstance(connection, GuardedRequestHandler):
        return await handler(request)
    connection.route_started(request)
    try:
        return await handler(request)
    finally:
        connection.route_finished()
