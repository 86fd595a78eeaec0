"""Reservations made over HTTP, which have no TCP connection to belong to.

Ownership: each reserve request gets a fresh token, ``<instance>:h<random>``, and the job it
reserves belongs to that token exactly as a job reserved over the text protocol belongs to its
connection's token (the same reserve.lua, the same owner checks in delete, release, bury and
touch). The token is returned to the client as ``reservation``; it is the capability to settle
the job, unguessable (96 random bits), and it lives until the job's TTR runs out: then
expire.lua puts the job back to ready (timeouts + 1), as for a worker that went silent. Nothing
else ends an HTTP reservation: there is no connection whose close could hand it back.

The long poll is the connection's wait (tubeq.server.reserve_wait): watch the tubes under the
token, try once, register as a waiter and count in Redis as waiting (so put.lua may hand a new
job straight to it and other processes publish wake-ups), try again, then sleep until woken or
the bound, and try again. At the end the token stops waiting and its watches are dropped (tubes
nobody references are removed, as after an ignore). A request that goes away mid-poll (client
disconnect, shutdown) gives back, at once, any job granted meanwhile. The token is in no
connection set: a reap of its process (paused past the reap limit) finds it in Redis's waiting
tokens and counts it out (reap.lua), and after the process's restore the poll counts itself in
again (ServerContext.reservation_waits), as a blocked reserve does.

Timeline of the race the counted wait closes:
    t0  poll tries reserve: nothing ready            t1  a put in another process: no waiter
    t2  poll counts itself waiting                   t3  poll tries again: finds t1's job
A put after t2 either hands the job to the token (the grant channel: the registry wakes the
wait) or publishes a wake-up; a put before t2 is found by the try at t3.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import TYPE_CHECKING, Any

from tubeq.redisio.futures import discard
from tubeq.server import ops
from tubeq.server.reserve_wait import Wait
from tubeq.server.scheduler import TTR
from tubeq.server.tracing import Held
from tubeq.store.records import Reservation

if TYPE_CHECKING:
    from tubeq.server.context import ServerContext

# The longest long poll one request may ask for (s); a client polls again after it.
MAX_POLL_S = 600


class HttpReservations:
    """The long-poll reserve of the HTTP API, over one process's store and waiter registry."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def new_token(self) -> str:
        """A reservation token: the instance prefix keeps it in the form the scripts parse
        (``instance_of``), the random part makes it unguessable."""
        return f"{self.ctx.store.instance_id}:h{secrets.token_hex(12)}"

    async def reserve(self, tubes: tuple[str, ...],
                      timeout_s: float) -> tuple[str, Reservation] | None:
        """The next job of ``tubes`` (beanstalkd's order: smallest (pri, id) across them),
        waiting up to ``timeout_s``; with the token that now owns it, or None on timeout."""
        ctx, store = self.ctx, self.ctx.store
        token = self.new_token()
        wait: Wait | None = None
        attempt: asyncio.Future[Any] | None = None  # the first try, before the wait
        got: Reservation | None = None
        try:
            # Inside the try: if the request is cancelled here, the watches still go (below).
            ctx.reservation_watches[token] = tubes
            await store.change_watches(token, [("+w", t) for t in tubes])
            attempt = store.reserve(token)
            result = await asyncio.shield(attempt)
            if isinstance(result, Reservation):
                got = result
                return self._granted(token, result)
            if timeout_s <= 0:
                return None
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            wait = Wait(ctx.registry, store, token, tubes)
            ctx.reservation_waits[token] = wait
            await wait.count_in()
            while True:
                await wait.count_in_again()  # a reap counted it out (ServerContext._restore)
                result = await wait.take()
                if isinstance(result, Reservation):
                    got = result
                    return self._granted(token, result)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await wait.sleep(remaining)
            handed = await wait.claim()
            if handed:  # a put handed it a job an instant before the end: that is the answer
                got = handed[0]
                for extra in handed[1:]:
                    self._give_back(token, extra)
                return self._granted(token, handed[0])
            return None
        finally:
            if got is None:
                # Cancelled (the client went away) or timed out: whatever was granted in
                # flight (or an instant before the cancel), or handed over while counted, goes
                # back at once.
                if wait is not None:
                    attempt = wait.attempt
                if attempt is not None:
                    if attempt.done():
                        self._give_back_result(token, attempt)
                    else:
                        attempt.add_done_callback(lambda f: self._give_back_result(token, f))
            if wait is not None:
                stopped = wait.leave(consumed=got is not None)
                if stopped is not None:
                    stopped.add_done_callback(lambda f: self._give_back_result(token, f))
            store.change_watches(token, [("-w", t) for t in tubes]).add_done_callback(discard)
            ctx.reservation_watches.pop(token, None)
            ctx.reservation_waits.pop(token, None)

    def _granted(self, token: str, job: Reservation) -> tuple[str, Reservation]:
        self.ctx.scheduler.note_due(job.deadline_ms, TTR)  # its TTR expiry is this process's to run
        if self.ctx.tracer is not None:  # its spans (tubeq.server.tracing), settled by the routes
            self.ctx.tracer.reserved(self.ctx.store, Held(token, {job.id: job.deadline_ms}),
                                     (job,))
        return token, job

    def _give_back_result(self, token: str, f: asyncio.Future[Any]) -> None:
        if f.cancelled() or f.exception() is not None:
            return
        result = f.result()
        for job in result if isinstance(result, list) else [result]:
            if isinstance(job, Reservation):
                self._give_back(token, job)

    def _give_back(self, token: str, job: Reservation) -> None:
        """Release a job nobody will receive, at its own priority, ready at once."""
        ctx = self.ctx

        def release(info: asyncio.Future[Any]) -> None:
            with contextlib.suppress(Exception):
                pri = info.result().pri
                ops.release(ctx, token, job.id, pri, 0).add_done_callback(discard)

        ctx.store.job_info(job.id).add_done_callback(release)

