"""Fixtures of the extension tests: one private tubeq (its own redis-server) per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.servers import ServerProcess, TubeqCluster


@pytest.fixture(scope="module")
def server(tubeq_cluster: TubeqCluster, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A tubeq process for this module only, so no other test's tubes or counters show."""
    process = tubeq_cluster.start(label=f"tubeq-{request.module.__name__.rsplit('.', 1)[-1]}")
    try:
        yield process
    finally:
        process.stop()
