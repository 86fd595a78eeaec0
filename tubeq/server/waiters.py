"""The waiter registry: reserves blocked in this process, woken by hints.

Waiters that watch the same list of tubes share a line, and each tube lists the lines with a
waiter, as Redis keeps them (lua/includes/waiter_counts.lua): registering and unregistering a
wait costs the same whatever it watches, save for a line's first and last waiter (100
consumers watching the same 100 tubes spent ~7 % of tubeq's CPU in a per-tube registry).

A put hands its job to the first token waiting in Redis and tells that token's process, whose
registry wakes the token's waits directly (:meth:`WaiterRegistry.handed_over`). Every other path
to ready (release, kick, promote, expire, pause end) sends a hint, a pub/sub message naming a
tube and how many jobs it has ready, that wakes that many of the oldest waiters of that tube
not already awake, or woken only by a guess (below; :meth:`WaiterRegistry.wake`), passing by the
deaf (a push loop with no credit); a woken waiter then runs the reserve script, which is the
truth. The process routes
both messages here from its one subscriber. Timeline of the race this closes::

    waiter: register here + count itself in Redis (count_waiting.lua) ... try reserve.lua ... sleep
    other:                    release.lua (sees a line waiting on it, PUBLISHes) -^ wakes it

A job that became ready before the count is in Redis publishes nothing, but the try after
registering sees it. A waiter that was woken and leaves without trying (its client went away),
or whose last try went out before the hint came, passes the wake-up on, so a hint is never lost
with it. A pub/sub reconnect wakes everyone once.

A hint's tube is kept by the waiter it woke (:attr:`Waiter.owed`, then
:attr:`Waiter.trying_for`) until its try's outcome settles it: a job of that tube uses it,
nothing found means another took the job; a grant of other tubes only (a waiter of x and y woken
for y whose try took an x job), a failed try, a hand-over, a watch list without the tube, a wait
that leaves or goes deaf pass it on. A waiter the scheduler woke on a guess
(:meth:`WaiterRegistry.wake_first`) is no job's yet: until its try goes out it still takes the
hint of a tube whose oldest waiter it is, instead of the hint passing to a younger one whose try
would race it (a waiter over several shards looks before it takes, so the younger's one script
would win: first come, first served broken).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence

from tubeq.server.timers import CoarseTimer, Deadlines, Signal
from tubeq.store.records import Reservation


class Waiter:
    """One blocked reserve: its token, the tubes it watches and the signal that wakes it."""

    __slots__ = ("deaf", "event", "guessed", "hinted", "order", "owed", "token", "trying_for",
                 "tubes", "woken")

    def __init__(self, tubes: Iterable[str], token: str) -> None:
        self.tubes = tuple(tubes)  # a connection's watch list is a tuple: the same object
        self.token = token
        self.event = Signal()
        self.woken = False
        self.order = 0  # when it registered (WaiterRegistry): FIFO across lines
        # It takes nothing for now (a push loop with no credit): hints pass it by, so one
        # that would take the job hears it
        self.deaf = False
        self.hinted = False  # woken by a hint (not by its own connection) since its last try
        self.guessed = False  # woken by the scheduler's guess since its last try
        # The tube of the hint its next try is for (:meth:`take_hint`), and once that try went
        # out, the tube it is for (its outcome: :meth:`settle`). Both may be set: a try out
        # for one, and a hint since.
        self.owed: str | None = None
        self.trying_for: str | None = None

    def wake(self) -> None:
        self.woken = True
        self.event.set()

    def hint(self) -> None:
        """Woken by a hint (or a hint's leftover, :meth:`settle`): one its next try may be the
        only one to use."""
        self.hinted = True
        self.wake()

    def guess(self) -> None:
        """Woken by the scheduler's guess of who will want a job: a try that is no job's."""
        self.guessed = True
        self.wake()

    def accepts_hint(self) -> bool:
        """Whether a hint may land here: not deaf, and asleep, or woken by a guess only (its
        try, not sent yet, will see the hint's job)."""
        return not self.deaf and (not self.woken or (self.guessed and self.owed is None))

    def take_hint(self, tube: str) -> None:
        """The hint of ``tube`` lands here (:meth:`accepts_hint`): its next try is for it."""
        woken, self.owed = self.woken, tube
        if not woken:  # (else by a guess: its coming try is the hint's)
            self.hint()

    def rearm(self) -> None:
        """Called before each try: a hint arriving after this wakes the next sleep; a hint
        owed is what this try is for."""
        self.woken = False
        self.hinted = False
        self.guessed = False
        self.trying_for, self.owed = self.owed, None
        self.event.clear()

    def settle(self, granted: Sequence[Reservation]) -> None:
        """A try's outcome (``granted``: its jobs). If the try was for a hint and took jobs
        of other tubes only, the hint is as one that came while the try was out: not used, so
        passed on (:meth:`WaiterRegistry.unregister`, or the next try). A try that found
        nothing found the hint's job taken already."""
        tube, self.trying_for = self.trying_for, None
        if tube is not None and granted and all(job.tube != tube for job in granted):
            self.hint()

    def failed_try(self) -> None:
        """Its try raised: a hint it was for is as one not used (tried again, or passed on)."""
        if self.trying_for is not None:
            self.trying_for = None
            self.hint()

    def unused_hints(self, keep: Iterable[str] = ()) -> list[str]:
        """The tubes of the hints it holds unsettled (owed, and the one its try out is for),
        but those in ``keep``: dropped here, to be passed on."""
        tubes = []
        if self.owed is not None and self.owed not in keep:
            tubes.append(self.owed)
            self.owed = None
        if self.trying_for is not None and self.trying_for not in keep:
            tubes.append(self.trying_for)
            self.trying_for = None
        return tubes


class _Line:
    """The waiters of one watch list, in arrival order (a dict used as an ordered set)."""

    __slots__ = ("tubes", "waiters")

    def __init__(self, tubes: tuple[str, ...]) -> None:
        self.tubes = tubes
        self.waiters: dict[Waiter, None] = {}


class WaiterRegistry:
    """Waiters in lines by watch list (as Redis keeps them, lua/includes/waiter_counts.lua):
    watch list -> its line, and tube -> the lines with a waiter that watch it. A waiter joins
    and leaves its line in O(1) whatever it watches; only a line's first waiter and its last one
    touch its tubes. And token -> its waiters (a connection may wait twice at once: a blocked
    reserve and its push loop)."""

    def __init__(self) -> None:
        self._lines: dict[tuple[str, ...], _Line] = {}
        self._by_tube: dict[str, dict[_Line, None]] = {}
        # The one waiter of a token, or (rarely) a tuple of them: no container per waiter.
        self._by_token: dict[str, Waiter | tuple[Waiter, ...]] = {}
        self._arrivals = 0
        self.rechecks = CoarseTimer()  # the waiters' periodic re-checks
        self.overdue = Deadlines()  # reserve-with-timeout's bounds over a stalled Redis

    def register(self, waiter: Waiter) -> None:
        self._arrivals += 1
        waiter.order = self._arrivals
        line = self._lines.get(waiter.tubes)
        if line is None:
            line = self._lines[waiter.tubes] = _Line(waiter.tubes)
            for tube in line.tubes:
                self._by_tube.setdefault(tube, {})[line] = None
        line.waiters[waiter] = None
        held = self._by_token.get(waiter.token)
        self._by_token[waiter.token] = waiter if held is None else (*_each(held), waiter)

    def unregister(self, waiter: Waiter, *, consumed: bool) -> None:
        """Remove ``waiter``; if it was woken but did not use the wake-up, pass it on."""
        line = self._lines.get(waiter.tubes)
        if line is not None and waiter in line.waiters:
            del line.waiters[waiter]
        if line is not None and not line.waiters:  # its last waiter: the line leaves its tubes
            del self._lines[line.tubes]
            for tube in line.tubes:
                lines = self._by_tube.get(tube)
                if lines is not None:
                    lines.pop(line, None)
                    if not lines:
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

    def rewatch(self, waiter: Waiter, tubes: Iterable[str]) -> None:
        """``waiter`` watches ``tubes`` from now on (a push connection's watch or ignore while
        its loop waits): it moves to that list's line, keeping its place in arrival order, so
        the hints of a tube it now watches wake it."""
        self.unregister(waiter, consumed=True)
        order = waiter.order
        waiter.tubes = tuple(tubes)
        self.register(waiter)
        waiter.order = order
        self.pass_on(waiter.unused_hints(keep=waiter.tubes))  # a tube it no longer watches

    def alone_on(self, tube: str) -> tuple[Waiter, ...]:
        """The waiters that watch ``tube`` and nothing else, in arrival order."""
        line = self._lines.get((tube,))
        return tuple(line.waiters) if line is not None else ()

    def count(self) -> int:
        """How many waiters are registered (each once, whatever it watches); O(lines)."""
        return sum(len(line.waiters) for line in self._lines.values())

    def handed_over(self, token: str) -> None:
        """put.lua handed ``token`` a job while it waited: wake its waits, whose next try (or
        claim) takes it. A token that waits no more has nothing to wake."""
        held = self._by_token.get(token)
        if held is not None:
            for waiter in _each(held):
                # Its next try takes the handed job: a hint it holds is not
                # this try's (nor may a guess of it take another: it is someone's now).
                waiter.guessed = False
                waiter.wake()
                if waiter.owed is not None or waiter.trying_for is not None:  # (rare)
                    self.pass_on(waiter.unused_hints())

    def pass_on(self, tubes: Iterable[str]) -> None:
        """Hints not used (:meth:`Waiter.unused_hints`): each to the next waiter of its tube."""
        for tube in tubes:
            self.wake_one(tube)

    def wake_one(self, tube: str) -> bool:
        """Wake the waiter of ``tube`` that registered first among those that accept a hint
        (:meth:`Waiter.accepts_hint`); whether there was one."""
        first = _first(self._by_tube.get(tube, ()), Waiter.accepts_hint)
        if first is None:
            return False
        first.take_hint(tube)
        return True

    def wake(self, tube: str, ready: int) -> None:
        """A hint that ``tube`` has ``ready`` jobs ready: wake that many of its waiters, in
        arrival order, at most (those awake already are on their way to try; see
        :meth:`Waiter.accepts_hint`): one pass over its lines, whatever the count."""
        if ready <= 1:
            self.wake_one(tube)
            return
        lines = self._by_tube.get(tube)
        if not lines:
            return
        for waiter in heapq.nsmallest(ready, (w for line in lines for w in line.waiters
                                              if w.accepts_hint()),
                                      key=_arrival):
            waiter.take_hint(tube)

    def wake_first(self) -> None:
        """Wake the waiter that registered first among those not awake yet, whatever it
        watches: the scheduler's guess, as it sends a sweep that may make a job ready, of who
        will want it (its try then follows the sweep to Redis instead of its reply)."""
        first = _first(self._lines.values(), _asleep)
        if first is not None:
            first.guess()

    def wake_all(self) -> None:
        for line in self._lines.values():
            for waiter in line.waiters:
                waiter.wake()


def _arrival(waiter: Waiter) -> int:
    return waiter.order


def _asleep(waiter: Waiter) -> bool:
    return not waiter.woken and not waiter.deaf


def _first(lines: Iterable[_Line], eligible: Callable[[Waiter], bool]) -> Waiter | None:
    """Of ``lines``' ``eligible`` waiters, the one that registered first (each line is in
    arrival order: its first such waiter is its candidate)."""
    first: Waiter | None = None
    for line in lines:
        for waiter in line.waiters:
            if eligible(waiter):
                if first is None or waiter.order < first.order:
                    first = waiter
                break
    return first


def _each(held: Waiter | tuple[Waiter, ...]) -> tuple[Waiter, ...]:
    return held if isinstance(held, tuple) else (held,)
