"""A connection's puts or deletes of one turn, sent to Redis as one script call.

A pipelining producer sends a put per job and a pipelining consumer a delete per job. The puts
(to one tube) or the deletes a connection takes from one read, one after another and needing
to wait for nothing (tubeq.server.connection decides which), go out together when its turn
ends: one put_many or delete_many call, each command still answered on its own. Each job is
put or deleted as the single-job script would, in the same order: the call only saves the
script calls in between. Owns that run only: what a command answers is its caller's
``answer`` (tubeq.server.handlers), what a put must check first is tubeq.server.ops's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from tubeq.redisio.futures import chain
from tubeq.store.base import JobStore

T = TypeVar("T")

# A command's reply future and what makes its reply of its own share of the run's result.
_Answers = list[tuple[asyncio.Future[Any], Callable[[Any], Any]]]


class DeleteRun:
    """Deletes added one by one, sent by :meth:`send` as one delete_many call (a lone one as
    delete.lua)."""

    __slots__ = ("_answers", "_ids", "_store", "_token")

    def __init__(self, store: JobStore, token: str) -> None:
        self._store = store
        self._token = token
        self._ids: list[int] = []
        self._answers: _Answers = []

    def __len__(self) -> int:
        return len(self._ids)

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


class PutRun:
    """Puts to one tube added one by one, sent by :meth:`send` as one put_many call (a lone
    one as put.lua); a put to another tube sends the run first. The caller has made each put
    what the store takes (its checks, a TTR of at least 1)."""

    __slots__ = ("_answers", "_jobs", "_store", "_tube")

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._tube = ""
        self._jobs: list[tuple[int, int, int, bytes]] = []
        self._answers: _Answers = []

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, tube: str, pri: int, delay: int, ttr: int, body: bytes,
            answer: Callable[[int], T]) -> asyncio.Future[T]:
        """``answer`` gets the new job's id, or 0 when the tube is full (as for put)."""
        if tube != self._tube:
            self.send()
            self._tube = tube
        reply: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._jobs.append((pri, delay, ttr, body))
        self._answers.append((reply, answer))
        return reply

    def send(self) -> None:
        """Send the puts added since the last send (none: nothing)."""
        jobs, answers = self._jobs, self._answers
        if not jobs:
            return
        self._jobs, self._answers = [], []
        if len(jobs) == 1:
            reply, answer = answers[0]
            alone = self._store.put(self._tube, *jobs[0], answer)
            alone.add_done_callback(lambda f: chain(f, reply))
        else:
            call = self._store.put_many(self._tube, jobs)
            call.add_done_callback(lambda f: _answer_each(f, answers))


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
