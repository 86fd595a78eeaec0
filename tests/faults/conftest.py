"""The fault tests' shared fixture (a private Redis) and their accounting lines, printed once
more at the end of the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.load import REPORTS
from tubeq.redisio.process import RedisProcess


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A private redis-server without persistence, stopped by PID after the test."""
    process = RedisProcess(tmp_path / "redis")
    process.start()
    yield process
    process.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORTS:
        terminalreporter.section("fault tests: every job accounted for")
        for line in REPORTS:
            terminalreporter.write_line(line)
