"""GET /metrics scraped over HTTP after known operations on a real tubeq: every figure is the
count of what the test did (one counter source: the same numbers as the stats reply)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio

from tests.support.client_support import eventually
from tests.support.http_support import Beanstalk, Samples, running_server, sample, scrape
from tubeq.redisio.process import RedisProcess
from tubeq.server.metrics import OTHER_TUBE
from tubeq.server.process import Server


@pytest.fixture
async def server(redis_url: str) -> AsyncIterator[Server]:
    async with running_server(redis_url) as s:
        yield s


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def base(server: Server) -> str:
    return f"http://127.0.0.1:{server.http_port}"


async def test_commands_outcomes_and_job_transitions(server: Server,
                                                     session: aiohttp.ClientSession) -> None:
    bean = await Beanstalk.open(server.port)
    try:
        assert await bean.ask(b"use m") == b"USING m\r\n"
        assert await bean.ask(b"watch m") == b"WATCHING 2\r\n"
        for i in range(4):
            assert (await bean.ask(b"put 0 0 60 1", b"%d" % i)).startswith(b"INSERTED")
        ids = []
        for _ in range(3):
            reply = await bean.ask(b"reserve-with-timeout 0")
            ids.append(int(reply.split()[1]))
        assert await bean.ask(b"delete %d" % ids[0]) == b"DELETED\r\n"
        assert await bean.ask(b"release %d 0 0" % ids[1]) == b"RELEASED\r\n"
        assert await bean.ask(b"bury %d 0" % ids[2]) == b"BURIED\r\n"
        assert await bean.ask(b"delete 999999") == b"NOT_FOUND\r\n"
        assert await bean.ask(b"kick 5") == b"KICKED 1\r\n"
        stats = await bean.ask(b"stats")
        samples = await scrape(session, base(server))
    finally:
        await bean.close()

    def command(name: str) -> float:
        return sample(samples, "tubeq_commands_total", command=name)

    # One source: /metrics and the stats reply count the same commands.
    for name in ("put", "reserve-with-timeout", "delete", "release", "bury", "kick", "use",
                 "watch"):
        field = re.search(rb"\ncmd-%s: (\d+)\n" % name.encode(), stats)
        assert field is not None and command(name) == int(field[1]), name
    assert command("put") == 4 and command("delete") == 2

    def outcome(name: str, word: str) -> float:
        return sample(samples, "tubeq_command_outcomes_total", command=name, outcome=word)

    assert outcome("put", "INSERTED") == 4
    assert outcome("reserve-with-timeout", "RESERVED") == 3
    assert outcome("delete", "DELETED") == 1 and outcome("delete", "NOT_FOUND") == 1
    assert outcome("kick", "KICKED") == 1
    assert sample(samples, "tubeq_job_releases_total") == 1
    assert sample(samples, "tubeq_job_buries_total") == 1
    assert sample(samples, "tubeq_job_kicks_total") == 1

    # Jobs by tube and state (read from Redis): 4 put, 1 deleted, 1 released, 1 kicked back.
    assert sample(samples, "tubeq_jobs", tube="m", state="ready") == 3
    assert sample(samples, "tubeq_jobs", tube="m", state="reserved") == 0
    assert sample(samples, "tubeq_jobs", tube="m", state="buried") == 0
    assert sample(samples, "tubeq_jobs_urgent", tube="m") == 3
    assert sample(samples, "tubeq_tube_puts_total", tube="m") == 4
    assert sample(samples, "tubeq_tube_deletes_total", tube="m") == 1
    assert sample(samples, "tubeq_tubes") == 2

    # Three reserves from ready, one delete of a reserved job.
    assert sample(samples, "tubeq_job_wait_seconds_count", tube="m") == 3
    assert sample(samples, "tubeq_job_wait_seconds_bucket", tube="m", le="+Inf") == 3
    assert sample(samples, "tubeq_job_run_seconds_count", tube="m") == 1
    assert sample(samples, "tubeq_connections") == 1
    assert sample(samples, "tubeq_connections_opened_total") == 1
    assert sample(samples, "tubeq_namespace_connections") == 1
    assert sample(samples, "tubeq_namespace_servers") == 1
    assert sample(samples, "tubeq_redis_round_trip_seconds_count") > 0
    assert sample(samples, "tubeq_draining") == 0


async def test_timeouts_lateness_and_waiting_reserves(server: Server,
                                                      session: aiohttp.ClientSession) -> None:
    bean = await Beanstalk.open(server.port)
    waiter = await Beanstalk.open(server.port)
    try:
        await bean.ask(b"put 0 0 1 1", b"t")
        reply = await bean.ask(b"reserve-with-timeout 0")
        assert reply.startswith(b"RESERVED")
        await bean.ask(b"put 0 1 60 1", b"d")  # delayed 1 s
        waiter.writer.write(b"watch idle\r\nignore default\r\nreserve\r\n")

        async def settled() -> bool:
            s = await scrape(session, base(server))
            return (sample(s, "tubeq_job_timeouts_total") == 1
                    and sample(s, "tubeq_delayed_lateness_seconds_count") == 1
                    and sample(s, "tubeq_waiting_reserves") == 1)

        await eventually(settled, "the TTR ran out, the delayed job came due, one reserve "
                         "waits")
        samples = await scrape(session, base(server))
        assert sample(samples, "tubeq_namespace_waiting_reserves") == 1
        assert sample(samples, "tubeq_jobs", tube="default", state="ready") == 2
    finally:
        await bean.close()
        await waiter.close()


async def test_tube_labels_are_capped(redis_url: str, session: aiohttp.ClientSession) -> None:
    async with running_server(redis_url, metrics_max_tubes=2) as server:
        bean = await Beanstalk.open(server.port)
        try:
            for tube in (b"a", b"b", b"c"):  # 'default' was created first
                await bean.ask(b"use " + tube)
                for _ in range(2):
                    await bean.ask(b"put 0 0 60 1", b"x")
            await bean.ask(b"watch a")
            await bean.ask(b"watch c")
            await bean.ask(b"reserve-with-timeout 0")  # a's first job
            await bean.ask(b"reserve-with-timeout 0")  # a's second
            await bean.ask(b"ignore a")
            await bean.ask(b"reserve-with-timeout 0")  # c's: past the cap of 2 tubes
            samples = await scrape(session, base(server))
        finally:
            await bean.close()
    tubes = {dict(labels)["tube"] for (name, labels) in samples if name == "tubeq_jobs"}
    assert tubes == {"default", "a", OTHER_TUBE}
    assert sample(samples, "tubeq_jobs", tube=OTHER_TUBE, state="ready") == 3  # b's 2 + c's 1
    assert sample(samples, "tubeq_tubes") == 4
    # The histograms cap on their own: the first two tubes seen, a and c, fill it.
    assert sample(samples, "tubeq_job_wait_seconds_count", tube="a") == 2
    assert sample(samples, "tubeq_job_wait_seconds_count", tube="c") == 1


async def test_http_api_commands_count_too(server: Server,
                                           session: aiohttp.ClientSession) -> None:
    async with session.post(f"{base(server)}/api/tubes/h/jobs", data=b"x") as r:
        assert r.status == 201
    async with session.post(f"{base(server)}/api/tubes/h/reserve") as r:
        job = await r.json()
    async with session.delete(f"{base(server)}/api/jobs/{job['id']}",
                              params={"reservation": job["reservation"]}) as r:
        assert r.status == 200
    async with session.post(f"{base(server)}/api/tubes/h/jobs", data=b"y") as r:
        assert r.status == 201
    async with session.post(f"{base(server)}/api/tubes/h/reserve") as r:
        job = await r.json()
    async with session.post(f"{base(server)}/api/jobs/{job['id']}/bury",
                            params={"reservation": job["reservation"]}) as r:
        assert r.status == 200
    async with session.post(f"{base(server)}/api/tubes/h/kick?bound=5") as r:
        assert await r.json() == {"kicked": 1}
    async with session.post(f"{base(server)}/api/tubes/h/reserve") as r:
        job = await r.json()
    async with session.post(f"{base(server)}/api/jobs/{job['id']}/release",
                            params={"reservation": job["reservation"]}) as r:
        assert r.status == 200
    async with session.post(f"{base(server)}/api/tubes/none/reserve") as r:
        assert r.status == 204
    samples: Samples = await scrape(session, base(server))
    assert sample(samples, "tubeq_commands_total", command="put") == 2
    assert sample(samples, "tubeq_commands_total", command="delete") == 1
    assert sample(samples, "tubeq_command_outcomes_total", command="put",
                  outcome="INSERTED") == 2
    assert sample(samples, "tubeq_command_outcomes_total", command="reserve-with-timeout",
                  outcome="RESERVED") == 3
    assert sample(samples, "tubeq_command_outcomes_total", command="reserve-with-timeout",
                  outcome="TIMED_OUT") == 1
    assert sample(samples, "tubeq_job_buries_total") == 1
    assert sample(samples, "tubeq_job_kicks_total") == 1
    assert sample(samples, "tubeq_job_releases_total") == 1
    assert sample(samples, "tubeq_job_wait_seconds_count", tube="h") == 3
    assert sample(samples, "tubeq_job_run_seconds_count", tube="h") == 1


async def test_redis_errors_and_lost_connections_are_counted(
        tmp_path: Path, session: aiohttp.ClientSession) -> None:
    own = RedisProcess(tmp_path / "redis")  # this test breaks its Redis: one of its own
    own.start()
    try:
        async with running_server(own.url) as server:
            admin = redis.asyncio.Redis.from_url(own.url)
            bean = await Beanstalk.open(server.port)
            try:
                await admin.config_set("maxmemory", "1")  # noeviction: writes fail with OOM
                assert await bean.ask(b"put 0 0 60 1", b"x") == b"INTERNAL_ERROR\r\n"
                await admin.config_set("maxmemory", "0")
                await admin.aclose()
                own.stop()
                own.start()  # same port: tubeq's client reconnects

                async def scraped() -> bool:
                    async with session.get(f"{base(server)}/metrics") as r:
                        return r.status == 200

                await eventually(scraped, "tubeq reconnected to its Redis")
                samples = await scrape(session, base(server))
            finally:
                await bean.close()
    finally:
        own.stop()
    # The put's script, and whatever else wrote meanwhile (counters, the heartbeat).
    assert sample(samples, "tubeq_redis_errors_total", kind="OOM") >= 1
    assert sample(samples, "tubeq_redis_errors_total", kind="connection_lost") >= 1
    assert sample(samples, "tubeq_command_outcomes_total", command="put",
                  outcome="INTERNAL_ERROR") == 1


async def read_replies(reader: asyncio.StreamReader, n: int) -> list[bytes]:
    """``n`` whole replies (a RESERVED one with its body, a BATCH with its items)."""
    out = []
    while len(out) < n:
        line = await reader.readline()
        words = line.split()
        if words[0] == b"RESERVED":
            line += await reader.readexactly(int(words[2]) + 2)
        elif words[0] == b"BATCH":
            line += b"".join(await read_replies(reader, int(words[1])))
        out.append(line)
    return out


async def test_pipelined_replies_are_counted_as_they_are_written(
        redis_url: str, session: aiohttp.ClientSession) -> None:
    """Commands pipelined in one write each count once with their own outcome, whatever went
    to Redis together; deletes pipelined behind a waiting reserve are not timed as slow for
    its wait (their replies wait for the reserve's), whether they passed it or it held them;
    the wait and run histograms count, sum and bucket the jobs they saw."""
    jobs = 20
    async with running_server(redis_url, slow_ms=100) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(b"use p\r\nwatch p\r\nignore default\r\n"
                         + b"put 0 0 60 1\r\nx\r\n" * jobs)
            replies = await read_replies(reader, 3 + jobs)
            assert all(r.startswith(b"INSERTED") for r in replies[3:])
            writer.write(b"reserve-with-timeout 0\r\n" * (jobs - 2) + b"reserve-many 5 0\r\n")
            replies = await read_replies(reader, jobs - 1)
            assert replies[-1].startswith(b"BATCH 2\r\n")
            ids = [int(r.split()[1]) for r in replies[:-1]]
            ids += [int(line.split()[1]) for line in replies[-1].split(b"\r\n")
                    if line.startswith(b"RESERVED")]
            writer.write(b"".join(b"delete %d\r\n" % i for i in ids) + b"delete 999999\r\n")
            replies = await read_replies(reader, jobs + 1)
            assert replies == [b"DELETED\r\n"] * jobs + [b"NOT_FOUND\r\n"]
            # A reserve that waits 1 s on an empty tube, and pipelined behind it a delete that
            # passes it (its own job) and one that it holds; both replies wait for its.
            writer.write(b"put 0 0 60 1\r\nx\r\nreserve-with-timeout 0\r\n")
            held = int((await read_replies(reader, 2))[1].split()[1])
            writer.write(b"reserve-with-timeout 1\r\ndelete %d\r\ndelete 999999\r\n" % held)
            assert await read_replies(reader, 3) == [b"TIMED_OUT\r\n", b"DELETED\r\n",
                                                     b"NOT_FOUND\r\n"]
            samples = await scrape(session, base(server))
        finally:
            writer.close()
            await writer.wait_closed()

    def outcome(name: str, word: str) -> float:
        return sample(samples, "tubeq_command_outcomes_total", command=name, outcome=word)

    assert outcome("use", "USING") == 1 and outcome("watch", "WATCHING") == 1
    assert outcome("put", "INSERTED") == jobs + 1
    assert outcome("reserve-with-timeout", "RESERVED") == jobs - 1
    assert outcome("reserve-with-timeout", "TIMED_OUT") == 1
    assert outcome("reserve-many", "BATCH") == 1
    assert outcome("delete", "DELETED") == jobs + 1 and outcome("delete", "NOT_FOUND") == 2
    assert sample(samples, "tubeq_slow_commands_total") == 0
    for family in ("tubeq_job_wait_seconds", "tubeq_job_run_seconds"):
        count = sample(samples, f"{family}_count", tube="p")
        assert count == jobs + 1
        assert sample(samples, f"{family}_bucket", tube="p", le="+Inf") == jobs + 1
        assert 0 <= sample(samples, f"{family}_sum", tube="p") < 60
        buckets = [v for (name, labels), v in samples.items()
                   if name == f"{family}_bucket" and dict(labels).get("tube") == "p"]
        assert len(buckets) == 17 and max(buckets) == jobs + 1
