"""The per-tube waiter registry: reserves blocked in this process, woken by hints.

A put hands its job to the first token waiting in Redis and tells that token's process, whose
registry wakes the token's waits directly (:meth:`WaiterRegistry.handed_over`). Every other path
to ready (release, kick, promote, expire, pause end) sends a hint, a pub/sub message naming a
tube, that wakes the oldest waiter of that tube that is not already awake
(:meth:`WaiterRegistry.wake_one`); the woken waiter then runs the reserve script, which is the
truth. The process routes both messages here from its one subscriber. Timeline of the race this
closes::

    waiter: register here + count itself in Redis (count_waiting.lua) ... try reserve.lua ... sleep
    other:                    release.lua (sees the waiter count, PUBLISHes) ----^ wakes it

A job that became ready before the count is in Redis publishes nothing, but the try after
registering sees it. A waiter that was woken and leaves without trying (its client went away)
passes the wake-up on, so a hint is never lost with it. A pub/sub reconnect wakes everyone once.
"""

from __future__ import annotations

from collections.abc import Iterable

from tubeq.server.timers import CoarseTimer, Deadlines, Signal


class Waiter:
    """One blocked reserve: its token, the tubes it watches and the signal that wakes it."""

    __slots__ = ("event", "token", "tubes", "woken")

    def __init__(self, tubes: Iterable[str], token: str) -> None:
        self.tubes = tuple(tubes)
        self.token = token
        self.event = Signal()
        self.woken = False

    def wake(self) -> None:
        self.woken = True
        self.event.set()

    def rearm(self) -> None:
        """Called before each try: a hint arriving after this wakes the next sleep."""
        self.woken = False
        self.event.clear()


class WaiterRegistry:
    """tube -> waiters in arrival order (a dict used as an ordered set), and token -> its
    waiters (a connection may wait twice at once: a blocked reserve and its push loop)."""

    def __init__(self) -> None:
        self._by_tube: dict[str, dict[Waiter, None]] = {}
        # The one waiter of a token, or (rarely) a tuple of them: no container per waiter.
        self._by_token: dict[str, Waiter | tuple[Waiter, ...]] = {}
        self.rechecks = CoarseTimer()  # the waiters' periodic re-checks
        self.overdue = Deadlines()  # reserve-with-timeout's bounds over a stalled Redis

    def register(self, waiter: Waiter) -> None:
        for tube in waiter.tubes:
            self._by_tube.setdefault(tube, {})[waiter] = None
        held = self._by_token.get(waiter.token)
        self._by_token[waiter.token] = waiter if held is None else (*_each(held), waiter)

    def unregister(self, waiter: Waiter, *, consumed: bool) -> None:
        """Remove ``waiter``; if it was woken but did not use the wake-up, pass it on."""
        for tube in waiter.tubes:
            queue = self._by_tube.get(tube)
            if queue is not None:
                queue.pop(waiter, None)
                if not queue:
                    del self._by_tube[tube]
        held = self._by_token.get(waiter.token)
        if held is waiter:
            del self._by_token[waiter.token]
        elif isinstance(held, tuple):
            rest = tuple(w for w in held if w is not waiter)
            self._by_token[waiter.token] = rest[0] if len(rest) == 1 else rest
        if waiter.woken and not consumed:
            for tube in waiter.tubes:
                self.wake_one(tube)

    def count(self) -> int:
        """How many waiters are registered (each once, whatever it watches); O(waiters)."""
        return len({w for queue in self._by_tube.values() for w in queue})

    def handed_over(self, token: str) -> None:
        """put.lua handed ``token`` a job while it waited: wake its waits, whose next try (or
        claim) takes it. A token that waits no more has nothing to wake."""
        held = self._by_token.get(token)
        if held is not None:
            for waiter in _each(held):
                waiter.wake()

    def wake_one(self, tube: str) -> None:
        for waiter in self._by_tube.get(tube, ()):
            if not waiter.woken:
                waiter.wake()
                return

    def wake_all(self) -> None:
        for queue in self._by_tube.values():
            for waiter in queue:
                waiter.wake()


def _each(held: Waiter | tuple[Waiter, ...]) -> tuple[Waiter, ...]:
    return held if isinstance(held, tuple) else (held,)
