"""The reserve queue's rules against a fake connection (no Redis, no socket): what may pass an
unanswered reserve, which reserve a passing command names to Redis, the order reserves answer
in, and a deferred command sent again after them. The wire behaviour is tested in
tests/server/test_connection.py and the differential suite; this pins the rules where
tubeq.server.reserves keeps them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from tubeq.protocol import commands as c
from tubeq.server.reserves import (
    RESERVE_GRACE_S,
    SAFETY_MARGIN_MS,
    PendingReserve,
    ReserveOwner,
    ReserveQueue,
)
from tubeq.server.waiters import WaiterRegistry
from tubeq.store.records import Deferred, NoJob, Reservation

NOW_MS = 1_700_000_000_000
TTR_S = 60


class FakeStore:
    """The store calls a reserve queue makes, each answered by hand through its future."""

    defers_behind_reserves = True

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def clock(self) -> int:
        return NOW_MS

    def reserve(self, token: str, *, number: int = 0,
                counted_waiting: bool = False) -> asyncio.Future[Any]:
        call = asyncio.get_running_loop().create_future()
        self.calls.append(("reserve", number, call))
        return call

    def reserve_many(self, token: str, count: int, *, number: int = 0, each: bool = False,
                     counted_waiting: bool = False, stay: bool = False,
                     direct: bool = True) -> asyncio.Future[Any]:
        call = asyncio.get_running_loop().create_future()
        if stay:  # a staying take: recorded with what it counts in as
            self.calls.append(("staying take", count, direct, call))
        else:
            self.calls.append(("reserve_many", count, number, each, call))
        return call

    def set_waiting(self, token: str, delta: int, *, claim: bool = False) -> asyncio.Future[Any]:
        call = asyncio.get_running_loop().create_future()
        self.calls.append(("set_waiting", delta, claim, call))
        return call


class FakeConnection:
    """What a reserve queue uses of its connection (ReserveOwner), recording what it is told."""

    def __init__(self) -> None:
        self.store = FakeStore()
        self.token = "token"
        self.reserved: dict[int, int] = {}
        self.extended = False
        self.worker = False
        self.replaying = False
        self.handlers: dict[type[c.Command], Any] = {}
        self.watched = ("default",)
        self.ctx = SimpleNamespace(observer=None, registry=WaiterRegistry(),
                                   scheduler=SimpleNamespace(note_due=lambda due: None))
        self.written: list[bytes] = []

    def mark_worker(self) -> None:
        self.worker = True

    def reply_done(self, reply: asyncio.Future[bytes]) -> None:
        self.written.append(reply.result())

    def schedule_pump(self) -> None:
        pass


def queue_with(timeouts: list[int | None],
               held: dict[int, int] | None = None) -> tuple[ReserveQueue, FakeConnection]:
    """A queue whose connection holds ``held`` (job id -> TTR deadline, ms) and has unanswered
    reserves with ``timeouts`` (None: no timeout), numbered from 1."""
    conn = FakeConnection()
    conn.reserved = dict(held or {})
    queue = ReserveQueue(cast(ReserveOwner, conn))
    for number, timeout in enumerate(timeouts, 1):
        queue.pending.append(PendingReserve(timeout, cast("asyncio.Future[bytes]", None), number))
    return queue, conn


def job(job_id: int, body: bytes) -> Reservation:
    return Reservation(job_id, TTR_S, body, NOW_MS + TTR_S * 1000)


def test_only_reserves_and_commands_on_held_jobs_may_pass_a_reserve() -> None:
    far = NOW_MS + 3_600_000
    queue, conn = queue_with([None], {1: far, 2: far})
    assert queue.may_pass(c.Reserve())
    assert queue.may_pass(c.ReserveMany(count=5, seconds=0))
    assert queue.may_pass(c.Delete(id=1))
    assert queue.may_pass(c.Touch(id=2))
    assert queue.may_pass(c.Bury(id=1, pri=0))
    assert queue.may_pass(c.DeleteMany(ids=(1, 2)))
    assert not queue.may_pass(c.Delete(id=3))  # not this connection's job
    assert not queue.may_pass(c.DeleteMany(ids=(1, 3)))
    assert not queue.may_pass(c.Release(id=1, pri=0, delay=0))
    assert not queue.may_pass(c.Kick(bound=1))
    # Once a reserve is known to wait, only reserves pass it.
    queue.blocking = cast("asyncio.Task[bytes]", object())
    assert not queue.may_pass(c.Delete(id=1))
    assert queue.may_pass(c.Reserve())
    # A store that cannot defer (a split namespace): the same.
    queue.blocking = None
    conn.store.defers_behind_reserves = False
    assert not queue.may_pass(c.Delete(id=1))
    assert queue.may_pass(c.Reserve())


def test_a_command_names_the_first_reserve_it_passes_unless_it_cannot_change_them() -> None:
    # Reserves with 1 s and 2 s timeouts ahead: both have ended by this horizon, grace included.
    horizon = NOW_MS + 3_000 + 2 * int(RESERVE_GRACE_S * 1000)
    after = horizon + SAFETY_MARGIN_MS + 1  # its TTR's margin starts after the horizon
    at = horizon + SAFETY_MARGIN_MS  # ... exactly at it
    queue, _ = queue_with([1, 2], {1: after, 2: at})
    assert queue.passing(c.Reserve()) == 0
    assert queue.passing(c.Delete(id=1)) == 0
    assert queue.passing(c.Touch(id=1)) == 0
    assert queue.passing(c.DeleteMany(ids=(1,))) == 0
    assert queue.passing(c.Delete(id=2)) == 1
    assert queue.passing(c.DeleteMany(ids=(1, 2))) == 1
    assert queue.passing(c.Bury(id=1, pri=0)) == 1  # another connection's kick could hand it over
    untimed, _ = queue_with([1, None], {1: after})
    assert untimed.passing(c.Delete(id=1)) == 1  # a reserve without a timeout may wait past any TTR


async def test_a_turns_reserves_go_as_one_try_and_answer_in_order() -> None:
    queue, conn = queue_with([])
    first = queue.start(None, None, True)
    second = queue.start(None, None, True)
    assert conn.store.calls == []  # they go when the turn ends
    queue.send_untried()
    [(kind, count, number, each, call)] = conn.store.calls
    assert (kind, count, number, each) == ("reserve_many", 2, 1, True)
    call.set_result([job(7, b"a"), job(8, b"b")])
    await asyncio.sleep(0)  # the store call's done-callbacks run
    assert conn.written == [b"RESERVED 7 1\r\na\r\n", b"RESERVED 8 1\r\nb\r\n"]
    assert first.done() and second.done() and not queue.pending
    assert conn.reserved == {7: NOW_MS + TTR_S * 1000, 8: NOW_MS + TTR_S * 1000}
    assert conn.worker


async def test_a_deferred_command_is_sent_again_once_the_reserves_before_it_answered() -> None:
    queue, conn = queue_with([])
    replayed: list[bool] = []

    def delete(session: Any, command: c.Delete) -> bytes:
        replayed.append(session.replaying)
        return b"DELETED\r\n"

    conn.handlers[c.Delete] = delete
    reserve = queue.start(None, None, False)  # not in a turn: its try goes at once
    [(_, number, call)] = conn.store.calls
    assert number == 1
    outcome: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    reply = queue.sent_past(c.Delete(id=5), outcome)
    outcome.set_exception(Deferred())
    await asyncio.sleep(0)
    assert not reply.done() and replayed == []  # the reserve before it has not answered
    call.set_result(job(9, b"x"))
    await asyncio.sleep(0)
    assert reserve.done() and conn.written == [b"RESERVED 9 1\r\nx\r\n"]
    assert await reply == b"DELETED\r\n"
    assert replayed == [True] and not conn.replaying


async def test_a_reserve_that_finds_nothing_counts_in_with_its_next_try_then_sleeps() -> None:
    """A reserve whose first try found nothing registers its wait here, then sends one try
    that counts the connection in as waiting when it finds nothing too (a staying take, in
    the classic hand-over's mode: no push loop takes jobs for it): no count-in of its own
    before it sleeps. A put's hand-over wakes it; its next try takes the job."""
    queue, conn = queue_with([])
    reply = queue.start(None, None, False)
    [(kind, number, first)] = conn.store.calls
    assert (kind, number) == ("reserve", 1)
    first.set_result(NoJob())
    for _ in range(5):
        await asyncio.sleep(0)
    assert [call[:3] for call in conn.store.calls[1:]] == [("staying take", 1, False)]
    conn.store.calls[1][3].set_result([])  # nothing: counted in by that try
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(conn.store.calls) == 2 and not reply.done()  # asleep, nothing more sent
    assert queue.wait is not None and queue.wait.counted
    conn.ctx.registry.handed_over(conn.token)  # a put handed it a job
    for _ in range(5):
        await asyncio.sleep(0)
    [(kind, number, take)] = conn.store.calls[2:]
    assert kind == "reserve"
    take.set_result(job(9, b"x"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert conn.written == [b"RESERVED 9 1\r\nx\r\n"]
    assert not queue.pending and queue.wait is None


async def test_a_grant_whose_ttr_ran_out_on_the_way_is_followed_by_another_try() -> None:
    """A wait's try granted a job whose TTR had run out before the reply was read (expire.lua
    gave it back to ready, publishing nothing: the token was counted out): the wait counts in
    again and tries again at once instead of sleeping until a wake-up that will not come."""
    queue, conn = queue_with([])
    reply = queue.start(None, None, False)
    conn.store.calls[0][2].set_result(NoJob())
    for _ in range(5):
        await asyncio.sleep(0)
    stale = Reservation(4, TTR_S, b"late", NOW_MS)  # its deadline is now: given back
    conn.store.calls[1][3].set_result([stale])
    for _ in range(5):
        await asyncio.sleep(0)
    [(kind, delta, _, count_in)] = conn.store.calls[2:]
    assert (kind, delta) == ("set_waiting", 1)
    count_in.set_result([])
    for _ in range(5):
        await asyncio.sleep(0)
    [(kind, _, take)] = conn.store.calls[3:]
    assert kind == "reserve" and not reply.done()
    take.set_result(job(5, b"y"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert conn.written == [b"RESERVED 5 1\r\ny\r\n"]
