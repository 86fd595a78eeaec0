"""Held children told that their parents ended (put-with after=, protocol.md "Dependencies").

Owns: when this process drains its namespace's parents' ends into their children
(:meth:`tubeq.store.base.JobStore.tell_children`). A script that ends a parent leaves its end
for each child in the parent's shard and says so on that shard's ``parent_ends`` channel; every
process hears it and drains, and drains every PERIOD_S anyway, so an end whose message was lost
(a Redis restart, a pub/sub reconnect, the only process that heard it killed mid-way) is told
within that period. Telling twice changes nothing (the child's parent leaves its set once), so
every process may drain at once and a crash half-way through a batch loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from tubeq.store.base import JobStore

log = structlog.get_logger(__name__)

# The drain that runs without being told: the bound on how late an end is told when its
# message was lost.
PERIOD_S = 1.0
# Batches drained per wake-up at most, before this process lets others run (a wake-up with ends
# left drains again at once).
ROUNDS_PER_WAKE = 20


class ParentEnds:
    """One namespace's drain: :meth:`heard` on a ``parent_ends`` message, :meth:`run` as a
    task; ``note_due``: the scheduler's, for a child released into delayed."""

    def __init__(self, store: JobStore, note_due: Callable[[int], None]) -> None:
        self._store = store
        self._note_due = note_due
        self._told = asyncio.Event()

    def heard(self) -> None:
        self._told.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._told.wait(), PERIOD_S)
            self._told.clear()
            if await self._drain():
                self._told.set()  # ends left: go on after the loop's other work

    async def _drain(self) -> bool:
        """Drain up to ROUNDS_PER_WAKE batches; whether ends may be left."""
        for _ in range(ROUNDS_PER_WAKE):
            try:
                handled, due = await self._store.tell_children()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the next period tries again
                log.warning("telling children their parents ended failed", error=repr(exc))
                return False
            if due:
                self._note_due(due)
            if not handled:
                return False
        return True
