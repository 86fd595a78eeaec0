"""The per-tube waiter registry: reserves blocked in this process, woken by hints.

A put hands its job to the first connection waiting in Redis and tells its process, which wakes
that connection directly (Connection.job_handed_over). Every other path to ready (release,
kick, promote, expire, pause end) sends a hint, a pub/sub message naming a tube, that wakes the
oldest waiter of that tube that is not already awake; the woken waiter then runs the reserve
script, which is the truth. Timeline of the race this closes::

    waiter: register here + count itself in Redis (wait.lua) ... try reserve.lua ... sleep
    other:                    release.lua (sees the waiter count, PUBLISHes) ----^ wakes it

A job that became ready before the count is in Redis publishes nothing, but the try after
registering sees it. A waiter that was woken and leaves without trying (its client went away)
passes the wake-up on, so a hint is never lost with it. A pub/sub reconnect wakes everyone once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class Waiter:
    """One blocked reserve: the tubes it watches and the event that wakes it."""

    __slots__ = ("event", "tubes", "woken")

    def __init__(self, tubes: Iterable[str]) -> None:
        self.tubes = tuple(tubes)
        self.event = asyncio.Event()
        self.woken = False

    def wake(self) -> None:
        self.woken = True
        self.event.set()

    def rearm(self) -> None:
        """Called before each try: a hint arriving after this wakes the next sleep."""
        self.woken = False
        self.event.clear()


class WaiterRegistry:
    """tube -> waiters in arrival order (a dict used as an ordered set)."""

    def __init__(self) -> None:
        self._by_tube: dict[str, dict[Waiter, None]] = {}

    def register(self, waiter: Waiter) -> None:
        for tube in waiter.tubes:
            self._by_tube.setdefault(tube, {})[waiter] = None

    def unregister(self, waiter: Waiter, *, consumed: bool) -> None:
        """Remove ``waiter``; if it was woken but did not use the wake-up, pass it on."""
        for tube in waiter.tubes:
            queue = self._by_tube.get(tube)
            if queue is not None:
                queue.pop(waiter, None)
                if not queue:
                    del self._by_tube[tube]
        if waiter.woken and not consumed:
            for tube in waiter.tubes:
                self.wake_one(tube)

    def wake_one(self, tube: str) -> None:
        for waiter in self._by_tube.get(tube, ()):
            if not waiter.woken:
                waiter.wake()
                return

    def wake_all(self) -> None:
        for queue in self._by_tube.values():
            for waiter in queue:
                waiter.wake()
