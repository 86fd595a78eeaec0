"""Timers that cost less than a loop timer each, for thousands of waits at once.

Owns :class:`Signal` (a flag one coroutine waits on, with a bound), :class:`CoarseTimer` (timeouts
that need no precision, bucketed on one loop timer) and :class:`Deadlines` (calls due at an
instant, checked by one loop timer while any is pending). The waiter registry
(tubeq.server.waiters) holds one CoarseTimer and one Deadlines for the process, and each waiter a
Signal. Precise instants (a delayed job's due time) are tubeq.server.fine_timer's.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any


class Signal:
    """A flag one coroutine waits on, with a bound.

    What asyncio.Event plus asyncio.wait_for do for one waiter, at a fraction of their memory:
    an Event keeps a deque of waiters (~600 B) and wait_for wraps each wait in a task; this
    keeps one future and one timer while a wait is under way, and ``wait`` is no coroutine (no
    frame of its own). Thousands of connections blocked in reserve each hold one (protocol.md
    "Limits": memory per idle connection).
    """

    __slots__ = ("_bucket", "_flag", "_future", "_timer")

    def __init__(self) -> None:
        self._flag = False
        self._future: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._bucket: tuple[CoarseTimer, int] | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        future = self._future
        self._end_wait()
        if future is not None and not future.done():
            future.set_result(None)

    def _end_wait(self) -> None:
        future, timer, bucket = self._future, self._timer, self._bucket
        self._future = self._timer = self._bucket = None
        if timer is not None:
            timer.cancel()
        if bucket is not None and future is not None:
            bucket[0].remove(bucket[1], future)

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None, coarse: CoarseTimer | None = None, *,
             loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Future[None]:
        """A future done once the flag is set or ``timeout`` seconds have passed (then the
        flag tells which); one wait at a time. With ``coarse`` the timeout is that timer's
        (up to its resolution late, and no loop timer of its own). ``loop``: the running one,
        where the caller has it."""
        loop = loop or asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if self._flag:
            future.set_result(None)
            return future
        self._end_wait()
        self._future = future
        if timeout is None:
            pass
        elif coarse is not None:
            self._bucket = (coarse, coarse.add(future, timeout, loop))
        else:
            self._timer = loop.call_later(timeout, self._expire, future)
        return future

    def _expire(self, future: asyncio.Future[None]) -> None:
        if self._future is future:
            self._end_wait()
        if not future.done():
            future.set_result(None)


class CoarseTimer:
    """Timeouts that need no precision, all on one loop timer.

    A blocked reserve re-checks Redis every RECHECK_S (tubeq.server.reserve_wait) even without a
    hint; with thousands of idle connections a loop timer each is thousands of uvloop timer
    handles (~540 B each). Here a deadline joins the bucket of the whole ``resolution_s`` step
    after it and fires with it, up to one step late; one loop timer is armed, for the earliest
    bucket. An entry costs a dict slot and is removed when its wait ends early.
    """

    __slots__ = ("_buckets", "_handle", "_next", "resolution_s")

    def __init__(self, resolution_s: float = 1.0) -> None:
        self.resolution_s = resolution_s
        self._buckets: dict[int, dict[asyncio.Future[None], None]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._next: int | None = None

    def add(self, future: asyncio.Future[None], timeout: float,
            loop: asyncio.AbstractEventLoop | None = None) -> int:
        """Resolve ``future`` about ``timeout`` seconds from now; returns its bucket.
        ``loop``: the running one, where the caller has it."""
        loop = loop or asyncio.get_running_loop()
        key = math.ceil((loop.time() + timeout) / self.resolution_s)
        self._buckets.setdefault(key, {})[future] = None
        if self._next is None or key < self._next:
            self._arm(loop, key)
        return key

    def remove(self, key: int, future: asyncio.Future[None]) -> None:
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.pop(future, None)
            if not bucket:
                del self._buckets[key]  # its loop timer may still fire: it finds nothing

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets.values())

    def _arm(self, loop: asyncio.AbstractEventLoop, key: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._next = key
        self._handle = loop.call_at(key * self.resolution_s, self._fire)

    def _fire(self) -> None:
        loop = asyncio.get_running_loop()
        self._handle = self._next = None
        # A timer may run a hair early: count a bucket due within a millisecond as due.
        due = (loop.time() + 0.001) / self.resolution_s
        for key in sorted(k for k in self._buckets if k <= due):
            for future in self._buckets.pop(key):
                if not future.done():
                    future.set_result(None)
        if self._buckets:
            self._arm(loop, min(self._buckets))


class Deadlines:
    """Calls due at an instant (loop time), all checked by one loop timer every
    ``resolution_s`` that runs only while some are pending.

    What bounds a reserve-with-timeout over a stalled Redis: each reserve adds its bound and
    takes it away when Redis answers (microseconds later, normally). A dict entry costs a
    fraction of what a loop timer of its own would (2.2 us per reserve to arm and cancel, on
    the AMD EPYC machine), and the bound is met up to ``resolution_s`` late.
    """

    __slots__ = ("_due", "_handle", "resolution_s")

    def __init__(self, resolution_s: float = 0.05) -> None:
        self.resolution_s = resolution_s
        self._due: dict[object, tuple[float, Callable[[Any], None]]] = {}
        self._handle: asyncio.TimerHandle | None = None

    def add(self, key: object, due: float, callback: Callable[[Any], None]) -> None:
        """Call ``callback(key)`` once the loop's time passes ``due``, unless discarded."""
        self._due[key] = (due, callback)
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.resolution_s, self._fire)

    def discard(self, key: object) -> None:
        self._due.pop(key, None)

    def _fire(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for key in [key for key, (due, _) in self._due.items() if due <= now]:
            entry = self._due.pop(key, None)  # an earlier callback may have discarded it
            if entry is not None:
                entry[1](key)
        self._handle = loop.call_later(self.resolution_s, self._fire) if self._due else None
