"""Waiting for a job to end (``wait``): the namespace's registry of waits by job id, woken by
the ended channel, and the steps every wait takes (:func:`wait_for_end`).

The race these steps close: wait.lua marks a living job in the script that reads it, and every
script that ends a marked job keeps the end and publishes the job's id in the same call
(lua/includes/ends.lua). So an end either came before the read (the read answers it) or after
the mark (a message wakes the wait, which reads again)::

    wait:  register here ... wait.lua (reads, marks) ... sleep ............ wait.lua (the end)
    other:                                      delete.lua (keeps, PUBLISHes) ---^ wakes it

A message lost (the subscriber reconnected: every wait is woken; Redis itself restarted) is
covered by a read every RECHECK_S; a read that fails is tried again every RETRY_S. A message
carries the end itself when it is small (the wait then needs no read), and a request/reply
skips the first read (its own put marked the job; an end heard before its wait registered is
kept a while, EndWaits' recent ends). Nothing
outlives its deadline by more than READ_GRACE_S: a read still out then is left to finish
unheard, and the wait answers that it timed out.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

import structlog

from tubeq.redisio.futures import discard
from tubeq.server.timers import Signal
from tubeq.store.base import JobStore
from tubeq.store.records import JobEnd, Progress

log = structlog.get_logger(__name__)

RECHECK_S = 10.0  # a wait reads again this often with no message
RETRY_S = 0.5  # after a read that failed (Redis away)
# A read is awaited at most this long past the wait's deadline (so a wait of 0 still reads
# once): a wait answers TIMED_OUT at most this late, whatever Redis does (as a reserve's
# RESERVE_GRACE_S, tubeq.server.reserves).
READ_GRACE_S = 0.25
# Ends heard lately, kept for a request/reply's wait that registers just after (once its put
# is answered): at most RECENT_ENDS of them (the oldest go first), none older than RECENT_S,
# and none across a reconnect (Redis may have lost ids since: a new job could reuse one).
RECENT_ENDS = 4096
RECENT_S = 5.0
# The longest end data a message carries (lua/includes/ends.lua END_INLINE_MAX), and the
# longest kept among the recent ends: a longer one is read by the wait that takes it.
END_INLINE_MAX = 4096

T = TypeVar("T")


class EndWait:
    """One wait for job ``job_id``: the signal that wakes it, the end a message brought, and
    whether its caller gave up (the client half-closed: it answers as timed out at once).
    ``told``: where the end goes at once when a message or a finish of this process brings it
    (put-with notify-ms's END frame, written in the same loop turn as the finish's reply
    instead of after the wait's task has woken and returned)."""

    __slots__ = ("end", "given_up", "job_id", "signal", "told")

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.signal = Signal()
        self.end: JobEnd | None = None
        self.given_up = False
        self.told: Callable[[JobEnd], None] | None = None

    def give_up(self) -> None:
        self.given_up = True
        self.signal.set()


class EndWaits:
    """job id -> the waits of this process's connections for it (one namespace), and the ends
    heard lately (RECENT_ENDS, RECENT_S): a request/reply registers its wait only once its put
    is answered, and the end's message may come first."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._by_id: dict[int, list[EndWait]] = {}
        # id -> (the end, or None when it is to be read; when heard, loop time), oldest first.
        # An OrderedDict: a plain dict used as a queue finds its oldest entry past every hole
        # its deletes left at the front (~1 us an end at RECENT_ENDS, against ~0.17).
        self._recent: OrderedDict[int, tuple[JobEnd | None, float]] = OrderedDict()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop its waits run on, asked once (Python 3.11's get_running_loop() is a getpid
        system call: per call, the request/reply path asked it ~6 times)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def add(self, wait: EndWait, *, recent: bool = False) -> None:
        """Register ``wait``; ``recent``: it takes an end heard lately (only a request/reply's
        wait may: for any other, the job may have lived on since, e.g. buried, then kicked)."""
        self._by_id.setdefault(wait.job_id, []).append(wait)
        heard = self._recent.get(wait.job_id) if recent else None
        if heard is not None and heard[1] > self.loop.time() - RECENT_S:
            wait.end = heard[0]
            wait.signal.set()

    def remove(self, wait: EndWait) -> None:
        waits = self._by_id.get(wait.job_id)
        if waits is not None:
            waits.remove(wait)
            if not waits:
                del self._by_id[wait.job_id]

    def ended(self, job_id: int, end: JobEnd | None = None) -> None:
        """A script published that ``job_id`` ended (``end``: how, when the message carried
        it; one whose data is longer than END_INLINE_MAX is not kept): its waits take it, or
        read it."""
        if end is not None and len(end.data) > END_INLINE_MAX:
            end = None
        recent = self._recent
        recent[job_id] = (end, self.loop.time())
        recent.move_to_end(job_id)  # the order stays the order heard
        if len(recent) > RECENT_ENDS:
            recent.popitem(last=False)
        for wait in self._by_id.get(job_id, ()):
            wait.end = end
            if end is not None and wait.told is not None:
                wait.told(end)
            wait.signal.set()

    def wake_all(self) -> None:
        """Messages may have been lost (a reconnect): every wait reads again, and the ends
        heard before it are forgotten (Redis may have lost ids since)."""
        self._recent.clear()
        for waits in self._by_id.values():
            for wait in waits:
                wait.signal.set()

    def __len__(self) -> int:
        return sum(len(waits) for waits in self._by_id.values())


def parse_ended(data: bytes) -> tuple[int, JobEnd | None]:
    """An ended message: ``<id>``, or ``<id>\\n<how>\\n<data>`` when the end was small enough
    to travel with it (lua/includes/ends.lua)."""
    head, _, rest = data.partition(b"\n")
    if not rest:
        return int(head), None
    how, _, end_data = rest.partition(b"\n")
    return int(head), JobEnd(how.decode(), end_data)


async def wait_for_end(store: JobStore, waits: EndWaits, wait: EndWait, timeout_ms: int,
                       keep_ms: int, *, read_first: bool = True,
                       progress_after: int | None = None) -> JobEnd | Progress | bool | None:
    """How job ``wait.job_id`` ended, once it has (at once if it had); False when there is no
    such job and no end kept; None when ``timeout_ms`` passed first (or the caller gave up).
    ``keep_ms``: how long the job's end is kept for waits that come later. ``read_first``
    False: the caller knows the job lives and was marked (a request/reply's own put), so the
    wait sleeps first and reads only when a message does not bring the end.
    ``progress_after``: a living job's Progress is the answer once its count is past it."""
    loop = waits.loop
    deadline = loop.time() + timeout_ms / 1000
    waits.add(wait, recent=not read_first)
    try:
        read = read_first
        while not wait.given_up:
            if wait.end is not None:
                return wait.end
            pause = RECHECK_S
            if read:
                wait.signal.clear()  # a message from now on wakes the sleep below
                left = deadline - loop.time()
                call = store.wait_end(wait.job_id, keep_ms, progress_after)
                try:
                    outcome = await _within(call, max(0.0, left) + READ_GRACE_S)
                except TimeoutError:
                    return None
                except Exception as error:  # Redis away or stalled: read again while time is left
                    log.warning("wait: reading the job's end failed", job=wait.job_id,
                                error=repr(error))
                    pause = RETRY_S
                else:
                    if outcome is not True:
                        return outcome
            read = True
            left = deadline - loop.time()
            if left <= 0:
                return None
            await wait.signal.wait(min(left, pause), loop=loop)
        return None
    finally:
        waits.remove(wait)


async def _within(call: asyncio.Future[T], seconds: float) -> T:
    """``call``'s result, or TimeoutError after ``seconds`` (the call is left to finish,
    unheard): what asyncio.wait_for over asyncio.shield does, without their two tasks."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def settle(_: object) -> None:
        if not ended.done():
            ended.set_result(None)

    call.add_done_callback(settle)
    timer = loop.call_later(seconds, settle, None)
    try:
        await ended
    finally:
        timer.cancel()
    if not call.done():
        call.remove_done_callback(settle)
        call.add_done_callback(discard)
        raise TimeoutError
    return call.result()
