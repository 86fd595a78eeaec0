"""One run of a scenario: its scale, clock, log folder, quiet gate and what it recorded.

Owns: :class:`Row` (a load and the servers it runs against), :class:`Scale` (the base of
every scenario's counts and durations: a name, "full" or "quick", and its interleaved
repetitions), :class:`Bench` (the state every scenario's run keeps: when it started, the stamp
its files are named by, its log folder under bench/out/, the runs and notes it recorded, and the
gate that waits for a quiet machine before each run), and the order of interleaved
repetitions.

Rules: a scenario subclasses :class:`Scale` with its own fields and :class:`Bench` with its own
runs; neither holds a scenario's rows. Repetitions are interleaved: each one walks every row,
alternating the order (:func:`alternate`), so a noisy minute hurts one repetition of many rows
rather than every repetition of one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from bench.harness.load_core import LoadSpec
from bench.harness.paths import OUT_DIR
from bench.harness.procstat import QuietGate

# The machine counts as quiet below this many busy cores (the performance baseline's threshold,
# ../shared/research/perf-baseline.md section 1, outside this repository).
QUIET_CORES = 0.3
# After this many runs in a row found the machine busy, stop waiting for quiet (QuietGate).
BUSY_STREAK_GIVE_UP = 5
# Hard bound on one load beyond its own planned length (setup, tails, a slow machine).
RUN_SLACK_S = 30.0
# Upper bound on jobs in a time-window run; never reached at these servers' speeds.
WINDOW_JOB_CAP = 2_000_000

T = TypeVar("T")


@dataclass(frozen=True)
class Scale:
    """A kind of run (``name``: "full" or "quick") and its interleaved repetitions; each
    scenario adds its counts and durations in a subclass."""

    name: str
    repetitions: int


@dataclass(frozen=True)
class Row:
    """One scenario row: a load, and the servers (bench.harness.servers kinds) it runs
    against."""

    scenario: str
    key: str
    spec: LoadSpec  # port 0: filled in per run
    servers: tuple[str, ...] = ("beanstalkd", "tubeq")


def alternate(items: Sequence[T], rep: int) -> list[T]:
    """``items`` in order on even repetitions, reversed on odd ones."""
    return list(items) if rep % 2 == 0 else list(reversed(items))


class Bench:
    """A scenario's run: ``log_name`` names its log folder (``<log_name>-<stamp>``);
    ``quiet_wait_s`` bounds each wait for a quiet machine, ``give_up`` ends those waits after
    that many busy runs in a row."""

    def __init__(self, scale: Scale, log: Callable[[str], None], *, log_name: str = "logs",
                 quiet_wait_s: float = 0.0, give_up: int = BUSY_STREAK_GIVE_UP) -> None:
        self.scale = scale
        self.log = log
        self.started = time.monotonic()
        self.stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        self.log_dir = OUT_DIR / f"{log_name}-{self.stamp}"
        self.runs: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.gate = QuietGate(QUIET_CORES, quiet_wait_s, give_up)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def quiet(self) -> float:
        """Wait (bounded) for the machine to be quiet; returns the load seen last, in cores."""
        return self.gate.wait()
