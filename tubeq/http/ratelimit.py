"""Requests per second per client of the HTTP API (``--http-rate``): a token bucket each.

Owns the HTTP listener's request-rate limit. A client is its bearer token when it sends one
(with an access file every API request does), else its address. Each has a bucket of
``rate`` requests that refills continuously at ``rate`` per second; a request that finds it
empty is answered 429 with a JSON error and ``Retry-After`` (whole seconds), and is not run.
``/metrics`` and the dashboard's static files are not limited (a scraper or a page load must
not be refused for an API client's burst). Buckets of clients idle for a minute are dropped,
so the table stays as small as the set of active clients.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from tubeq.http.common import TOKEN_PARAM, error_response

# A bucket not touched for this long is forgotten (it would be full again anyway).
IDLE_S: Final = 60.0
UNLIMITED_PATHS: Final = ("/metrics", "/static/")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RateLimiter:
    """Token buckets by client; ``rate`` requests per second each (and as the burst)."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate)
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at)
        self._swept = clock()

    def take(self, client: str) -> float:
        """0 if ``client`` may go now (one token taken), else the seconds until it may."""
        now = self.clock()
        if now - self._swept > IDLE_S:
            self._buckets = {c: b for c, b in self._buckets.items() if now - b[1] <= IDLE_S}
            self._swept = now
        tokens, at = self._buckets.get(client, (self.rate, now))
        tokens = min(self.rate, tokens + (now - at) * self.rate)
        if tokens >= 1.0:
            self._buckets[client] = (tokens - 1.0, now)
            return 0.0
        self._buckets[client] = (tokens, now)
        return (1.0 - tokens) / self.rate

    def middleware(self) -> Middleware:
        @web.middleware
        async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path.startswith(UNLIMITED_PATHS):
                return await handler(request)
            wait = self.take(_client(request))
            if wait:
                response = error_response(429, f"too many requests: at most {self.rate:g} per "
                                               "second per client")
                response.headers["Retry-After"] = str(max(1, math.ceil(wait)))
                return response
            return await handler(request)

        return limit


def _client(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "t:" + token.strip()
    if request.query.get(TOKEN_PARAM):
        return "t:" + request.query[TOKEN_PARAM]
    return "a:" + (request.remote or "")
