"""tubeq.server.fine_timer: the scheduler's wake-up, on a timerfd (Linux) or the loop's timers.

What is checked is what the scheduler relies on: one call per arming, a new arming replaces the
pending one, a cancelled one never calls, and the fallback behaves the same. How fine it is
is a benchmark's business (bench/PROFILE_NOTES.md), not a test's.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from tubeq.server import fine_timer
from tubeq.server.fine_timer import FineTimer

# Long enough that a timer replaced or cancelled would have fired by then several times over.
SETTLE_S = 0.3


@pytest.fixture(params=["timerfd", "loop"])
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "loop":
        monkeypatch.setattr(fine_timer, "_TIMERFD", None)
    return str(request.param)


async def test_it_calls_back_once_per_arming(kind: str) -> None:
    calls: list[float] = []
    fired = asyncio.Event()

    def callback() -> None:
        calls.append(asyncio.get_running_loop().time())
        fired.set()

    timer = FineTimer(callback)
    try:
        assert timer.fine == (kind == "timerfd" and sys.platform.startswith("linux"))
        for delay in (0.01, 0.0, -1.0):  # now or past: on the next turn
            fired.clear()
            timer.arm(delay)
            await asyncio.wait_for(fired.wait(), 5)
        await asyncio.sleep(SETTLE_S)
        assert len(calls) == 3
    finally:
        timer.close()


async def test_arming_again_replaces_the_pending_call(kind: str) -> None:
    calls: list[str] = []
    timer = FineTimer(lambda: calls.append("fired"))
    try:
        timer.arm(0.01)
        timer.arm(30.0)
        await asyncio.sleep(SETTLE_S)
        assert calls == []
        timer.arm(0.01)
        await asyncio.sleep(SETTLE_S)
        assert calls == ["fired"]
    finally:
        timer.close()


async def test_a_cancelled_call_never_comes(kind: str) -> None:
    calls: list[str] = []
    timer = FineTimer(lambda: calls.append("fired"))
    try:
        timer.arm(0.02)
        timer.cancel()
        timer.arm(0.0)
        timer.cancel()  # even one that may be due already
        await asyncio.sleep(SETTLE_S)
        assert calls == []
    finally:
        timer.close()


async def test_close_gives_its_descriptor_back() -> None:  # (a Linux machine: a timerfd)
    timer = FineTimer(lambda: None)
    fd = timer._fd
    assert fd is not None
    timer.arm(10.0)
    timer.close()
    with pytest.raises(OSError):
        os.fstat(fd)
