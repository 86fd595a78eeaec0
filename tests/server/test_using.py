"""The per-process `use` ledger (tubeq.server.using): when Redis hears of a tube's use counts.

Pure logic against a recording store; the Lua side (using.lua) is in test_lua.py and the wire
behaviour in the differential suite (tests/differential).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tubeq.server.using import UseLedger


class RecordingStore:
    """Records set_using calls; each returns a future the test settles."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int]]] = []
        self.futures: list[asyncio.Future[Any]] = []

    def set_using(self, counts: list[tuple[str, int]]) -> asyncio.Future[Any]:
        self.calls.append(sorted(counts))
        f: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(f)
        return f

    def settle_all(self, error: Exception | None = None) -> None:
        for f in self.futures:
            if not f.done():
                if error is None:
                    f.set_result(1)
                else:
                    f.set_exception(error)


def ledger(store: RecordingStore, flush_after_s: float = 3600) -> UseLedger:
    return UseLedger(store, flush_after_s)  # type: ignore[arg-type]


async def test_first_user_of_a_tube_is_told_at_once_later_ones_wait() -> None:
    store = RecordingStore()
    using = ledger(store)
    assert using.acquire("a") is not None
    assert store.calls == [[("a", 1)]]
    assert using.acquire("a") is None  # the process holds "a" in Redis already
    using.release("a")
    using.release("a")
    assert len(store.calls) == 1  # both wait for the batch
    assert using.flush() is not None
    assert store.calls[-1] == [("a", 0)]
    assert using.flush() is None  # nothing changed since


async def test_a_tube_left_by_its_last_user_is_held_until_the_flush() -> None:
    store = RecordingStore()
    using = ledger(store)
    using.watch("a", 1)  # a worker of this process watches it, so it cannot vanish meanwhile
    using.acquire("a")
    using.release("a")
    assert using.acquire("a") is None  # switching back costs no call
    using.release("a")
    using.acquire("b")  # a tube new to the process is told alone: "a" stays held
    assert store.calls[-1] == [("b", 1)]
    assert using.acquire("a") is None
    using.release("a")
    using.flush()
    assert store.calls[-1] == [("a", 0)]
    assert using.acquire("a") is not None  # "a" was dropped by that flush: told again


async def test_the_batch_goes_out_after_the_flush_delay() -> None:
    store = RecordingStore()
    using = ledger(store, flush_after_s=0.01)
    using.acquire("a")
    using.acquire("a")
    store.settle_all()
    for _ in range(100):
        if len(store.calls) == 2:
            break
        await asyncio.sleep(0.01)
    assert store.calls == [[("a", 1)], [("a", 2)]]


async def test_a_failed_batch_is_sent_again_and_the_tube_told_anew() -> None:
    store = RecordingStore()
    using = ledger(store)
    first = using.acquire("a")
    assert first is not None
    store.settle_all(ConnectionError("redis went away"))
    with pytest.raises(ConnectionError):
        await first
    await asyncio.sleep(0)  # the ledger's own callback on that future runs first
    # Unknown whether Redis has it: the next user of "a" tells Redis at once, with the count.
    assert using.acquire("a") is not None
    assert store.calls[-1] == [("a", 2)]



async def test_a_tube_used_again_after_its_last_user_left_goes_through_zero_at_once() -> None:
    # beanstalkd would have destroyed it in between (issue 13's tube lifetime): Redis hears
    # 0 then 1 before the `use` answers, and removes the tube if nothing else holds it.
    store = RecordingStore()
    using = ledger(store)
    using.acquire("a")
    using.acquire("b")
    using.release("a")  # held until the flush ...
    assert len(store.calls) == 2
    assert using.acquire("a") is not None  # ... but used again: told at once, through zero
    assert store.calls[-1] == [("a", 0), ("a", 1)]
    assert using.flush() is None  # nothing else pending for "a"


async def test_a_tube_watched_here_cannot_vanish_so_using_it_again_costs_nothing() -> None:
    store = RecordingStore()
    using = ledger(store)
    using.watch("a", 1)
    using.acquire("a")
    using.release("a")
    assert using.acquire("a") is None  # the watch holds the tube: no call
    assert len(store.calls) == 1
    using.release("a")
    using.watch("a", -1)
    assert using.acquire("a") is not None  # the watch went: through zero again
    assert store.calls[-1] == [("a", 0), ("a", 1)]


async def test_default_never_vanishes_so_it_never_goes_through_zero() -> None:
    store = RecordingStore()
    using = ledger(store)
    using.acquire("default")
    using.release("default")
    assert using.acquire("default") is None
    assert len(store.calls) == 1
