"""Per-process stats counters (tubeq.server.stats.CommandCounters): what one flush sends."""

from __future__ import annotations

import asyncio

from tubeq.server.stats import CommandCounters


async def test_counts_leave_once_per_tick_as_stats_fields() -> None:
    sent: list[tuple[dict[str, int], dict[str, int]]] = []
    counters = CommandCounters(lambda fields, tubes: sent.append((fields, tubes)))
    counters.incr("put")
    counters.incr("put")
    counters.job_created("a")
    counters.job_created("b")
    counters.incr("delete")
    assert sent == []  # nothing before the end of the tick
    await asyncio.sleep(0)
    assert sent == [({"cmd-put": 2, "cmd-delete": 1, "total-jobs": 2}, {"a": 1, "b": 1})]
    counters.flush()
    assert len(sent) == 1  # nothing new: no empty flush


async def test_an_explicit_flush_sends_at_once_and_the_tick_adds_only_what_came_later() -> None:
    sent: list[tuple[dict[str, int], dict[str, int]]] = []
    counters = CommandCounters(lambda fields, tubes: sent.append((fields, tubes)))
    counters.job_created("a")
    counters.flush()  # stats and stats-tube do this before they read
    counters.incr("stats")
    await asyncio.sleep(0)
    assert sent == [({"total-jobs": 1}, {"a": 1}), ({"cmd-stats": 1}, {})]
