"""OneReadAtATime (tubeq.redisio.futures): one call of a read out at a time, shared by the
callers that came while it was out, every answer read after its caller asked. Pure asyncio."""

from __future__ import annotations

import asyncio

import pytest

from tubeq.redisio.futures import OneReadAtATime, SentLater


class Reads:
    """A read whose calls the test settles by hand, in order."""

    def __init__(self) -> None:
        self.calls: list[asyncio.Future[int]] = []

    def __call__(self) -> asyncio.Future[int]:
        self.calls.append(asyncio.get_running_loop().create_future())
        return self.calls[-1]


async def test_callers_while_a_read_is_out_share_the_next_one() -> None:
    reads = Reads()
    read = OneReadAtATime(reads)
    first = read()
    assert len(reads.calls) == 1
    later = [read() for _ in range(1000)]  # a deep pipeline of the same read
    assert len(reads.calls) == 1  # the next waits for the one out
    reads.calls[0].set_result(1)
    assert await first == 1
    assert len(reads.calls) == 2 and not any(f.done() for f in later)  # read after they asked
    reads.calls[1].set_result(2)
    assert set(await asyncio.gather(*later)) == {2}
    assert len(reads.calls) == 2  # nobody waiting: no third call
    third = read()
    assert len(reads.calls) == 3
    reads.calls[2].set_result(3)
    assert await third == 3


async def test_a_cancelled_caller_leaves_the_others_their_answer() -> None:
    reads = Reads()
    read = OneReadAtATime(reads)
    read()
    a, b = read(), read()
    a.cancel()
    reads.calls[0].set_result(1)
    for _ in range(3):
        await asyncio.sleep(0)
    reads.calls[1].set_result(2)
    assert await b == 2
    assert a.cancelled()


async def test_a_failed_read_fails_the_callers_waiting_for_the_next_too() -> None:
    """Redis lost or stalled under a read: the callers that came while it was out fail with it,
    at once, instead of waiting for another call (their answer must not come past the bound of
    the one that failed); the next caller starts a fresh read."""
    reads = Reads()
    read = OneReadAtATime(reads)
    first = read()
    second = read()
    reads.calls[0].set_exception(ConnectionError("lost"))
    with pytest.raises(ConnectionError):
        await first
    with pytest.raises(ConnectionError):
        await second
    assert len(reads.calls) == 1  # no second call for them
    third = read()
    assert len(reads.calls) == 2
    reads.calls[1].set_result(5)
    assert await third == 5


async def test_a_read_that_cannot_be_sent_fails_its_caller_only() -> None:
    attempts = []

    def broken() -> asyncio.Future[int]:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("no connection")
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        fut.set_result(7)
        return fut

    read = OneReadAtATime(broken)
    with pytest.raises(RuntimeError):
        await read()
    assert await read() == 7


async def test_spaced_reads_start_no_sooner_than_the_spacing_apart() -> None:
    """A caller after a quiet spell is read at once; callers that come sooner after a start
    wait for one call at the spacing's end, read after they asked; a read that comes back
    after the spacing lets the next start at once."""
    loop = asyncio.get_running_loop()
    reads = Reads()
    spacing = 0.5  # longer than a stall of a loaded machine between two lines of this test
    read = OneReadAtATime(reads, spacing)
    first = read()
    assert len(reads.calls) == 1  # at once
    began = loop.time()
    reads.calls[0].set_result(1)
    assert await first == 1
    second, third = read(), read()  # right after: they wait out the spacing, together
    await asyncio.sleep(0)
    assert len(reads.calls) == 1 and not second.done()
    while len(reads.calls) == 1:
        assert loop.time() - began < 5, "the spaced read never started"
        await asyncio.sleep(0.005)
    assert loop.time() - began >= spacing
    reads.calls[1].set_result(2)
    assert await asyncio.gather(second, third) == [2, 2]
    await asyncio.sleep(spacing)  # a quiet spell as long as the spacing
    fourth = read()
    assert len(reads.calls) == 3  # at once again
    reads.calls[2].set_result(4)
    assert await fourth == 4


async def test_a_spaced_read_whose_call_fails_fails_its_callers_only() -> None:
    """A failure of the spaced call fails the callers that waited for it; the next caller,
    a spacing later, gets a fresh read."""
    reads = Reads()
    read = OneReadAtATime(reads, 0.01)
    first = read()
    reads.calls[0].set_result(1)
    await first
    waiting = read()
    while len(reads.calls) == 1:
        await asyncio.sleep(0.002)
    reads.calls[1].set_exception(ConnectionError("lost"))
    with pytest.raises(ConnectionError):
        await waiting
    await asyncio.sleep(0.02)
    again = read()
    assert len(reads.calls) == 3
    reads.calls[2].set_result(3)
    assert await again == 3


async def test_sent_later_answers_its_callers_once_sent_and_only_then() -> None:
    reads = Reads()
    run = SentLater(reads)
    assert reads.calls == []  # nothing sent while the run gathers callers
    run.send()
    assert len(reads.calls) == 1 and not run.answer.done()
    reads.calls[0].set_result(7)
    assert await run.answer == 7


async def test_sent_later_whose_read_cannot_be_sent_fails_its_callers() -> None:
    def broken() -> asyncio.Future[int]:
        raise ConnectionError("Redis lost")

    run = SentLater(broken)
    run.send()
    with pytest.raises(ConnectionError):
        await run.answer
