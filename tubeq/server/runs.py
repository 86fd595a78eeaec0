"""A connection's deletes of one turn, sent to Redis as one script call.

A pipelining consumer sends a delete per job; the deletes a connection takes from one read
that need not wait for anything (tubeq.server.connection decides which) go out together when
its turn ends, as one delete_many call, each still answered on its own. Owns that run only:
what a delete answers is the caller's ``answer`` (tubeq.server.handlers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from tubeq.redisio.futures import chain
from tubeq.store.base import JobStore

T = TypeVar("T")


class DeleteRun:
    """Deletes added one by one, sent by :meth:`send` as one delete_many call (a lone one as
    delete.lua). Each runs as it would have alone, in the order added: the script only saves
    the calls between them."""

    __slots__ = ("_answers", "_ids", "_store", "_token")

    def __init__(self, store: JobStore, token: str) -> None:
        self._store = store
        self._token = token
        self._ids: list[int] = []
        self._answers: list[tuple[asyncio.Future[Any], Callable[[bool], Any]]] = []

    def add(self, job_id: int, answer: Callable[[bool], T]) -> asyncio.Future[T]:
        reply: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._ids.append(job_id)
        self._answers.append((reply, answer))
        return reply

    def send(self) -> None:
        """Send the deletes added since the last send (none: nothing)."""
        ids, answers = self._ids, self._answers
        if not ids:
            return
        self._ids, self._answers = [], []
        if len(ids) == 1:
            reply, answer = answers[0]
            alone = self._store.delete(self._token, ids[0], answer)
            alone.add_done_callback(lambda f: chain(f, reply))
        else:
            call = self._store.delete_many(self._token, ids)
            call.add_done_callback(lambda f: _answer_each(f, answers))


def _answer_each(call: asyncio.Future[list[bool]],
                 answers: list[tuple[asyncio.Future[Any], Callable[[bool], Any]]]) -> None:
    """Settle each delete of a run with its own answer of the run's one call."""
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
