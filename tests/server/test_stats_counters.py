"""Per-process command counters (tubeq.server.stats.CommandCounters): when a batch of counts
leaves, what one send carries, and what happens to counts Redis refused. Where a test needs a
count not to have left yet, it reads the armed timer's due time instead of racing it."""

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


def seconds_to_send(counters: CommandCounters) -> float:
    """How long until the armed timer sends the counts."""
    timer = counters._timer
    assert timer is not None, "no send is pending"
    return timer.when() - asyncio.get_running_loop().time()


async def test_counts_wait_for_the_flush_delay_not_the_end_of_the_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "FLUSH_DELAY_S", 30.0)
    sent: Sent = []
    counters = recording(sent)
    counters.incr("put")
    await asyncio.sleep(0)
    counters.incr("put")
    counters.incr("delete")
    await asyncio.sleep(0)
    assert sent == []  # not at the end of the tick: a lone put's write goes without them
    assert seconds_to_send(counters) > 29  # one timer, armed by the first count
    counters.flush()
    assert sent == [{"cmd-put": 2, "cmd-delete": 1}]
    assert counters._timer is None
    counters.flush()
    assert len(sent) == 1  # nothing new: no empty send


async def test_the_timer_sends_what_was_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "FLUSH_DELAY_S", 0.01)
    sent: Sent = []
    counters = recording(sent)
    counters.incr("put")
    counters.incr("stats")
    async with asyncio.timeout(10):
        while not sent:
            await asyncio.sleep(0.01)
    assert sent == [{"cmd-put": 1, "cmd-stats": 1}]
    assert counters.totals == {"put": 1, "stats": 1}


async def test_refused_counts_are_sent_again_once_after_the_retry_pause(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "RETRY_S", 30.0)
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
    counters.incr("put")  # waits with the refused count for the retry, not the flush delay
    assert counters.totals["put"] == 0  # the refused one is not in the totals until it is sent
    assert seconds_to_send(counters) > 29  # the retry's timer, not the flush delay's
    assert sent == [{"cmd-put": 1}]
    counters.flush()  # what the retry's timer calls
    assert sent == [{"cmd-put": 1}, {"cmd-put": 2}]
    assert counters.totals["put"] == 2
