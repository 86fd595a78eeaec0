"""EndWaits and the ended message (tubeq.server.end_waits), pure logic: a message that carries
the end hands it to the waits; an end heard before a request/reply's wait registered is kept
for it (and only for it); the memory of such ends is bounded. No Redis."""

from __future__ import annotations

import pytest

from tubeq.server import end_waits
from tubeq.server.end_waits import EndWait, EndWaits, parse_ended
from tubeq.store.records import JobEnd


def test_an_ended_message_is_an_id_or_an_id_with_its_end() -> None:
    assert parse_ended(b"42") == (42, None)
    assert parse_ended(b"42\nfinished\nline 1\nline 2") == (
        42, JobEnd("finished", b"line 1\nline 2"))
    assert parse_ended(b"7\ndeleted\n") == (7, JobEnd("deleted", b""))


async def test_a_message_hands_its_end_to_the_waits_of_that_job_only() -> None:
    waits = EndWaits()
    mine, other = EndWait(1), EndWait(2)
    waits.add(mine)
    waits.add(other)
    waits.ended(1, JobEnd("finished", b"r"))
    assert mine.end == JobEnd("finished", b"r") and mine.signal.is_set()
    assert other.end is None and not other.signal.is_set()
    waits.ended(2)  # no end in the message: the wait is woken to read it
    assert other.end is None and other.signal.is_set()


async def test_an_end_heard_before_a_request_reply_registers_is_kept_for_it_only() -> None:
    waits = EndWaits()
    waits.ended(5, JobEnd("finished", b"early"))
    plain = EndWait(5)
    waits.add(plain)  # a plain wait reads Redis: the job may have lived on since
    assert plain.end is None and not plain.signal.is_set()
    waits.remove(plain)
    call = EndWait(5)
    waits.add(call, recent=True)
    assert call.end == JobEnd("finished", b"early") and call.signal.is_set()


async def test_the_memory_of_ends_nobody_here_waited_for_is_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(end_waits, "RECENT_ENDS", 3)
    waits = EndWaits()
    for job_id in range(1, 6):
        waits.ended(job_id)
    assert list(waits._recent) == [3, 4, 5]  # the oldest went first
    waits.ended(3)  # heard again: the newest now
    waits.ended(6)
    assert list(waits._recent) == [5, 3, 6]


async def test_a_heard_end_is_kept_briefly_and_forgotten_on_a_reconnect(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not across a reconnect: Redis may have lost ids since, and a new job reuse one (a
    failover to a replica behind, a restart without persistence). Not for long either."""
    waits = EndWaits()
    waits.ended(8, JobEnd("finished", b"old"))
    waits.wake_all()
    fresh = EndWait(8)
    waits.add(fresh, recent=True)
    assert fresh.end is None and not fresh.signal.is_set()
    waits.remove(fresh)
    monkeypatch.setattr(end_waits, "RECENT_S", 0.0)
    waits.ended(9, JobEnd("finished", b"stale"))
    late = EndWait(9)
    waits.add(late, recent=True)
    assert late.end is None


async def test_an_end_heard_while_another_wait_is_registered_is_kept_too() -> None:
    """Two calls of one dedupe key: the duplicate's wait registered first, the other's after
    the end came; both take it."""
    waits = EndWaits()
    first = EndWait(3)
    waits.add(first)
    waits.ended(3, JobEnd("finished", b"r"))
    second = EndWait(3)
    waits.add(second, recent=True)
    assert first.end == second.end == JobEnd("finished", b"r")
