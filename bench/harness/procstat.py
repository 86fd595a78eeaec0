"""CPU and memory of processes and of the whole machine, read from /proc (Linux only).

Owns: the arithmetic of "how busy was PID x during this window" and "how much of the machine did
anything else use" (``other_cores``, as the performance baseline counted it:
../shared/research/perf-baseline.md section 1). Nothing here starts, stops or signals a process;
it only reads.

Rules:
* CPU is utime + stime of ``/proc/PID/stat`` (every thread of the process), in clock ticks;
  100 % means one full core over the window.
* Machine busy time is every non-idle, non-iowait field of the ``cpu`` line of ``/proc/stat``.
  ``other_cores`` = (machine busy - the watched PIDs' CPU) / window, in cores.
* A PID that has exited reads as None rather than raising: a window that lost a process is
  reported as such, not as zero.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# Fields of the /proc/stat cpu line that are not busy time: idle and iowait.
_IDLE_FIELDS = (3, 4)


def process_cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` in clock ticks, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    fields = raw[raw.rindex(b")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of the full line


def machine_busy_ticks() -> int:
    """Busy clock ticks of all cores together since boot."""
    with open("/proc/stat", "rb") as f:
        cpu_line = f.readline().split()[1:]
    return sum(int(v) for i, v in enumerate(cpu_line) if i not in _IDLE_FIELDS)


def rss_bytes(pid: int) -> int | None:
    """VmRSS of ``pid`` in bytes, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class CpuSnapshot:
    """Clock ticks of a set of labelled PIDs and of the machine, at one instant."""

    at: float
    machine: int
    by_label: Mapping[str, int | None]

    @classmethod
    def take(cls, pids: Mapping[str, int]) -> CpuSnapshot:
        by_label = {label: process_cpu_ticks(pid) for label, pid in pids.items()}
        return cls(time.monotonic(), machine_busy_ticks(), by_label)


@dataclass(frozen=True)
class CpuWindow:
    """CPU use between two snapshots: per label in % of one core, the rest in cores."""

    seconds: float
    percent_by_label: dict[str, float | None]
    other_cores: float

    @classmethod
    def between(cls, start: CpuSnapshot, end: CpuSnapshot) -> CpuWindow:
        seconds = max(end.at - start.at, 1e-9)
        percent: dict[str, float | None] = {}
        watched_ticks = 0
        for label, before in start.by_label.items():
            after = end.by_label.get(label)
            if before is None or after is None:
                percent[label] = None
                continue
            watched_ticks += after - before
            percent[label] = 100.0 * (after - before) / CLOCK_TICKS_PER_S / seconds
        other_ticks = end.machine - start.machine - watched_ticks
        other = max(0.0, other_ticks / CLOCK_TICKS_PER_S / seconds)
        return cls(seconds, percent, other)


def machine_cores_busy(seconds: float) -> float:
    """How many cores the whole machine kept busy over the next ``seconds`` (sleeps)."""
    start, t0 = machine_busy_ticks(), time.monotonic()
    time.sleep(seconds)
    return (machine_busy_ticks() - start) / CLOCK_TICKS_PER_S / (time.monotonic() - t0)


def wait_until_quiet(threshold_cores: float, max_wait_s: float, sample_s: float = 0.25,
                     ignore_pids: Iterable[int] = ()) -> float:
    """Sample until the machine (minus ``ignore_pids``) uses < ``threshold_cores``, for at most
    ``max_wait_s``; return the last sample's load in cores."""
    pids = {str(pid): pid for pid in ignore_pids}
    deadline = time.monotonic() + max_wait_s
    while True:
        start = CpuSnapshot.take(pids)
        time.sleep(sample_s)
        load = CpuWindow.between(start, CpuSnapshot.take(pids)).other_cores
        if load < threshold_cores or time.monotonic() >= deadline:
            return load


class QuietGate:
    """Before each run, wait (bounded) for the machine to be quiet. After ``give_up`` runs in a
    row found it busy (a neighbour holding a core for minutes), stop waiting until a quiet
    sample comes back: waiting would only eat the time budget, and every run records its
    ``other_cores`` anyway."""

    def __init__(self, threshold_cores: float, patience_s: float, give_up: int) -> None:
        self.threshold_cores = threshold_cores
        self.patience_s = patience_s
        self.give_up = give_up
        self.busy_streak = 0
        self.busy_starts = 0  # runs that started on a busy machine

    def wait(self) -> float:
        """Wait as above; return the load seen last, in cores."""
        patience = 0.0 if self.busy_streak >= self.give_up else self.patience_s
        load = wait_until_quiet(self.threshold_cores, patience)
        if load >= self.threshold_cores:
            self.busy_streak += 1
            self.busy_starts += 1
        else:
            self.busy_streak = 0
        return load


def watched_pids(server_pids: Mapping[str, int], children: Sequence[BaseProcess],
                 label: str) -> dict[str, int]:
    """The PIDs a CPU window watches: the servers', each child process's (``<label><index>``)
    and this process's (``coordinator``)."""
    watched = dict(server_pids)
    for index, process in enumerate(children):
        assert process.pid is not None
        watched[f"{label}{index}"] = process.pid
    watched["coordinator"] = os.getpid()
    return watched
