"""put-many, reserve-many and delete-many: the scripts against a real Redis on a fake clock
(layer c), then the commands against a real tubeq (layer d, exact reply bytes)."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.store.test_lua import ALICE, BOB, Env, open_env
from tests.support.servers import ServerProcess, TubeqCluster, start_tubeq, unique_prefix
from tests.support.wire import Wire
from tubeq.model.states import JobState
from tubeq.protocol.batch_framing import PUT_MANY_PART
from tubeq.redisio.process import RedisProcess
from tubeq.store.records import NoJob

# -- Lua (put_many.lua, delete_many.lua; reserve-many is reserve.lua with a count) ---------------


@pytest.fixture(params=[1000, 0], ids=["events-on", "events-off"])
async def env(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    async with open_env(redis_url, request.param) as opened:
        yield opened


async def test_put_many_stores_each_job_in_order_ready_or_delayed(env: Env) -> None:
    s = env.store
    before = await env.put()
    ids = await s.put_many("batch", [(5, 0, 30, b"a"), (1, 10, 60, b"b"), (9, 0, 1, b"")])
    assert ids == [before + 1, before + 2, before + 3]
    states = [await env.state(i) for i in ids]
    assert states == [JobState.READY, JobState.DELAYED, JobState.READY]
    info = await s.job_info(ids[1])
    assert info is not None and (info.tube, info.pri, info.delay, info.ttr) == ("batch", 1, 10, 60)
    assert await s.peek(ids[0]) == b"a" and await s.peek(ids[2]) == b""
    counts = await s.tube_counts("batch")
    assert counts is not None and (counts[1], counts[3]) == (2, 1)  # ready, delayed
    env.clock.advance(11)
    await s.promote()
    assert await env.state(ids[1]) is JobState.READY


async def test_put_many_hands_ready_jobs_to_waiters_in_turn_and_wakes_once_for_the_rest(
        env: Env) -> None:
    s = env.store
    pubsub = env.raw.pubsub()
    await pubsub.subscribe(env.keys.grant_channel("inst"), env.keys.wake_channel("default"))
    for _ in range(2):
        assert await pubsub.get_message(timeout=1) is not None  # subscribe confirmations
    await s.set_waiting(BOB, 1)
    await s.set_waiting(ALICE, 1)
    ids = await s.put_many("default", [(0, 0, 60, b"1"), (0, 0, 60, b"2"), (0, 0, 60, b"3")])
    messages = []
    while (m := await pubsub.get_message(timeout=0.5)) is not None:
        messages.append((m["channel"], m["data"]))
    grant = env.keys.grant_channel("inst").encode()
    # One job each, first waiter first; nobody waits for the third: no wake-up.
    assert messages == [(grant, BOB.encode()), (grant, ALICE.encode())]
    bob, alice = await env.reserve(BOB), await env.reserve(ALICE)
    assert (bob.id, alice.id) == (ids[0], ids[1])
    assert await env.state(ids[2]) is JobState.READY
    await pubsub.aclose()


async def test_put_many_with_a_waiter_left_over_publishes_one_wake(env: Env) -> None:
    s = env.store
    pubsub = env.raw.pubsub()
    await pubsub.subscribe(env.keys.wake_channel("default"))
    assert await pubsub.get_message(timeout=1) is not None
    await s.pause("default", 100)  # BOB waits on a paused tube: nothing can be handed over
    await s.set_waiting(BOB, 1)
    await s.put_many("default", [(0, 0, 60, b"1"), (0, 0, 60, b"2")])
    first = await pubsub.get_message(timeout=1)
    assert first is not None and first["type"] == "message"
    assert await pubsub.get_message(timeout=0.3) is None  # once per batch, not per job
    await pubsub.aclose()


async def test_delete_many_answers_each_id_in_order(env: Env) -> None:
    s = env.store
    alices, bobs, free = await env.put(), await env.put(), await env.put()
    assert (await env.reserve(ALICE)).id == alices
    assert (await env.reserve(BOB)).id == bobs
    buried = await env.put()
    assert (await env.reserve(ALICE)).id == free
    assert await s.release(ALICE, free, 0, 0)
    assert (await env.reserve(ALICE)).id == free
    assert await s.bury(ALICE, free, 0)
    # BOB may delete his own reservation and any job not reserved, not ALICE's; an id given
    # twice is deleted once; an unknown id is not found.
    done = await s.delete_many(BOB, [alices, bobs, buried, bobs, 999_999, free])
    assert done == [False, True, True, False, False, True]
    assert await env.state(alices) is JobState.RESERVED
    assert [await env.state(i) for i in (bobs, buried, free)] == [None, None, None]
    assert await s.delete_many(ALICE, [alices]) == [True]
    counts = await s.tube_counts("default")
    assert counts is not None and sum(counts[:5]) == 0


async def test_reserve_with_a_count_takes_up_to_it_in_reserve_order(env: Env) -> None:
    s = env.store
    ids = await s.put_many("default", [(3, 0, 60, b"c"), (1, 0, 60, b"a"), (2, 0, 60, b"b")])
    got = await s.reserve_many(ALICE, 2)
    assert [r.id for r in got] == [ids[1], ids[2]]
    assert [r.id for r in await s.reserve_many(ALICE, 5)] == [ids[0]]
    assert await s.reserve_many(ALICE, 5) == []


async def test_a_run_from_one_watched_tube_leaves_its_index_entry_on_the_next_job(
        env: Env) -> None:
    """A connection watching one tube takes a run of its jobs in one step and the ready-tube
    index is brought up to date once: another connection watching that tube and another one
    then gets the jobs left in (pri, id) order across both."""
    s = env.store
    ids = await s.put_many("default", [(3, 0, 60, b"c"), (1, 0, 60, b"a"), (2, 0, 60, b"b"),
                                       (5, 0, 60, b"e"), (1, 0, 60, b"a2")])
    other = await env.put("other", 4)
    await s.change_watches(BOB, [("+w", "other")])
    assert [r.id for r in await s.reserve_many(ALICE, 3)] == [ids[1], ids[4], ids[2]]
    assert [(await env.reserve(BOB)).id for _ in range(3)] == [ids[0], other, ids[3]]
    assert isinstance(await s.reserve(BOB), NoJob)
    counts = await s.tube_counts("default")
    assert counts is not None and counts[2] == 5  # reserved: 3 by ALICE, 2 by BOB
    # A batch of deletes moves each tube's counters once, by as many jobs as it deleted.
    assert await s.delete_many(ALICE, [ids[1], ids[4], ids[2], ids[0]]) == [True] * 3 + [False]
    assert await s.delete_many(BOB, [ids[0], ids[3], other]) == [True] * 3
    counts = await s.tube_counts("default")
    assert counts is not None and counts[:5] == [0] * 5 and counts[9] == 5  # cmd-delete


async def test_put_many_keeps_the_index_on_the_tube_head_whatever_the_priorities(
        env: Env) -> None:
    """put_many skips the head check of a job that cannot be the tube's new head (a priority
    not below one the batch already put: its id is larger); a reserve across two tubes,
    which goes by the ready-tube index, still gets every job in (pri, id) order."""
    s = env.store
    old = await env.put("default", 4)
    other = await env.put("other", 2)
    pris = [5, 3, 7, 3, 1, 2]
    ids = await s.put_many("default", [(p, 0, 60, b"%d" % p) for p in pris])
    await s.change_watches(BOB, [("+w", "other")])
    by_pri = {p: [i for i, q in zip(ids, pris, strict=True) if q == p] for p in pris}
    expected = [*by_pri[1], other, *by_pri[2], *by_pri[3], old, *by_pri[5], *by_pri[7]]
    assert [(await env.reserve(BOB)).id for _ in expected] == expected
    assert isinstance(await s.reserve(BOB), NoJob)


async def test_the_largest_runs_fit_in_one_script_call(env: Env) -> None:
    """reserve-many's largest count (1000) is one run, and a delete-many of more held jobs than
    Lua's unpack passes at once (~8,000) deletes them all: the script splits its ZREM."""
    s = env.store
    ids: list[int] = []
    for _ in range(9):
        ids += await s.put_many("default", [(0, 0, 60, b"x")] * 1000)
    taken: list[int] = []
    for _ in range(9):
        taken += [r.id for r in await s.reserve_many(ALICE, 1000)]
    assert taken == ids
    assert await s.delete_many(ALICE, ids) == [True] * 9000
    counts = await s.tube_counts("default")
    assert counts is not None and counts[:5] == [0] * 5 and counts[9] == 9000


async def test_put_many_and_delete_many_write_one_event_per_job(redis_url: str) -> None:
    async with open_env(redis_url, 1000) as env:
        ids = await env.store.put_many("ev", [(0, 0, 60, b"x"), (0, 2, 60, b"y")])
        assert await env.store.delete_many(ALICE, ids) == [True, True]
        entries = await env.raw.xrange(env.keys.events)
        seen = [(f[b"event"], int(f[b"id"])) for _, f in entries if int(f[b"id"]) in ids]
        assert seen == [(b"put", ids[0]), (b"put", ids[1]), (b"deleted", ids[0]),
                        (b"deleted", ids[1])]


# -- wire: exact replies from a real tubeq -------------------------------------------------------


def entry(body: bytes, pri: int = 0, delay: int = 0, ttr: int = 60) -> bytes:
    return b"%d %d %d %d\r\n%s\r\n" % (pri, delay, ttr, len(body), body)


def batch_of(w: Wire, first: bytes) -> list[bytes]:
    """The items of a BATCH reply whose first line ``first`` was read."""
    assert first.startswith(b"BATCH "), first
    return [w.reply() for _ in range(int(first.split()[1]))]


def ids_of(items: list[bytes]) -> list[int]:
    return [int(item.split()[1]) for item in items]


def test_put_many_answers_one_reply_per_entry_in_order(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        assert w.ask("use pm-order") == b"USING pm-order\r\n"
        w.send(b"put-many 5\r\n" + entry(b"one") + b"0 0 60 3 ttl-ms=5\r\nbad\r\n"
               + b"0 0 60 70000\r\n" + b"z" * 70_002 + b"0 0 60 2\r\nabXY" + entry(b"five"))
        items = batch_of(w, w.reply())
        # ttl-ms is no option of an entry (they take group= only)
        assert items[1:4] == [b"BAD_OPTION ttl-ms\r\n", b"JOB_TOO_BIG\r\n", b"EXPECTED_CRLF\r\n"]
        first, last = ids_of([items[0], items[4]])
        assert items[0] == b"INSERTED %d\r\n" % first and last == first + 1  # no id used up
        assert w.ask(f"peek {last}") == b"FOUND %d 4\r\nfive\r\n" % last
        assert w.ask("list-tube-used") == b"USING pm-order\r\n"  # in step after the batch
        assert w.ask("put-many 0") == b"BATCH 0\r\n"
        assert w.ask("put-many x") == b"BAD_FORMAT\r\n"
        w.send(b"put-many 1001\r\n" + entry(b"quit") * 1001)
        assert w.reply() == b"BAD_FORMAT\r\n"
        assert w.ask("list-tube-used") == b"USING pm-order\r\n"


def wait_for_ready(w: Wire, tube: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while w.yaml(f"stats-tube {tube}")["current-jobs-ready"] != str(count):
        assert time.monotonic() < deadline, f"{tube} never held {count} ready jobs"
        time.sleep(0.02)


def test_a_long_put_many_is_stored_part_by_part_and_answered_once(server: ServerProcess) -> None:
    # The first part is in Redis while the batch's end has not even been sent; another
    # connection's put between the parts takes the id between theirs; one BATCH answers all.
    with Wire(server.host, server.port) as w, Wire(server.host, server.port) as other:
        w.ask("use pm-parts")
        other.ask("use pm-parts")
        count = 2 * PUT_MANY_PART + 5
        w.send(b"put-many %d\r\n" % count + entry(b"early") * (PUT_MANY_PART + 1))
        wait_for_ready(other, "pm-parts", PUT_MANY_PART)
        between = int(other.ask("put 0 0 60 1\r\nb").split()[1])
        w.send(entry(b"late") * (count - PUT_MANY_PART - 1))
        ids = ids_of(batch_of(w, w.reply()))
        assert len(ids) == count and ids == sorted(ids)
        assert ids[PUT_MANY_PART - 1] < between < ids[PUT_MANY_PART]
        assert w.ask(f"peek {ids[-1]}") == b"FOUND %d 4\r\nlate\r\n" % ids[-1]
        assert other.yaml("stats-tube pm-parts")["total-jobs"] == str(count + 1)


def test_a_tube_that_fills_up_during_a_long_put_many_refuses_the_rest(
        server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use pm-full")
        assert w.ask(f"tube-set pm-full max-jobs={PUT_MANY_PART + 10}") == b"SET\r\n"
        items = batch_of(w, w.ask(b"put-many %d\r\n" % (3 * PUT_MANY_PART)
                                  + entry(b"x") * (3 * PUT_MANY_PART)))
        inserted = [item for item in items if item.startswith(b"INSERTED ")]
        assert len(inserted) == PUT_MANY_PART + 10 and items[:len(inserted)] == inserted
        assert set(items[len(inserted):]) == {b"OUT_OF_MEMORY\r\n"}
        doc = w.yaml("stats-tube pm-full")
        assert (doc["total-jobs"], doc["current-jobs-ready"]) == (str(len(inserted)),) * 2


def test_a_part_whose_store_call_fails_answers_internal_error_for_its_jobs_alone(
        tmp_path: Path) -> None:
    # Redis goes away between the parts: the stored part is INSERTED, each job of the next is
    # INTERNAL_ERROR saying that its call did not run, or, when tubeq had sent it before it saw
    # the link go, that nobody can know (protocol.md, "Redis stalls"); a refused entry keeps its
    # own reply, and the connection stays in step.
    redis = RedisProcess(tmp_path / "redis")
    redis.start()
    server = start_tubeq(redis.url, unique_prefix("pm-lost"), tmp_path / "logs")
    try:
        with Wire(server.host, server.port) as w, Wire(server.host, server.port) as other:
            w.ask("use pm-lost")
            w.send(b"put-many %d\r\n" % (PUT_MANY_PART + 3) + entry(b"x") * (PUT_MANY_PART + 1))
            wait_for_ready(other, "pm-lost", PUT_MANY_PART)
            redis.stop()
            w.send(b"0 0 60 1 junk\r\nz\r\n" + entry(b"y"))
            items = batch_of(w, w.reply())
            assert all(item.startswith(b"INSERTED ") for item in items[:PUT_MANY_PART])
            failed, refused, failed_too = items[PUT_MANY_PART:]
            assert refused == b"BAD_FORMAT\r\n"
            assert failed == failed_too
            assert failed in (b"INTERNAL_ERROR not-run\r\n", b"INTERNAL_ERROR unknown\r\n")
            assert w.ask("list-tube-used") == b"USING pm-lost\r\n"
    finally:
        server.stop()
        redis.stop()


def test_put_many_counts_total_jobs_and_delays_promote(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use pm-count")
        w.send(b"put-many 3\r\n" + entry(b"a") + entry(b"b", delay=1) + entry(b"c"))
        ids = ids_of(batch_of(w, w.reply()))
        stats = w.yaml("stats-tube pm-count")
        assert (stats["total-jobs"], stats["current-jobs-ready"],
                stats["current-jobs-delayed"]) == ("3", "2", "1")
        w.ask("watch pm-count")
        w.ask("ignore default")
        got = batch_of(w, w.ask("reserve-many 3 0"))
        assert ids_of(got) == [ids[0], ids[2]]
        # The delayed job becomes ready after its second: a reserve-many waits for it.
        later = batch_of(w, w.ask("reserve-many 3 5"))
        assert later == [b"RESERVED %d 1\r\nb\r\n" % ids[1]]


def test_reserve_many_waits_until_one_job_then_times_out(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as worker, Wire(server.host, server.port) as producer:
        worker.ask("watch rm-wait")
        worker.ask("ignore default")
        assert worker.ask("reserve-many 10 0") == b"TIMED_OUT\r\n"
        worker.send("reserve-many 10 2")
        time.sleep(0.3)  # the reserve is (most likely) waiting now; either way it gets the job
        producer.ask("use rm-wait")
        job_id = int(producer.ask(b"put 0 0 60 2\r\nhi\r\n").split()[1])
        assert batch_of(worker, worker.reply()) == [b"RESERVED %d 2\r\nhi\r\n" % job_id]
        assert worker.ask("reserve-many 10 1") == b"TIMED_OUT\r\n"
        assert worker.ask(f"delete-many {job_id} {job_id}") == b"BATCH 2\r\n"
        assert worker.reply() + worker.reply() == b"DELETED\r\nNOT_FOUND\r\n"


def test_reserve_many_answers_deadline_soon_like_reserve(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use rm-soon")
        w.ask("watch rm-soon")
        w.ask("ignore default")
        w.ask(b"put 0 0 1 1\r\nx\r\n")
        assert len(batch_of(w, w.ask("reserve-many 5 0"))) == 1
        # TTR 1 s: the job is in its last second (the safety margin) at once.
        assert w.ask("reserve-many 5 1") == b"DEADLINE_SOON\r\n"


def test_reserve_many_takes_up_to_count_in_priority_order(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use rm-order")
        w.ask("watch rm-order")
        w.ask("ignore default")
        w.send(b"put-many 4\r\n" + entry(b"c", pri=3) + entry(b"a", pri=1) + entry(b"d", pri=4)
               + entry(b"b", pri=2))
        ids = ids_of(batch_of(w, w.reply()))
        got = batch_of(w, w.ask("reserve-many 3 0"))
        assert got == [b"RESERVED %d 1\r\n%s\r\n" % (i, body) for i, body in
                       ((ids[1], b"a"), (ids[3], b"b"), (ids[0], b"c"))]
        stats = w.yaml(f"stats-job {ids[1]}")
        assert stats["state"] == "reserved"
        w.send(f"delete-many {ids[1]} {ids[3]} {ids[0]} {ids[2]}")
        assert batch_of(w, w.reply()) == [b"DELETED\r\n"] * 4  # ids[2] was ready: deletable
        assert w.ask("reserve-many 0 0") == b"BAD_FORMAT\r\n"
        assert w.ask("reserve-many 1001 0") == b"BAD_FORMAT\r\n"


def test_delete_many_of_held_jobs_passes_a_waiting_reserve(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use rm-pass")
        w.ask("watch rm-pass")
        w.ask("ignore default")
        w.send(b"put-many 2\r\n" + entry(b"a") + entry(b"b"))
        ids = ids_of(batch_of(w, w.reply()))
        batch_of(w, w.ask("reserve-many 2 0"))
        # The reserve waits (nothing ready); the delete-many of held jobs goes to Redis at once
        # but its reply keeps its place behind the reserve's TIMED_OUT.
        w.send(f"reserve-with-timeout 1\r\ndelete-many {ids[0]} {ids[1]}")
        assert w.reply() == b"TIMED_OUT\r\n"
        assert batch_of(w, w.reply()) == [b"DELETED\r\n", b"DELETED\r\n"]


def test_a_client_closing_returns_the_jobs_of_its_reserve_many(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use rm-close")
        w.send(b"put-many 2\r\n" + entry(b"a") + entry(b"b"))
        ids = ids_of(batch_of(w, w.reply()))
    with Wire(server.host, server.port) as w:
        w.ask("watch rm-close")
        w.ask("ignore default")
        assert len(batch_of(w, w.ask("reserve-many 2 0"))) == 2
        w.sock.shutdown(socket.SHUT_RDWR)
    with Wire(server.host, server.port) as w:
        for _ in range(50):
            if w.yaml(f"stats-job {ids[0]}")["state"] == "ready":
                break
            time.sleep(0.1)
        assert [w.yaml(f"stats-job {i}")["state"] for i in ids] == ["ready", "ready"]


def test_batch_commands_are_listed_and_unknown_to_a_plain_put(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        words = w.ask("extensions").split(b"\r\n", 1)[1]
        for word in (b"- put-many", b"- reserve-many", b"- delete-many"):
            assert word in words
        assert w.ask("delete-many") == b"UNKNOWN_COMMAND\r\n"


def test_a_batch_reply_is_bounded_by_the_buffer_cap(tubeq_cluster: TubeqCluster) -> None:
    server = tubeq_cluster.start(label="tubeq-batch-cap",
                                 flags=("--max-client-buffer", "1000000"))
    try:
        with Wire(server.host, server.port) as w:
            w.ask("use cap")
            w.ask("watch cap")
            w.ask("ignore default")
            body = b"q" * 60_000
            # 1 MB cap: a batch keeps at most 500 kB of bodies: the 9th entry is refused.
            w.send(b"put-many 9\r\n" + entry(body) * 9)
            items = batch_of(w, w.reply())
            assert items[8] == b"JOB_TOO_BIG\r\n" and all(i.startswith(b"INSERTED")
                                                          for i in items[:8])
            # ... and one reserve-many reply at most 500 kB of jobs: 7 of 64 KiB max-job-size.
            assert len(batch_of(w, w.ask("reserve-many 100 0"))) == 7
            assert len(batch_of(w, w.ask("reserve-many 100 0"))) == 1
    finally:
        server.stop()


# -- the connection's held jobs (layer b) ---------------------------------------------------------


async def test_a_connection_holding_many_jobs_prunes_its_map_amortized(redis_url: str) -> None:
    """reserve-many and push hold hundreds of jobs: the map of held jobs is not copied for
    every job taken (it was, past 64), yet jobs whose TTR ran out are still dropped."""
    from tubeq.server.connection import Connection
    from tubeq.server.process import Config, Server
    from tubeq.server.reserves import PRUNE_RESERVED_AT
    from tubeq.store.records import Reservation

    server = Server(Config(port=0, redis_url=redis_url, prefix="prune"))
    await server.start()
    try:
        assert server.ctx is not None
        conn = Connection(server.ctx)
        now = 1_700_000_000_000
        readings = 0

        def clock() -> int:
            nonlocal readings
            readings += 1
            return now

        real_clock = conn.store.clock
        conn.store.clock = clock  # the server's own store: put back before it stops
        for job_id in range(1000):
            conn.reserves.hold((Reservation(job_id, 60, b"", now + 60_000),))
        assert len(conn.reserved) == 1000  # every live job kept
        assert readings <= 6  # pruned at 64, 128, 256, 512: not once per job
        # Jobs whose TTR ran out go at the next pruning.
        now += 120_000
        for job_id in range(1000, 2000):
            conn.reserves.hold((Reservation(job_id, 60, b"", now + 60_000),))
        assert sorted(conn.reserved) == list(range(1000, 2000))
        assert readings <= 6 + 1000 // PRUNE_RESERVED_AT
        conn.store.clock = real_clock
    finally:
        await server.stop()
