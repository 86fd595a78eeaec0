"""An in-process tubeq for tests that drive its connections directly (the fake client of
tests/server/test_connection.py): a started Server's namespace context, stopped after."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from tubeq.server.context import ServerContext
from tubeq.server.process import Config, Server


@contextlib.asynccontextmanager
async def server_context(redis_url: str, prefix: str,
                         shards: int = 1) -> AsyncIterator[ServerContext]:
    """The context of a Server on ``redis_url`` under ``prefix``, split into ``shards``."""
    server = Server(Config(port=0, redis_url=redis_url, prefix=prefix, shards=shards))
    await server.start()
    try:
        assert server.ctx is not None
        yield server.ctx
    finally:
        await server.stop()
