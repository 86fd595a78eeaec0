"""A timer finer than the event loop's: the scheduler's wake-up at a due instant.

uvloop (libuv) counts timers in whole milliseconds, from a loop clock read once per loop turn:
a timer fires up to ~1 ms after its instant (p99 0.97 ms measured, bench/PROFILE_NOTES.md).
On Linux, :class:`FineTimer` arms a timerfd (nanoseconds, the kernel's high-resolution timers)
and has the loop watch its descriptor, so the loop wakes when the instant comes, whatever its
own timers' resolution. Elsewhere, or if the descriptor cannot be made, it falls back to
``loop.call_later``. One per scheduler: one descriptor per process, one syscall per arming.

Python 3.13 has ``os.timerfd_create``; on 3.11 the two libc calls go through ctypes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import sys
from collections.abc import Callable

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc_timerfd() -> tuple[Callable[[], int], Callable[[int, int], None]] | None:
    """(create, set) over libc's timerfd calls; None where there are none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        create_fn, settime_fn = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create_fn.argtypes = [ctypes.c_int, ctypes.c_int]
    settime_fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                           ctypes.c_void_p]

    def create() -> int:
        fd = int(create_fn(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC))
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        return fd

    def settime(fd: int, ns: int) -> None:
        spec = _Itimerspec()
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(ns, 1_000_000_000)
        if settime_fn(fd, 0, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    return create, settime


_TIMERFD = _libc_timerfd()


class FineTimer:
    """Calls ``callback`` once per :meth:`arm`, ``delay_s`` later, to well under a millisecond
    where the platform allows. Arming again replaces the pending call; :meth:`close` ends it."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._loop = asyncio.get_running_loop()
        self._fd: int | None = None
        self._handle: asyncio.TimerHandle | None = None  # the fallback's
        if _TIMERFD is not None:
            with contextlib.suppress(OSError):
                fd = _TIMERFD[0]()
                self._loop.add_reader(fd, self._fired)
                self._fd = fd

    @property
    def fine(self) -> bool:
        """Whether it runs on a timerfd (False: the loop's own timers)."""
        return self._fd is not None

    def arm(self, delay_s: float) -> None:
        """Call back after ``delay_s`` seconds (at once, on the next loop turn, if <= 0)."""
        if self._fd is not None and _TIMERFD is not None:
            # A zero it_value would disarm the timer: the shortest wait is 1 ns.
            _TIMERFD[1](self._fd, max(1, int(delay_s * 1e9)))
            return
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_later(max(0.0, delay_s), self._fallback_fired)

    def cancel(self) -> None:
        """Drop the pending call, if any."""
        if self._fd is not None and _TIMERFD is not None:
            _TIMERFD[1](self._fd, 0)  # disarmed; a fire not yet read is drained by _fired
            with contextlib.suppress(BlockingIOError):
                os.read(self._fd, 8)
        elif self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def close(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        elif self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fired(self) -> None:
        fd = self._fd
        if fd is None:
            return
        try:
            os.read(fd, 8)  # the expiry count: 1
        except BlockingIOError:  # cancelled after it became readable
            return
        self._callback()

    def _fallback_fired(self) -> None:
        self._handle = None
        self._callback()
