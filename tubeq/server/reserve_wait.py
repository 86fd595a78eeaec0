"""The blocking wait: one reservation token waiting for a job of its tubes.

Owns: :class:`Wait`, the steps every waiting consumer takes (a blocked reserve, the push loop, an
HTTP long poll): register in the process's waiter registry, count in Redis as waiting (so put.lua
may hand a job straight to the token and other paths to ready publish a wake-up), try the reserve
script (the count-in and the try may be one call: a staying take, :meth:`Wait.send_take`), sleep
on the signal with a bound, claim what a put handed over, count out and unregister.
The race these steps close is drawn in tubeq.server.waiters.

Rules:
* A wait is counted in Redis from the moment its count-in (or a staying take) is sent until
  a grant (the script counts the token out with it), a claim, a staying take that found
  jobs, or its count-out at :meth:`Wait.leave`: whatever ends the caller, ``leave`` must
  run (``finally``), so a token is never left counted.
* Every try re-arms first, so a hint that arrives while the script runs wakes the next sleep.
* A wait that was woken and leaves without using the wake-up passes it on (the registry does);
  so does one whose try, for a hint, took only other tubes' jobs (Waiter.settle).
* Redis that lost the token's registration (:meth:`Wait.registration_lost`) makes the wait count
  itself in again before its next try, as a put may have found no waiter meanwhile.
* The caller keeps what is its own: what a grant is answered with, when the wait ends, and
  what happens to jobs granted after it stopped listening. A wait with an ``owner`` (a
  connection, :class:`GrantOwner`) passes every call that may grant through the owner's
  ``track_grants`` and awaits every call through the owner's ``within`` (its bound over a
  stalled Redis); a wait without one awaits its calls shielded, and its caller gives back what
  it was granted if it leaves mid-call (:attr:`Wait.attempt`).
* No object per try beyond the store call itself: thousands of connections may be waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, Protocol, TypeVar, overload

from tubeq.server.waiters import Waiter, WaiterRegistry
from tubeq.store.base import JobStore
from tubeq.store.records import NoJob, Reservation

# A waiting token re-runs the reserve script about this often even with no wake-up hint (up to
# the registry's coarse timer resolution, 1 s, later): hints are best effort (pub/sub), the
# script is the truth.
RECHECK_S = 10.0

T = TypeVar("T")


class GrantOwner(Protocol):
    """Whom the jobs a wait is granted belong to: a connection (tubeq.server.connection; a
    blocked reserve's wait is owned by its reserve queue, tubeq.server.reserves)."""

    def track_grants(self, call: asyncio.Future[T]) -> asyncio.Future[T]:
        """``call``, its grants recorded as the owner's whatever becomes of the wait."""
        ...

    def within(self, call: asyncio.Future[T], deadline: float | None) -> Awaitable[T]:
        """``call``'s result, shielded; with a ``deadline`` (loop time), bounded by it."""
        ...


class Wait(Waiter):
    """One token's wait, registered from construction until :meth:`leave`."""

    __slots__ = ("_deadline", "_owner", "_registry", "_staying", "_store", "attempt", "counted",
                 "recount")

    def __init__(self, registry: WaiterRegistry, store: JobStore, token: str,
                 tubes: Iterable[str], *, owner: GrantOwner | None = None,
                 deadline: float | None = None) -> None:
        """``deadline`` (loop time, with an ``owner``): what the owner bounds each call by."""
        super().__init__(tubes, token)
        self._registry = registry
        self._store = store
        self._owner = owner
        self._deadline = deadline
        self.counted = False  # counted in Redis as waiting (a count-in was sent)
        self.recount = False  # Redis lost the registration: count in again before the next try
        # The store call that may grant jobs, while it is awaited: a caller that leaves mid-call
        # gives back what it grants.
        self.attempt: asyncio.Future[Any] | None = None
        self._staying = False  # a staying take was sent and not yet answered (send_take)
        registry.register(self)

    async def count_in(self) -> None:
        """Count the token in Redis as waiting: from now on a put may hand it a job."""
        self.counted = True  # from the moment the call is sent: `leave` must count it out
        await self._awaited(self._store.set_waiting(self.token, 1))

    async def count_in_again(self) -> None:
        """After a registration loss: count in again (a no-op if Redis still has it)."""
        if self.recount:
            self.recount = False
            if self.counted:
                await self._awaited(self._store.set_waiting(self.token, 1))

    @overload
    async def take(self, count: None = None) -> Reservation | NoJob: ...

    @overload
    async def take(self, count: int) -> list[Reservation]: ...

    async def take(self, count: int | None = None) -> Reservation | NoJob | list[Reservation]:
        """Try the reserve script once (``count``: up to that many jobs, as a list); a grant
        counts the token out of the waiters."""
        store = self._store
        self.rearm()
        if count is None:
            return await self.took(self._tracked(
                store.reserve(self.token, counted_waiting=self.counted)))
        return await self.took(self._tracked(
            store.reserve_many(self.token, count, counted_waiting=self.counted)))

    def send_take(self, count: int, *, stay: bool = False,
                  direct: bool = True) -> asyncio.Future[list[Reservation]]:
        """The first half of ``take(count)``: the try, sent now (in the Redis write of the
        calls sent before it in this tick); :meth:`took` is the second half. ``stay``: a try
        that finds nothing also counts the token in as waiting (one that finds jobs counts
        it out): a try and a count-in in one step, which :meth:`count_in` then :meth:`take`
        would be (the wait is registered here already, so no wake-up falls between);
        ``direct``: as the store's reserve_many (a push loop's take; False: a blocked
        reserve's)."""
        self.rearm()
        call = self._store.reserve_many(self.token, count, counted_waiting=self.counted,
                                        stay=stay, direct=direct)
        if stay:
            self.counted = True  # from the moment it is sent: `leave` must count it out
            self._staying = True
        return self._tracked(call)

    @overload
    async def took(self, call: asyncio.Future[list[Reservation]]) -> list[Reservation]: ...

    @overload
    async def took(self, call: asyncio.Future[Reservation | NoJob]) -> Reservation | NoJob: ...

    async def took(self, call: asyncio.Future[Any]) -> Any:
        """A try's outcome (a grant counts the token out of the waiters)."""
        self.attempt = call
        staying, self._staying = self._staying, False
        try:
            result = await self._awaited(call)
        except BaseException:
            self.failed_try()
            raise
        self.attempt = None  # not kept alive through the next (long) wait
        if staying:
            self.counted = not result  # counted in with the try that found nothing, or out
        elif isinstance(result, Reservation) or (isinstance(result, list) and result):
            self.counted = False  # the script counted the token out with the grant
        if self.trying_for is not None:
            self.settle([result] if isinstance(result, Reservation) else
                        result if isinstance(result, list) else ())
        return result

    async def claim(self) -> list[Reservation]:
        """Count the token out and take the jobs a put handed to it meanwhile."""
        self.counted = False
        self.attempt = call = self._tracked(
            self._store.set_waiting(self.token, -1, claim=True))
        handed = await self._awaited(call)
        self.attempt = None
        return handed

    def sleep(self, *bounds: float | None,
              loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Future[None]:
        """Done once woken, or after RECHECK_S or the least of ``bounds`` (seconds; None: no
        bound), whichever is first. The periodic re-check needs no precision: it rides the
        registry's coarse timer instead of a loop timer of its own. ``loop``: the running one,
        where the caller has it (asking asyncio costs a getpid system call in Python 3.11)."""
        timeout = RECHECK_S
        for bound in bounds:
            if bound is not None and bound < timeout:
                timeout = max(0.0, bound)
        coarse = self._registry.rechecks if timeout >= RECHECK_S else None
        return self.event.wait(timeout, coarse, loop=loop)

    def registration_lost(self) -> None:
        """Redis lost the token's registration (now restored): count in again and try again."""
        self.recount = True
        self.wake()

    def leave(self, *, consumed: bool,
              claim: bool = True) -> asyncio.Future[list[Reservation]] | None:
        """Unregister (passing on a wake-up not ``consumed``) and, if still counted in Redis,
        send the count-out (``claim``: taking what a put handed over meanwhile): the caller
        decides what becomes of those jobs. None when there was nothing to count out."""
        # A hint that came after its last try was sent (every try re-arms) was not used by
        # that try, whatever it got: it is passed on (it may be for another job of the tube).
        # A wake-up by its own connection (a job in its pool, a hand-over) is not a hint.
        # Hints no try settled pass on too (Waiter.unused_hints).
        unused = self.unused_hints()
        self._registry.unregister(self, consumed=consumed and not self.hinted)
        self._registry.pass_on(unused)
        if not self.counted:
            return None
        self.counted = False
        return self._store.set_waiting(self.token, -1, claim=claim)

    def pass_on(self) -> None:
        """A hint this wait cannot use (it takes nothing now) goes to the next waiter of each
        of its tubes."""
        if self.hinted:
            self.woken = self.hinted = False
            for tube in self.tubes:
                self._registry.wake_one(tube)
        self._registry.pass_on(self.unused_hints())

    def _tracked(self, call: asyncio.Future[T]) -> asyncio.Future[T]:
        return call if self._owner is None else self._owner.track_grants(call)

    def _awaited(self, call: asyncio.Future[T]) -> Awaitable[T]:
        owner = self._owner
        return asyncio.shield(call) if owner is None else owner.within(call, self._deadline)
