"""Polling before sleeping: once a client connection, Redis or the pub/sub subscriber has sent
this process data, its event loop keeps polling for a short window (``--idle-poll-us``)
instead of sleeping in epoll at once.

Why: a request/reply crosses this process four times a call (the put, Redis's answer, the
worker's finish, Redis's answer), each after a gap of 100-200 us. A process asleep when its
message comes is woken: its CPU leaves its halt, the sender pays for an inter-processor
interrupt, and the message waits ~35 us (the 2-vCPU VMs measured, bench/PROFILE_NOTES.md).
A loop still polling pays none of it. The same holds for Redis's answers to any command and
a consumer's next command after its reply.

Rules:
* A window opens at each input (:meth:`IdlePoll.input`: a client's bytes, a Redis reply, a
  pub/sub message) and lasts ``window_s`` from the last one, on a clock finer than the loop's
  (uvloop's moves in milliseconds): a process polls at most that long after each input, then
  sleeps as before. Messages published for other processes (pub/sub wake-ups, ends) are input
  too: with several processes, each polls after them. Timers and other callbacks run as ever
  (the loop turns; it only does not block). The HTTP listener's sockets do not open a window.
* Every poll calls sched_yield first, so a process queued on the same CPU gets it sooner (the
  scheduler decides: it is a hint, not a promise), and the polling is CPU time like any other.
* Off with a window of 0 (``--idle-poll-us 0``), and for embedded servers (Config's default:
  the tests' servers share the test's loop). The command line's default is off too where the
  cgroup's quota or the CPU affinity gives the processes (``--workers``) less than a core each
  (:func:`default_window_us`): a quota spent on polling is one the kernel then throttles the
  process for, ~100 ms at a time, and one CPU shared by two pollers is theirs alone.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

# The window's clock: uvloop's loop.time() moves in whole milliseconds (libuv's uv_now), five
# times the window; time.monotonic() reads the same clock to the nanosecond.
_clock = time.monotonic
# Where the platform has no sched_yield, a poll just turns the loop.
_sched_yield = getattr(os, "sched_yield", lambda: None)

# The command line's window: long enough for Redis's answer and a request/reply's next message
# on loopback (a worker's finish, a caller's next put: 100-150 us after tubeq's write), short
# enough to sleep through most of a consumer's gaps between batches (measured, 5 reps: one
# caller 1,667 / 1,967 / 1,982 calls/s at 100 / 150 / 200 us, processing's tubeq CPU per job
# 16 / 17 / 16 us, as without polling; 24-42 us at 250-1,000: bench/PROFILE_NOTES.md).
DEFAULT_IDLE_POLL_US = 200
# The longest window the command line takes: beyond a few milliseconds polling buys nothing
# (a message that late finds any process awake long before its wake-up would matter).
MAX_IDLE_POLL_US = 100_000


class IdlePoll:
    """Keeps one event loop polling for ``window_s`` seconds after the last :meth:`input`."""

    __slots__ = ("_fresh", "_loop", "_until", "_window", "polling")

    def __init__(self, loop: asyncio.AbstractEventLoop, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("the window must be positive")
        self._loop = loop
        self._window = window_s
        self._until = 0.0
        self._fresh = False  # an input came since the last poll: the window starts again
        self.polling = False  # a poll is scheduled: the loop does not block

    def input(self) -> None:
        """A socket had data: poll for the window from now on (on the hot path: a flag, and
        a callback when the loop was not polling)."""
        self._fresh = True
        if not self.polling:
            self.polling = True
            self._loop.call_soon(self._poll)

    def _poll(self) -> None:
        now = _clock()
        if self._fresh:
            self._fresh = False
            self._until = now + self._window
        if now < self._until:
            _sched_yield()
            self._loop.call_soon(self._poll)  # a ready callback: the next turn polls, not blocks
        else:
            self.polling = False


def default_window_us(processes: int = 1, *, cgroup_root: Path = Path("/sys/fs/cgroup"),
                      proc_cgroup: Path = Path("/proc/self/cgroup"),
                      cpus: int | None = None) -> int:
    """The command line's window: DEFAULT_IDLE_POLL_US, or 0 where ``processes`` tubeq
    processes (``--workers``) would get less than a core each: from the cgroup's quota
    (:func:`cpu_limit`) or the CPUs this process may run on (``cpus``; default: its
    affinity)."""
    if cpus is None:
        cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1)
    cores = float(cpus)
    limit = cpu_limit(cgroup_root, proc_cgroup)
    if limit is not None:
        cores = min(cores, limit)
    return 0 if cores < processes else DEFAULT_IDLE_POLL_US


def cpu_limit(cgroup_root: Path = Path("/sys/fs/cgroup"),
              proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU this process's cgroup and its ancestors allow it, in cores (the least of their
    quotas); None where none sets one or none can be read. cgroup v2 (``cpu.max``: "<quota>
    <period>" or "max <period>") and v1's cpu controller (``cpu.cfs_quota_us``, -1: none, over
    ``cpu.cfs_period_us``)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            base, read = cgroup_root, _v2_quota
            if not (base / "cgroup.controllers").exists():
                base = cgroup_root / "unified"  # (hybrid: v2 mounted beside v1)
        elif "cpu" in controllers.split(","):
            base, read = cgroup_root / controllers, _v1_quota
            if not base.is_dir():
                base = cgroup_root / "cpu"
        else:
            continue
        directory = base / path.lstrip("/")
        while True:
            quota = read(directory)
            if quota is not None:
                limits.append(quota)
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
    return min(limits) if limits else None


def _v2_quota(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota < 0 or period <= 0 else quota / period
