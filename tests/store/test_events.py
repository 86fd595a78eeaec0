"""Lifecycle events as the Lua scripts write them, on a real Redis with a clock the test moves.

Every transition of ``tubeq.model.states.TRANSITIONS`` must append exactly one event with every
field of ``tubeq.model.events.FIELDS``, in that order, with the values the test expects; a call that
changes nothing appends nothing; events off append nothing at all; the cap trims the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.store.test_lua import ALICE, BOB, Env, bring_to, open_env, perform, put_after
from tubeq.model.events import (
    ERROR_EXCERPT_BYTES,
    FIELDS,
    LATER_FIELDS,
    TRAILING_FIELDS,
    Event,
    EventName,
    MalformedEvent,
)
from tubeq.model.states import TRANSITIONS, JobState
from tubeq.server.process import Config, Server
from tubeq.store.keys import JobField
from tubeq.store.records import Reservation
from tubeq.store.store import Store

TTR_MS = 60_000  # bring_to's jobs: ttr 60 s, pri 0, delayed by 10 s when delayed

# The event each operation of the transition table writes, and its reason.
EXPECTED: dict[str, tuple[EventName, str]] = {
    "promote": (EventName.PROMOTED, ""),
    "reserve": (EventName.RESERVED, ""),
    "reserve_job": (EventName.RESERVED, ""),
    "release": (EventName.RELEASED, ""),
    "release delay>0": (EventName.RELEASED, ""),
    "bury": (EventName.BURIED, ""),
    "touch": (EventName.TOUCHED, ""),
    "expire": (EventName.TIMED_OUT, ""),
    "disconnect": (EventName.TIMED_OUT, "disconnect"),
    "disconnect at shutdown": (EventName.TIMED_OUT, "shutdown"),
    "hand-back": (EventName.RELEASED, "hand-back"),
    "kick": (EventName.KICKED, ""),
    "kick_job": (EventName.KICKED, ""),
    "delete": (EventName.DELETED, ""),
    # dependencies (put-with after=): the held child's own event, beside its parent's
    "last parent finished": (EventName.PROMOTED, "after"),
    "last parent finished delay>0": (EventName.PROMOTED, "after"),
    "a parent failed": (EventName.BURIED, "parent-failed"),
    "cancel": (EventName.DELETED, "cancelled"),
}


@pytest.fixture
async def env(redis_url: str) -> AsyncIterator[Env]:
    async with open_env(redis_url, 1000) as opened:
        yield opened


class Recorder:
    """Reads the events appended since the last read (the first: since it was made)."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.last = "0-0"

    @classmethod
    async def start(cls, env: Env) -> Recorder:
        record = cls(env)
        await record.new()
        return record

    async def new(self) -> list[Event]:
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await self.env.raw.xrange(
            self.env.keys.events, "(" + self.last, "+")
        for _, fields in entries:  # every field, in FIELDS order
            assert [name.decode() for name in fields] == list(FIELDS)
        events = [Event.from_entry(sid, fields) for sid, fields in entries]
        if events:
            self.last = events[-1].stream_id
        return events


def fields(event: Event) -> dict[str, Any]:
    return {name: getattr(event, name) for name in FIELDS}


def expected(env: Env, name: EventName, job_id: int, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "event": name.value, "id": job_id, "tube": "default", "pri": 0, "delay_ms": 0,
        "ttr_ms": TTR_MS, "due_ms": 0, "tries": 0, "time_ms": env.clock.now_ms, "by": "inst",
        "reason": "", "size": 0, "error": "", "failures": 0}
    return base | changes


async def test_put_writes_one_event_ready_or_delayed(env: Env) -> None:
    record = await Recorder.start(env)
    ready = await env.put(pri=7, ttr=5)
    assert [fields(e) for e in await record.new()] == [
        expected(env, EventName.PUT, ready, pri=7, ttr_ms=5000)]
    delayed = await env.put("other", delay=3)
    assert [fields(e) for e in await record.new()] == [
        expected(env, EventName.PUT, delayed, tube="other", delay_ms=3000,
                 due_ms=env.clock.now_ms + 3000)]


async def test_the_largest_values_are_written_exactly(env: Env) -> None:
    top = 2**32 - 1  # beanstalkd's limits for pri, delay and ttr (s)
    record = await Recorder.start(env)
    job_id = await env.put(pri=top, delay=top, ttr=top)
    assert [fields(e) for e in await record.new()] == [
        expected(env, EventName.PUT, job_id, pri=top, delay_ms=top * 1000, ttr_ms=top * 1000,
                 due_ms=env.clock.now_ms + top * 1000)]


@pytest.mark.parametrize(("before", "op"), [k for k in TRANSITIONS if k[0] is not None])
async def test_every_transition_writes_exactly_its_event(env: Env, before: JobState,
                                                         op: str) -> None:
    if op == "last parent finished delay>0":  # a held job with a delay of its own
        job_id = await put_after(env, await env.put(), delay_ms=5000)
    else:
        job_id = await bring_to(env, before)
    record = await Recorder.start(env)  # after the events that brought the job there
    reserved_before = before in (JobState.RESERVED, JobState.BURIED)
    await perform(env, op, job_id)
    name, reason = EXPECTED[op]
    tries = int(reserved_before) + (name is EventName.RESERVED)
    changes: dict[str, Any] = {"tries": tries, "reason": reason}
    if op in ("release", "release delay>0", "bury"):
        changes["pri"] = 5  # perform's new priority
    if op == "release delay>0":
        changes |= {"delay_ms": 3000, "due_ms": env.clock.now_ms + 3000}
    if op == "promote":
        changes["due_ms"] = env.clock.now_ms - 1000  # put with delay 10, promoted 11 s later
    if op == "last parent finished delay>0":
        changes |= {"delay_ms": 5000, "due_ms": env.clock.now_ms + 5000}
    events = await record.new()
    if before is JobState.HELD:  # its parent's events (reserve, finish, delete) beside its own
        events = [e for e in events if e.id == job_id]
    assert [fields(e) for e in events] == [expected(env, name, job_id, **changes)]


async def test_a_put_after_parents_writes_put_with_reason_after(env: Env) -> None:
    parent = await env.put()
    record = await Recorder.start(env)
    child = await put_after(env, parent)
    assert [fields(e) for e in await record.new()] == [
        expected(env, EventName.PUT, child, reason="after")]


async def test_the_bound_event_arguments_survive_redis_forgetting_the_scripts(env: Env) -> None:
    await env.raw.function_flush()
    await env.raw.script_flush()
    record = await Recorder.start(env)
    job_id = await env.put()  # no function, then EVAL of the source with the same arguments
    again = await env.put()  # FCALL of the library loaded again
    assert [fields(e) for e in await record.new()] == [
        expected(env, EventName.PUT, job_id), expected(env, EventName.PUT, again)]


async def test_calls_that_change_nothing_write_nothing(env: Env) -> None:
    s = env.store
    ready = await env.put()
    held = await env.put()
    assert (await env.reserve()).id == ready
    record = await Recorder.start(env)
    await record.new()
    assert not await s.release(BOB, ready, 0, 0)  # not BOB's
    assert await s.hand_back(BOB, ready) == 0
    assert not await s.bury(BOB, ready, 0)
    assert not await s.touch(BOB, ready)
    assert not await s.delete(BOB, ready)
    assert not await s.kick_job(held)  # ready, not buried or delayed
    assert not await s.delete(BOB, 999)
    assert await s.kick("default", 10) == 0
    env.clock.advance(30)
    assert (await s.promote())[1] == [] and (await s.expire())[1] == []
    assert await s.disconnect(BOB, False, False, [ready]) == 0
    assert await record.new() == []


async def test_a_put_handed_to_a_waiter_writes_put_then_reserved(env: Env) -> None:
    s = env.store
    await s.set_waiting(BOB, 1)
    record = await Recorder.start(env)
    job_id = await env.put()
    assert [fields(e) for e in await record.new()] == [
        expected(env, EventName.PUT, job_id),
        expected(env, EventName.RESERVED, job_id, tries=1)]
    # Claiming it changes no state: no second 'reserved'.
    assert [r.id for r in await s.set_waiting(BOB, -1, claim=True)] == [job_id]
    assert await record.new() == []


async def test_reserve_many_writes_one_reserved_per_job(env: Env) -> None:
    ids = [await env.put(pri=p) for p in (3, 1, 2)]
    record = await Recorder.start(env)
    taken = await env.store.reserve_many(ALICE, 5)
    assert [r.id for r in taken] == [ids[1], ids[2], ids[0]]
    assert [(e.event, e.id, e.pri, e.tries) for e in await record.new()] == [
        ("reserved", ids[1], 1, 1), ("reserved", ids[2], 2, 1), ("reserved", ids[0], 3, 1)]


async def test_tries_count_every_reservation(env: Env) -> None:
    s = env.store
    job_id = await env.put(ttr=1)
    record = await Recorder.start(env)
    await env.reserve()
    assert await s.release(ALICE, job_id, 0, 0)
    await env.reserve()
    env.clock.advance(2)
    await s.expire()
    assert isinstance(await s.reserve_job(BOB, job_id), Reservation)
    assert await s.delete(BOB, job_id)
    assert [(e.event, e.tries) for e in await record.new()] == [
        ("reserved", 1), ("released", 1), ("reserved", 2), ("timed-out", 2),
        ("reserved", 3), ("deleted", 3)]


async def test_jobs_handed_back_by_a_reaped_process_say_why(env: Env) -> None:
    ghost = Store(env.store.client, env.keys, "ghost", env.clock, events_maxlen=1000)
    await ghost.heartbeat()
    await ghost.connect("ghost:1")
    await ghost.set_waiting("ghost:1", 1)
    record = await Recorder.start(env)
    job_id = await env.put()  # handed to the ghost's waiting connection, by this process
    env.clock.advance(10)
    await env.store.heartbeat()
    assert await env.store.reap(env.clock.now_ms - 3000) == 1
    assert [(e.event, e.by, e.reason, e.tries) for e in await record.new()] == [
        ("put", "inst", "", 0), ("reserved", "inst", "", 1),
        ("timed-out", "inst", "reaped", 1)]
    # The process whose script call did it is `by`: here the ghost's own store.
    assert await ghost.kick_job(job_id) is False  # ready: nothing to kick, nothing written
    assert await ghost.delete("ghost:2", job_id)
    assert [(e.event, e.by) for e in await record.new()] == [("deleted", "ghost")]


async def test_a_disconnect_gives_back_a_handed_job_with_reason_disconnect(env: Env) -> None:
    s = env.store
    await s.set_waiting(BOB, 1)
    job_id = await env.put()
    record = await Recorder.start(env)
    assert await s.disconnect(BOB, False, False, []) == 1
    assert [fields(e) for e in await record.new()] == [
        expected(env, EventName.TIMED_OUT, job_id, tries=1, reason="disconnect")]


# -- the ends: finish and fail ---------------------------------------------------------------------


async def test_finish_writes_deleted_with_reason_finished_and_the_results_size(env: Env) -> None:
    job_id = await env.put(pri=3)
    await env.reserve()
    record = await Recorder.start(env)
    assert await env.store.finish(ALICE, job_id, b"forty-two", 60_000)
    assert [fields(e) for e in await record.new()] == [
        expected(env, EventName.DELETED, job_id, pri=3, tries=1, reason="finished", size=9)]
    # An empty result is a finish all the same, of size 0; a delete has no size.
    other = await env.put()
    await env.reserve()
    assert await env.store.finish(ALICE, other, b"", 60_000)
    third = await env.put()
    await env.reserve()
    assert await env.store.delete(ALICE, third)
    assert [(e.event, e.reason, e.size) for e in await record.new()
            if e.event == EventName.DELETED] == [("deleted", "finished", 0), ("deleted", "", 0)]


async def test_fail_writes_failed_with_the_error_then_the_jobs_move(env: Env) -> None:
    """A fail is two events: `failed` (the error, its size, the failures so far, the tries),
    then what the job's policies did with it: here released to ready, then buried at max-tries."""
    outcome = await env.store.put_with("default", 4, 0, 60, b"x", (("max-tries", 2),))
    job_id = outcome.id
    record = await Recorder.start(env)
    await env.reserve()
    assert await env.store.fail(ALICE, job_id, b"ValueError: no such order") is not None
    env.clock.advance(5)
    await env.reserve()
    assert await env.store.fail(ALICE, job_id, b"KeyError: 'sku'") is not None
    after = (await env.store.job_info(job_id))
    assert after is not None and after.state == "buried"
    assert [fields(e) for e in await record.new()] == [
        expected(env, EventName.RESERVED, job_id, pri=4, tries=1, time_ms=env.clock.now_ms - 5000),
        expected(env, EventName.FAILED, job_id, pri=4, tries=1, time_ms=env.clock.now_ms - 5000,
                 size=25, error="ValueError: no such order", failures=1),
        expected(env, EventName.RELEASED, job_id, pri=4, tries=1, time_ms=env.clock.now_ms - 5000,
                 reason="failed"),
        expected(env, EventName.RESERVED, job_id, pri=4, tries=2),
        expected(env, EventName.FAILED, job_id, pri=4, tries=2, size=15,
                 error="KeyError: 'sku'", failures=2),
        expected(env, EventName.BURIED, job_id, pri=4, tries=2, reason="max-tries")]


async def test_a_fails_event_keeps_the_errors_head_cut_where_a_character_begins(env: Env) -> None:
    """The job keeps the whole error; its event the first ERROR_EXCERPT_BYTES bytes, less the
    start of a character the bound would split; size is the whole error's length."""
    ascii_error = b"E" * 1000
    split = "x" + "\u00e9" * 300  # two bytes each: the bound falls inside the 128th
    three = "\u20ac" * 100  # three bytes each: 256 = 85 * 3 + 1
    cases = [(ascii_error, "E" * ERROR_EXCERPT_BYTES),
             (split.encode(), "x" + "\u00e9" * 127),
             (three.encode(), "\u20ac" * 85),
             (b"\xff\xfeboom", "\ufffd\ufffdboom")]  # not UTF-8: readable all the same
    record = await Recorder.start(env)
    for error, _ in cases:
        job_id = await env.put()
        assert (await env.reserve()).id == job_id
        assert await env.store.fail(ALICE, job_id, error) is not None
        assert await env.raw.hget(env.keys.job(job_id), JobField.ERROR) == error
        assert (await env.reserve()).id == job_id  # back to ready by the fail
        assert await env.store.delete(ALICE, job_id)
    failed = [e for e in await record.new() if e.event == EventName.FAILED]
    assert [(e.error, e.size) for e in failed] == [(want, len(error)) for error, want in cases]
    assert all(len(e.error.encode()) <= ERROR_EXCERPT_BYTES for e in failed)


async def test_finish_and_fail_with_events_off_write_none(redis_url: str) -> None:
    async with open_env(redis_url, 0) as off:
        first, second = await off.put(), await off.put()
        await off.reserve()
        await off.reserve()
        assert await off.store.finish(ALICE, first, b"result", 60_000)
        assert await off.store.fail(ALICE, second, b"boom") is not None
        assert await off.raw.exists(off.keys.events) == 0


def entry(**values: str | int) -> dict[bytes, bytes]:
    """A stream entry's fields as XRANGE returns them."""
    return {name.encode(): str(value).encode() for name, value in values.items()}


OLD_ENTRY = {"event": "deleted", "id": 7, "tube": "t", "pri": 0, "delay_ms": 0, "ttr_ms": 1000,
             "due_ms": 0, "tries": 1, "time_ms": 5, "by": "p", "reason": ""}


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("how", ["ready", "delayed", "held", "handed"])
async def test_a_traced_puts_event_alone_carries_its_traceparent_last(env: Env,
                                                                      how: str) -> None:
    """put-with traceparent=: its put entry has every field, then traceparent; its other
    events and every other job's have none (so they cost nothing more)."""
    if how == "handed":  # a push loop of this process waits on the tube: put.lua hands it over
        await env.store.set_waiting(ALICE, 1)
    opts: list[tuple[str, int | str]] = [("traceparent", TRACEPARENT)]
    if how == "delayed":
        opts.insert(0, ("delay-ms", 5000))
    if how == "held":
        opts[:0] = [("after", str(await env.put())), ("after-keep", 3_600_000)]
    traced = (await env.store.put_with("default", 0, 0, 60, b"t", tuple(opts))).id
    plain = await env.put()
    entries = await env.raw.xrange(env.keys.events, "-", "+")
    names = [[k.decode() for k in fields] for _, fields in entries]
    events = [Event.from_entry(sid, fields) for sid, fields in entries]
    at = next(i for i, e in enumerate(events) if e.event == "put" and e.id == traced)
    assert names[at] == [*FIELDS, *TRAILING_FIELDS]
    assert (events[at].traceparent, events[at].reason) == (
        TRACEPARENT, "after" if how == "held" else "")
    assert len(events[at].as_row()) == 1 + len(FIELDS)  # the archive's row: FIELDS only
    assert all(n == list(FIELDS) for i, n in enumerate(names) if i != at)
    assert [e.traceparent for e in events if e.id == plain] == [""]
    if how == "handed":
        assert [e.event for e in events if e.id == traced] == ["put", "reserved"]


@pytest.mark.parametrize("delay", [0, 5])
async def test_a_traced_put_many_entry_carries_its_traceparent_last(env: Env,
                                                                     delay: int) -> None:
    """put-many entries with traceparent=: the job's record and its put entry carry it, as
    put-with's do; the batch's other jobs (with a group, or plain) none."""
    ids = await env.store.put_many("default", [(0, delay, 60, b"t"), (0, delay, 60, b"g"),
                                               (0, delay, 60, b"p")],
                                   groups=["", "grp", ""], traceparents=[TRACEPARENT, "", ""])
    traced, grouped, plain = ids
    assert await env.raw.hget(env.keys.job(traced), "tp") == TRACEPARENT.encode()
    assert await env.raw.hget(env.keys.job(grouped), "tp") is None
    assert await env.raw.hget(env.keys.job(grouped), "g") == b"grp"
    entries = await env.raw.xrange(env.keys.events, "-", "+")
    names = {Event.from_entry(sid, fields).id: [k.decode() for k in fields]
             for sid, fields in entries}
    events = {e.id: e for e in (Event.from_entry(sid, f) for sid, f in entries)}
    assert names[traced] == [*FIELDS, *TRAILING_FIELDS]
    assert events[traced].traceparent == TRACEPARENT
    assert names[grouped] == names[plain] == list(FIELDS)


def test_a_trailing_field_parses_and_is_checked() -> None:
    full = {**OLD_ENTRY, "event": "put", "size": 0, "error": "", "failures": 0}
    assert Event.from_entry(b"5-0", entry(**full, traceparent=TRACEPARENT)).traceparent == (
        TRACEPARENT)
    assert Event.from_entry(b"5-0", entry(**OLD_ENTRY, traceparent=TRACEPARENT)).traceparent \
        == TRACEPARENT  # on an entry of the first schema too
    with pytest.raises(MalformedEvent):
        Event.from_entry(b"5-0", entry(**full) | {b"traceparent": b"\xff"})


def test_an_entry_written_before_the_later_fields_parses_with_their_defaults() -> None:
    """An older tubeq's entries (no size, error, failures) still read: 0 and ""."""
    event = Event.from_entry(b"5-0", entry(**OLD_ENTRY))
    assert (event.event, event.id, event.size, event.error, event.failures) == (
        "deleted", 7, 0, "", 0)
    assert event.as_row()[-len(LATER_FIELDS):] == (0, "", 0)
    full = Event.from_entry("5-1", entry(**OLD_ENTRY, size=3, error="x", failures=2))
    assert (full.size, full.error, full.failures) == (3, "x", 2)


@pytest.mark.parametrize("fields", [
    {**OLD_ENTRY, "size": 3},  # some of the later fields but not all
    {**OLD_ENTRY, "size": 3, "error": "", "failures": 0, "result": "x"},  # one not in FIELDS
    {name: value for name, value in OLD_ENTRY.items() if name != "by"},  # a first field missing
    {**OLD_ENTRY, "size": "big", "error": "", "failures": 0},
])
def test_entries_of_no_schema_are_malformed(fields: dict[str, str | int]) -> None:
    with pytest.raises(MalformedEvent):
        Event.from_entry(b"5-0", entry(**fields))


def test_an_error_that_is_not_utf8_parses_with_replacement_characters() -> None:
    raw = entry(**OLD_ENTRY, size=4, failures=1, error="") | {b"error": b"\xffok\xfe"}
    assert Event.from_entry(b"5-0", raw).error == "\ufffdok\ufffd"
    with pytest.raises(MalformedEvent):  # a tube is tubeq's own text: strict
        Event.from_entry(b"5-0", raw | {b"tube": b"\xff"})


@pytest.mark.parametrize(("before", "op"), [k for k in TRANSITIONS if k[0] is not None])
async def test_events_off_writes_none(redis_url: str, before: JobState, op: str) -> None:
    async with open_env(redis_url, 0) as off:
        await perform(off, op, await bring_to(off, before))
        await off.store.heartbeat()  # alive after the clock moved on
        await off.store.set_waiting(BOB, 1)
        await off.put()  # handed over to BOB
        assert await off.store.disconnect(BOB, False, False, []) == 1
        assert await off.raw.exists(off.keys.events) == 0


async def test_the_cap_trims_the_stream(redis_url: str) -> None:
    """The puts append without a cap; trim_events (the scheduler's, once a second) trims to it."""
    async with open_env(redis_url, 10) as capped:
        node = int((await capped.raw.config_get("stream-node-max-entries"))[
            "stream-node-max-entries"])
        for _ in range(3 * node):
            await capped.put()
        assert await capped.raw.xlen(capped.keys.events) == 3 * node
        trimmed = capped.store.trim_events()
        assert trimmed is not None
        await trimmed
        length = await capped.raw.xlen(capped.keys.events)
        # MAXLEN ~ trims whole stream nodes: at least the cap stays, at most a node more.
        assert 10 <= length <= 10 + node
        newest = await capped.raw.xrevrange(capped.keys.events, count=1)
        assert Event.from_entry(*newest[0]).id == 3 * node


async def test_the_scheduler_keeps_the_cap(redis_url: str) -> None:
    """A running server trims its namespace's stream by itself, within its heartbeat."""
    server = Server(Config(port=0, redis_url=redis_url, prefix="trim", events_maxlen=10))
    await server.start()
    try:
        assert server.ctx is not None
        store = server.ctx.store
        raw = store.client
        for _ in range(300):
            await store.put("default", 0, 0, 60, b"x")
        async with asyncio.timeout(10):
            while int(await raw.call("XLEN", store.keys.events)) > 10 + 100:
                await asyncio.sleep(0.1)
    finally:
        await server.stop()


def test_a_negative_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="events_maxlen"):
        Store(None, None, "inst", events_maxlen=-1)  # type: ignore[arg-type]


def test_protocol_md_documents_each_field_once_in_order() -> None:
    """protocol.md's event schema: one row per field, in FIELDS order, naming every event a
    script writes and every reason tubeq gives."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = (root / "protocol.md").read_text(encoding="utf-8")
    section = text.split("\n## Lifecycle events\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("| field | holds |", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*) \|$", table, re.M))
    names = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert names == list(FIELDS)
    lua = "\n".join(path.read_text(encoding="utf-8")
                    for path in (root / "tubeq" / "store" / "lua").rglob("*.lua"))
    written = {name for name in EventName if f"'{name.value}'" in lua}
    assert {name for name in written if f"`{name.value}`" not in rows["event"]} == set()
    for reason in ("disconnect", "reaped", "max-tries", "expired", "cleared", "schedule:"):
        assert f"`{reason}" in rows["reason"], reason
