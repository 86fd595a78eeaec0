"""The HTTP listener (``--metrics ADDR:PORT``): /metrics, the JSON API and the dashboard.

One aiohttp application on the server's own event loop, so its routes call the same store,
counters and waiter registry as the protocol connections, with no thread and no second Redis
connection. Imports run one way: this package reads the server (its context, store, counters,
metrics); the server never imports it. tubeq.cli (the composition root) hands
:class:`HttpListener` to the Server, which opens it at start (tubeq.server.process.HttpFront).

Modules: ``common`` (JSON errors, input checks), ``limits`` (the connection cap and the
header, body and idle timeouts of each connection), ``api`` (/api/...), ``reservations`` (the
long-poll reserve and who owns its job), ``prometheus`` (/metrics), ``dashboard`` (/ and
/tubes/..., with ``static/``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware

from tubeq.http.common import SERVER, json_errors, require_metrics_reader
from tubeq.http.limits import GuardedRequestHandler, HttpLimits, request_phases
from tubeq.http.ratelimit import RateLimiter
from tubeq.server.context import Capacity
from tubeq.server.listeners import tls_context

if TYPE_CHECKING:
    from tubeq.server.process import Server

# The largest request read into memory, per byte of max-job-size: a JSON put carries its body
# as a JSON string, where any byte may be escaped as \u00XX (6 bytes for 1; a 2-byte UTF-8
# character is 6 bytes for 2, a 4-byte one a surrogate pair, 12 for 4; base64 is 4 for 3, or
# under 3 per byte with every '/' escaped), so 6 lets every usual encoding of every job through.
# The decoded body is then checked against max-job-size (413). A raw put never reads more than
# max-job-size + 1 bytes of its body (tubeq.http.api), whatever this cap.
JSON_BYTES_PER_BODY_BYTE = 6
# Room for the JSON around the body: put's options (a 200-byte dedupe key escaped is 1,200).
BODY_OVERHEAD = 4096
# How long shutdown lets requests in flight finish; long polls are cancelled (and give back
# any job granted meanwhile) rather than waited for.
SHUTDOWN_GRACE_S = 1.0
# Connections the kernel queues before tubeq accepts them (aiohttp's own default).
LISTEN_BACKLOG = 128


def make_app(server: Server) -> web.Application:
    from tubeq.http import api, dashboard, prometheus

    assert server.ctx is not None
    middlewares: list[Middleware] = [request_phases, json_errors]
    if server.config.http_rate > 0:
        middlewares.append(RateLimiter(server.config.http_rate).middleware())
    app = web.Application(middlewares=middlewares,
                          client_max_size=request_cap(server.ctx.max_job_size))
    app[SERVER] = server

    async def metrics(request: web.Request) -> web.StreamResponse:
        require_metrics_reader(request)
        return await prometheus.metrics(request)

    app.router.add_get("/metrics", metrics)
    api.add_routes(app, server)
    dashboard.add_routes(app)
    return app


def request_cap(max_job_size: int) -> int:
    """The most bytes of a request body the listener reads before it answers 413."""
    return max_job_size * JSON_BYTES_PER_BODY_BYTE + BODY_OVERHEAD


class HttpListener:
    """Start and stop the application on one address; each connection is aiohttp's request
    handler with the listener's bounds (tubeq.http.limits)."""

    def __init__(self, server: Server) -> None:
        config = server.config
        tls = config.tls  # the protocol listener's certificate serves HTTPS too
        self._ssl = tls_context(tls) if tls is not None else None
        self._tls_handshake_timeout = config.tls_handshake_timeout_s if tls is not None else None
        self._reuse_port = config.reuse_port  # --workers: every worker serves it
        self._limits = HttpLimits.of(config)
        # The listener's own count, beside the protocol's --max-connections (tubeq.http.limits).
        self._slots = Capacity(self._limits.max_connections)
        self._runner = web.AppRunner(make_app(server), handler_cancellation=True,
                                     shutdown_timeout=SHUTDOWN_GRACE_S)
        self._listener: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        await self._runner.setup()
        manager = self._runner.server  # aiohttp's: dispatches to the app, shuts connections
        assert manager is not None
        loop = asyncio.get_running_loop()

        def connection() -> GuardedRequestHandler:
            return GuardedRequestHandler(manager, self._limits, self._slots, loop)

        # What aiohttp's TCPSite does, with this listener's protocol factory.
        self._listener = await loop.create_server(
            connection, host, port, reuse_address=True, reuse_port=self._reuse_port or None,
            ssl=self._ssl, ssl_handshake_timeout=self._tls_handshake_timeout,
            backlog=LISTEN_BACKLOG)
        self.port = int(self._listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()  # accept no more; the runner then closes the connections
        await self._runner.cleanup()
