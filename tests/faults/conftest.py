"""The fault tests' accounting lines, printed once more at the end of the run."""

from __future__ import annotations

import pytest

from tests.faults.load import REPORTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORTS:
        terminalreporter.section("fault tests: every job accounted for")
        for line in REPORTS:
            terminalreporter.write_line(line)
