"""Per-process command counters (tubeq.server.stats.CommandCounters): when a batch of counts
leaves, what one send carries, and what happens to counts Redis refused."""

from __future__ import annotations

import asyncio

import pytest

from tubeq.server import stats
from tubeq.server.stats import CommandCounters, Refused

Sent = list[dict[str, int]]


def recording(sent: Sent) -> CommandCounters:
    def send(fields: dict[str, int], refused: Refused) -> None:
        sent.append(fields)

    return CommandCounters(send)


async def test_counts_leave_together_after_the_flush_delay_as_stats_fields(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "FLUSH_DELAY_S", 0.05)
    sent: Sent = []
    counters = recording(sent)
    counters.incr("put")
    counters.incr("put")
    await asyncio.sleep(0)
    counters.incr("delete")
    await asyncio.sleep(0)
    assert sent == []  # not at the end of the tick: a lone put's write goes without them
    await asyncio.sleep(0.1)
    assert sent == [{"cmd-put": 2, "cmd-delete": 1}]
    counters.flush()
    assert len(sent) == 1  # nothing new: no empty send


async def test_an_explicit_flush_sends_at_once_and_the_timer_adds_only_what_came_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "FLUSH_DELAY_S", 0.02)
    sent: Sent = []
    counters = recording(sent)
    counters.incr("put")
    counters.flush()  # stats and stats-tube do this before they read
    assert sent == [{"cmd-put": 1}]
    counters.incr("stats")
    await asyncio.sleep(0.06)
    assert sent == [{"cmd-put": 1}, {"cmd-stats": 1}]
    assert counters.totals == {"put": 1, "stats": 1}


async def test_refused_counts_are_sent_again_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "RETRY_S", 0.05)
    sent: Sent = []
    refuse = [True]

    def send(fields: dict[str, int], refused: Refused) -> None:
        sent.append(fields)
        if refuse.pop(0) if refuse else False:
            # Redis refused the call (OOM): every count comes back, the call is not retried
            # at once but after RETRY_S, with what was counted meanwhile.
            asyncio.get_running_loop().call_soon(refused, fields)

    counters = CommandCounters(send)
    counters.incr("put")
    counters.flush()
    await asyncio.sleep(0)
    counters.incr("put")
    assert counters.totals["put"] == 0  # the refused one is not in the totals until it is sent
    await asyncio.sleep(0.01)
    assert len(sent) == 1  # the retry waits RETRY_S, not the flush delay
    await asyncio.sleep(0.15)
    assert sent == [{"cmd-put": 1}, {"cmd-put": 2}]
    assert counters.totals["put"] == 2
