"""Per-process stats counters (tubeq.server.stats.CommandCounters): what one flush sends, and
what happens to counts Redis refused."""

from __future__ import annotations

import asyncio

import pytest

from tubeq.server import stats
from tubeq.server.stats import CommandCounters, Refused

Sent = list[tuple[dict[str, int], dict[str, int]]]


def recording(sent: Sent) -> CommandCounters:
    def send(fields: dict[str, int], tubes: dict[str, int], refused: Refused) -> None:
        sent.append((fields, tubes))

    return CommandCounters(send)


async def test_counts_leave_once_per_tick_as_stats_fields() -> None:
    sent: Sent = []
    counters = recording(sent)
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
    sent: Sent = []
    counters = recording(sent)
    counters.job_created("a")
    counters.flush()  # stats and stats-tube do this before they read
    counters.incr("stats")
    await asyncio.sleep(0)
    assert sent == [({"total-jobs": 1}, {"a": 1}), ({"cmd-stats": 1}, {})]


async def test_a_put_taken_back_before_the_send_sends_no_total() -> None:
    sent: Sent = []
    counters = recording(sent)
    counters.incr("put")
    counters.job_created("a")
    counters.job_created("a", -1)  # the tube was full
    counters.flush()
    assert sent == [({"cmd-put": 1}, {})]


async def test_refused_counts_are_sent_again_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "RETRY_S", 0.02)
    sent: Sent = []
    refuse = [True]

    def send(fields: dict[str, int], tubes: dict[str, int], refused: Refused) -> None:
        sent.append((fields, tubes))
        if refuse.pop(0) if refuse else False:
            # Redis refused the call (OOM): every count comes back, the call is not retried
            # at once but after RETRY_S, with what was counted meanwhile.
            asyncio.get_running_loop().call_soon(refused, fields, tubes)

    counters = CommandCounters(send)
    counters.incr("put")
    counters.job_created("a")
    counters.flush()
    await asyncio.sleep(0)
    counters.incr("put")
    assert counters.totals["put"] == 0  # the refused one is not in the totals until it is sent
    await asyncio.sleep(0.1)
    assert sent == [({"cmd-put": 1, "total-jobs": 1}, {"a": 1}),
                    ({"cmd-put": 2, "total-jobs": 1}, {"a": 1})]
    assert counters.totals["put"] == 2


async def test_a_split_namespace_gets_back_only_the_refused_shards_part() -> None:
    sent: Sent = []
    counters = recording(sent)
    # The home shard took the server's counts and tube a's; the shard of tube b refused its.
    counters.refused({}, {"b": 2})
    counters.flush()
    assert sent == [({}, {"b": 2})]
