"""Future plumbing for the hot path: chain a result into a reply without creating a task.

A store call returns a future; a handler maps it to its reply bytes with :func:`then`. This
costs one callback per command, where a coroutine per command would cost a task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

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
