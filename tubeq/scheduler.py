"""The scheduler: time-driven transitions, run when they are due, never on a fixed period.

It sleeps until the earliest of: the next delayed job or pause end (``timers``), the next TTR
deadline (``reserved``), and this process's next heartbeat. Anything in this process that
creates an earlier due instant (a delayed put, a reserve, a pause) calls :meth:`note_due`,
which cuts the sleep short. Due instants created by other tubeq processes are theirs to serve;
this process only learns them at its next wake-up, which bounds how late a job can be when the
process that scheduled it dies (the heartbeat period). The scripts are atomic, so several
processes sweeping the same due jobs never promote or expire one twice.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from tubeq.store import Store
from tubeq.waiters import WaiterRegistry

log = structlog.get_logger(__name__)

# A process heart-beats this often; one silent for REAP_AFTER_MS is taken for dead and its tube
# references and gauges are reaped. Three missed beats: long enough for a stalled loop or a GC
# pause, short enough that stats stop counting a dead process's connections within seconds.
HEARTBEAT_MS = 1000
REAP_AFTER_MS = 3 * HEARTBEAT_MS
# On a Redis error the sweep is retried after this pause instead of spinning.
ERROR_BACKOFF_S = 0.5


class Scheduler:
    def __init__(self, store: Store, registry: WaiterRegistry) -> None:
        self.store = store
        self.registry = registry
        self._target_ms: int | None = None  # when the current sleep ends; None while sweeping
        self._noted_ms: int | None = None  # earliest due noted during the current sweep
        self._nudge = asyncio.Event()

    def note_due(self, due_ms: int) -> None:
        """Something falls due at ``due_ms``: wake up in time for it.

        While a sweep is in flight the note only lowers the next sleep's target (the sweep may
        have run before the change that created it); re-sweeping at once for every note would
        spin under load, where every reserve notes its TTR deadline.
        """
        if self._target_ms is None:
            if self._noted_ms is None or due_ms < self._noted_ms:
                self._noted_ms = due_ms
        elif due_ms < self._target_ms:
            self._nudge.set()

    async def run(self) -> None:
        next_heartbeat = 0
        while True:
            try:
                now = self.store.clock()
                if now >= next_heartbeat:
                    await self.store.heartbeat()
                    await self.store.reap(now - REAP_AFTER_MS)
                    next_heartbeat = now + HEARTBEAT_MS
                self._nudge.clear()
                self._noted_ms = None
                (next_timer, promoted), (next_deadline, expired) = await asyncio.gather(
                    self.store.promote(), self.store.expire())
                # This process's waiters on those tubes need not wait for the PUBLISH to come
                # back through the subscriber (the scripts publish for other processes).
                for tube in (*promoted, *expired):
                    self.registry.wake_one(tube)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("scheduler sweep failed", error=repr(exc))
                await asyncio.sleep(ERROR_BACKOFF_S)
                continue
            dues = (next_timer, next_deadline, next_heartbeat, self._noted_ms)
            target = min(t for t in dues if t is not None and t >= 0)
            self._target_ms = target
            # Aimed at the due instant itself, not a whole-ms sleep from a floored clock (which
            # made deliveries up to 1 ms later). uvloop rounds a timer to the nearest ms, so it
            # can fire a fraction early: that sweep finds nothing due and sleeps again.
            delay = (target - self.store.exact_ms()) / 1000
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._nudge.wait(), delay)
            self._target_ms = None
