"""A connection's puts, calls, deletes or finishes of one turn, sent to Redis as one script call.

A pipelining producer sends a put per job, a client whose calls share a connection a put-with
notify-ms per call, and a pipelining consumer a delete (or, answering calls, a finish) per job.
The puts or the calls (to one tube), the deletes or the finishes a connection takes from one
read, one after another and needing to wait for nothing (tubeq.server.reserves decides which),
go out together when its turn ends: one put_many, delete_many or finish call, each command
still answered on its own. Each job is put, deleted or finished as the
single-job script would, in the same order: the call only saves the script calls in between.
Owns that run only: what a command answers is its caller's ``answer``
(tubeq.server.handlers), what a put must check first is tubeq.server.ops's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from tubeq.model.options import WAITED
from tubeq.protocol import commands as c
from tubeq.redisio.futures import chain
from tubeq.store.base import JobStore
from tubeq.store.records import PutOutcome

T = TypeVar("T")
E = TypeVar("E")  # what a run holds of each command

# A command's reply future and what makes its reply of its own share of the run's result.
_Answers = list[tuple[asyncio.Future[Any], Callable[[Any], Any]]]


class _Run(Generic[E]):
    """Entries added one by one, each with its caller's answer, sent by :meth:`send` as one
    call of the many-jobs script (a lone one by the single-job script)."""

    __slots__ = ("_answers", "_entries", "_loop", "_store")

    def __init__(self, store: JobStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._entries: list[E] = []
        self._answers: _Answers = []
        # the caller's running loop: a run is made per turn, and asking asyncio for it costs
        # a getpid system call in Python 3.11
        self._loop = loop

    def __len__(self) -> int:
        return len(self._entries)

    def _add(self, entry: E, answer: Callable[[Any], T]) -> asyncio.Future[T]:
        reply: asyncio.Future[T] = self._loop.create_future()
        self._entries.append(entry)
        self._answers.append((reply, answer))
        return reply

    def send(self) -> None:
        """Send the entries added since the last send (none: nothing)."""
        entries, answers = self._entries, self._answers
        if not entries:
            return
        self._entries, self._answers = [], []
        if len(entries) == 1:
            reply, answer = answers[0]
            self._alone(entries[0], answer).add_done_callback(lambda f: chain(f, reply))
        else:
            self._together(entries).add_done_callback(lambda f: _answer_each(f, answers))

    def _alone(self, entry: E, answer: Callable[[Any], Any]) -> asyncio.Future[Any]:
        raise NotImplementedError

    def _together(self, entries: list[E]) -> asyncio.Future[list[Any]]:
        raise NotImplementedError


class DeleteRun(_Run[int]):
    """A connection's deletes, as delete_many (a lone one as delete.lua)."""

    __slots__ = ("_token",)

    def __init__(self, store: JobStore, loop: asyncio.AbstractEventLoop, token: str) -> None:
        super().__init__(store, loop)
        self._token = token

    def add(self, job_id: int, answer: Callable[[bool], T]) -> asyncio.Future[T]:
        return self._add(job_id, answer)

    def _alone(self, entry: int, answer: Callable[[Any], Any]) -> asyncio.Future[Any]:
        return self._store.delete(self._token, entry, answer)

    def _together(self, entries: list[int]) -> asyncio.Future[list[Any]]:
        return self._store.delete_many(self._token, entries)


class FinishRun(_Run[tuple[int, bytes]]):
    """A connection's finishes, as one finish.lua call (store.finish_many; a lone one by
    store.finish); the results are kept for ``keep_ms`` (--result-ttl) unless a job says
    otherwise."""

    __slots__ = ("_keep_ms", "_token")

    def __init__(self, store: JobStore, loop: asyncio.AbstractEventLoop, token: str,
                 keep_ms: int) -> None:
        super().__init__(store, loop)
        self._token = token
        self._keep_ms = keep_ms

    def add(self, job_id: int, result: bytes) -> asyncio.Future[bool | int]:
        """What finish answers for the job, once the run's call is back."""
        return self._add((job_id, result), _same)

    def _alone(self, entry: tuple[int, bytes], answer: Callable[[Any], Any]
               ) -> asyncio.Future[Any]:
        return self._store.finish(self._token, entry[0], entry[1], self._keep_ms)

    def _together(self, entries: list[tuple[int, bytes]]) -> asyncio.Future[list[Any]]:
        return self._store.finish_many(self._token, entries, self._keep_ms)


def _same(value: T) -> T:
    return value


_Job = tuple[int, int, int, bytes]  # pri, delay, ttr, body


class PutRun(_Run[_Job]):
    """A connection's puts to one tube, as put_many (a lone one as put.lua); a put to another
    tube sends the run first. The caller has made each put what the store takes (its checks,
    a TTR of at least 1)."""

    __slots__ = ("_tube",)

    def __init__(self, store: JobStore, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(store, loop)
        self._tube = ""

    def add(self, tube: str, pri: int, delay: int, ttr: int, body: bytes,
            answer: Callable[[int], T]) -> asyncio.Future[T]:
        """``answer`` gets the new job's id, or 0 when the tube is full (as for put)."""
        if tube != self._tube:
            self.send()
            self._tube = tube
        return self._add((pri, delay, ttr, body), answer)

    def _alone(self, entry: _Job, answer: Callable[[Any], Any]) -> asyncio.Future[Any]:
        return self._store.put(self._tube, *entry, answer)

    def _together(self, entries: list[_Job]) -> asyncio.Future[list[Any]]:
        return self._store.put_many(self._tube, entries)


def _answer_each(call: asyncio.Future[list[Any]], answers: _Answers) -> None:
    """Settle each command of a run with its own answer of the run's one call."""
    if call.cancelled():
        for reply, _ in answers:
            reply.cancel()
        return
    error = call.exception()
    for i, (reply, answer) in enumerate(answers):
        if reply.done():
            continue
        if error is not None:
            reply.set_exception(error)
            continue
        try:
            reply.set_result(answer(call.result()[i]))
        except Exception as failed:  # an answer that failed answers its own command only
            reply.set_exception(failed)


# What a call's put-with may carry besides notify-ms to join a run of calls: where it goes.
_CALL_OPTIONS = frozenset({"notify-ms", "tube"})
# A run of calls' promise of push credits (tubeq.server.context.ServerContext.direct_room).
Room = list[tuple[str, int]]


def joins_calls(cmd: c.PutWith) -> bool:
    """Whether a put-with is a plain call (``client.call()``'s: notify-ms, maybe tube=, no
    delay and no other option), which may join the turn's :class:`CallRun`."""
    if cmd.delay:
        return False
    notify = False
    for name, _ in cmd.options:
        if name not in _CALL_OPTIONS:
            return False
        notify = notify or name == "notify-ms"
    return notify


class CallRun(_Run[_Job]):
    """A connection's plain calls (:func:`joins_calls`) to one tube, as one put_many of jobs
    waited for by this process (store.put_calls; a lone one as put.lua with the option
    ``waited``): a job may go straight to a push loop of this process, within the credits
    ``room(tube, jobs)`` promises it for the call (given back by ``release`` once the call is
    back).
    A call to another tube sends the run first."""

    __slots__ = ("_keep_ms", "_release", "_room", "_tube")

    def __init__(self, store: JobStore, loop: asyncio.AbstractEventLoop, keep_ms: int,
                 room: Callable[[str, int], Room], release: Callable[[Room], None]) -> None:
        super().__init__(store, loop)
        self._keep_ms = keep_ms
        self._room = room
        self._release = release
        self._tube = ""

    def add(self, tube: str, pri: int, ttr: int, body: bytes) -> asyncio.Future[PutOutcome]:
        """The put's outcome, once the run's call is back."""
        if tube != self._tube:
            self.send()
            self._tube = tube
        return self._add((pri, 0, ttr, body), _inserted)

    def _alone(self, entry: _Job, answer: Callable[[Any], Any]) -> asyncio.Future[Any]:
        pri, delay, ttr, body = entry
        return self._store.put_with(self._tube, pri, delay, ttr, body,
                                    ((WAITED, self._keep_ms),))

    def _together(self, entries: list[_Job]) -> asyncio.Future[list[Any]]:
        room = self._room(self._tube, len(entries))
        call = self._store.put_calls(self._tube, entries, self._keep_ms, room)
        if room:
            call.add_done_callback(lambda _: self._release(room))
        return call


def _inserted(job_id: int) -> PutOutcome:
    """put_many's answer for one call as put-with's (0: the tube was full)."""
    return PutOutcome(job_id, job_id > 0)
