"""Future plumbing for the hot path: chain a result into a reply without creating a task; and
the sharing of one read among many callers.

A store call returns a future; a handler maps it to its reply bytes with :func:`then`. This
costs one callback per command, where a coroutine per command would cost a task. A read many
callers ask for (a whole-namespace read: stats' counts, the scrapes' overview) goes through
:class:`OneReadAtATime` (one call out at a time, the callers meanwhile sharing the next, the
calls' starts spaced) or :class:`SentLater` (one call for a run of callers, sent when the run
ends).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def then(source: asyncio.Future[Any], fn: Callable[[Any], T]) -> asyncio.Future[T]:
    """A future of ``fn(result)``; exceptions and cancellation pass through."""
    out: asyncio.Future[T] = source.get_loop().create_future()

    def done(f: asyncio.Future[Any]) -> None:
        if out.cancelled():
            discard(f)
        elif f.cancelled():
            out.cancel()
        elif (exc := f.exception()) is not None:
            out.set_exception(exc)
        else:
            try:
                out.set_result(fn(f.result()))
            except Exception as error:  # a reply of an unexpected shape
                out.set_exception(error)

    source.add_done_callback(done)
    return out


def chain(source: asyncio.Future[T], target: asyncio.Future[T]) -> None:
    """Settle ``target`` as ``source`` settled (a done-callback of ``source``, with ``target``
    bound); a ``target`` already settled stays as it is."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def discard(f: asyncio.Future[Any]) -> None:
    """Done-callback of a fire-and-forget call: retrieve its exception so asyncio does not log
    it as never retrieved (the caller chose not to care)."""
    if not f.cancelled():
        f.exception()


class OneReadAtATime(Generic[T]):
    """Many callers of one read, one call of it out at a time: a caller that comes while a call
    is out is answered by the next call, which starts when that one ends, so every answer was
    read after its caller asked (a client that pipelines the read a thousand times costs two
    calls, not a thousand). Each caller gets a future of its own: cancelling it leaves the
    others' answer alone. A call that fails (Redis lost or stalled) fails the callers waiting
    for the next one too, at once: they were in flight when it failed, and waiting for another
    call would let their answer come past --redis-timeout (tubeq.redisio.client).

    ``spacing_s`` > 0 also spaces the calls' starts by at least that long: a caller that comes
    sooner after the last start waits for the next call at the spacing's end, with everyone
    else who comes meanwhile. A lone caller after a quiet spell is read at once; a client that
    asks without pause gets its answers at the spacing's pace, so however fast it asks, the
    read costs this process and Redis at most 1 / spacing_s calls a second."""

    def __init__(self, read: Callable[[], asyncio.Future[T]], spacing_s: float = 0.0) -> None:
        self._read = read
        self._spacing_s = spacing_s
        self._out: asyncio.Future[T] | None = None  # the call out now
        self._next: asyncio.Future[T] | None = None  # settled by the call after it
        self._started_at = float("-inf")  # loop time of the last call's start

    def __call__(self) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        answer = self._next
        if answer is None:
            answer = self._next = loop.create_future()
            if self._out is None:
                self._start_when_due(loop)
        mine: asyncio.Future[T] = loop.create_future()
        answer.add_done_callback(functools.partial(chain, target=mine))
        return mine

    @property
    def starts_later(self) -> bool:
        """Whether the last caller's answer comes from a call not started yet (one was out, or
        the spacing holds it back): what the caller does meanwhile may be seen by it."""
        return self._next is not None

    def _start_when_due(self, loop: asyncio.AbstractEventLoop) -> None:
        wait = self._started_at + self._spacing_s - loop.time()
        if wait <= 0:
            self._start()
        else:
            loop.call_later(wait, self._start)

    def _start(self) -> None:
        answer, self._next = self._next, None
        assert answer is not None
        self._started_at = answer.get_loop().time()
        try:
            self._out = self._read()
        except Exception as error:  # the read could not even be sent
            self._out = None
            answer.set_exception(error)
            return
        self._out.add_done_callback(functools.partial(self._ended, answer))

    def _ended(self, answer: asyncio.Future[T], out: asyncio.Future[T]) -> None:
        self._out = None
        chain(out, answer)
        waiting = self._next
        if waiting is None:
            return
        if not out.cancelled() and (error := out.exception()) is not None:
            self._next = None
            waiting.set_exception(error)
        else:
            self._start_when_due(waiting.get_loop())


class SentLater(Generic[T]):
    """A read whose callers take its answer now and whose call is sent later, by whoever
    gathers them (``send``, once): so a run of the same read, pipelined, costs one call sent
    after all of them came."""

    __slots__ = ("_read", "answer")

    def __init__(self, read: Callable[[], asyncio.Future[T]]) -> None:
        self._read = read
        self.answer: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def send(self) -> None:
        try:
            out = self._read()
        except Exception as error:  # the read could not even be sent
            self.answer.set_exception(error)
            return
        out.add_done_callback(functools.partial(chain, target=self.answer))
