"""One client cannot make Redis slow for the others: whole-namespace commands (stats, the
--max-jobs count, list-tubes, a long kick) never hold Redis for O(tubes) or O(jobs) in one call
(tubeq.store: counts kept as jobs move, pages, chunks), so another client's put is answered
while one connection pipelines them, even with a short --redis-timeout (issue 35: with 20,000
tubes one stats held Redis for 240-330 ms, and 20 pipelined ones made another client's put
answer INTERNAL_ERROR).

Against a real tubeq and its private Redis. The assertions are outcomes (every put INSERTED,
the figures right), with a Redis timeout short enough that one call walking the tubes fails
them, and how many reads a storm of stats costs Redis (the spacing of whole-namespace reads,
counted by MONITOR); how long the calls take is bench's business
(bench/probes/namespace_reads.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import redis

from tests.support.servers import TubeqCluster
from tests.support.wire import Wire
from tubeq.redisio.client import RedisClient
from tubeq.server.ops import NAMESPACE_READ_SPACING_S
from tubeq.store.keys import Keys
from tubeq.store.store import Store

TUBES = 20_000
STORM = 20  # stats pipelined at once, as in the repro
PUT_EVERY_S = 0.02
STORM_BOUND_S = 30.0  # the whole storm is answered within this, or the test fails


async def _fill(redis_url: str, prefix: str) -> None:
    """TUBES tubes with one ready job each, written by a Store of the server's namespace (as
    TUBES clients doing `use` + `put` would; pipelined here to be quick)."""
    client = await RedisClient.connect(redis_url)
    try:
        store = Store(client, Keys(prefix), "filler")
        await store.load_scripts()
        for start in range(0, TUBES, 2_000):
            await asyncio.gather(*(store.put(f"card{i:05d}", 2000, 0, 60, b"x")
                                   for i in range(start, start + 2_000)))
    finally:
        await client.close()


def test_a_stats_storm_over_many_tubes_fails_no_other_clients_put(
        tubeq_cluster: TubeqCluster) -> None:
    prefix = f"storm-{time.monotonic_ns()}"
    server = tubeq_cluster.start(prefix=prefix, label="tubeq-storm",
                                 flags=("--redis-timeout", "0.25"))
    try:
        asyncio.run(_fill(tubeq_cluster.redis.url, prefix))
        storm_replies: list[bytes] = []

        def storm() -> None:
            with Wire(server.host, server.port) as w:
                w.send(b"stats\r\n" * STORM + b"list-tubes\r\n" * 3 + b"kick 100000\r\n")
                for _ in range(STORM + 4):
                    storm_replies.append(w.reply())

        with Wire(server.host, server.port) as producer:
            assert producer.ask("use steady") == b"USING steady\r\n"
            stormer = threading.Thread(target=storm)
            stormer.start()
            answers = []
            deadline = time.monotonic() + STORM_BOUND_S
            while stormer.is_alive() and time.monotonic() < deadline:
                answers.append(producer.ask(b"put 0 0 60 1\r\ny\r\n"))
                time.sleep(PUT_EVERY_S)
            stormer.join(STORM_BOUND_S)
            assert not stormer.is_alive(), "the storm was not answered in time"
            answers.append(producer.ask(b"put 0 0 60 1\r\ny\r\n"))
            assert all(a.startswith(b"INSERTED ") for a in answers), [
                a for a in answers if not a.startswith(b"INSERTED ")]
            # The storm itself was answered whole and right.
            assert len(storm_replies) == STORM + 4
            assert all(r.startswith(b"OK ") for r in storm_replies[:STORM + 3])
            assert storm_replies[-1] == b"KICKED 0\r\n"  # 'default' has nothing to kick
            tubes = storm_replies[STORM].split(b"\r\n", 1)[1]
            assert tubes.count(b"\n- ") + tubes.startswith(b"---\n- ") >= TUBES
            stats = producer.yaml("stats")
            assert int(stats["current-jobs-ready"]) == TUBES + len(answers)
            assert int(stats["current-jobs-urgent"]) == len(answers)  # pri 0; the cards 2000
            assert int(stats["current-tubes"]) == TUBES + 2  # the cards, steady, default
    finally:
        server.stop()


STORMERS = 4  # connections that pipeline stats at once, each without pause
STORM_ROUNDS = 40  # rounds of STORM stats per stormer


def test_stats_asked_without_pause_are_read_at_a_bounded_pace(
        tubeq_cluster: TubeqCluster) -> None:
    """However fast clients ask for stats, this process reads the namespace's counts no more
    often than once per NAMESPACE_READ_SPACING_S (tubeq.server.ops): four connections that
    each pipeline 20 stats a round, a round as soon as the last was answered, cost Redis at
    most one read per spacing of their storm's time (unspaced: one per round, 94 reads in 62
    ms), and every stats is answered, with counts read after it was asked."""
    prefix = f"paced-{time.monotonic_ns()}"
    marker = f"{prefix}-end"
    server = tubeq_cluster.start(prefix=prefix, label="tubeq-paced")
    monitor = redis.Redis.from_url(tubeq_cluster.redis.url)
    other = redis.Redis.from_url(tubeq_cluster.redis.url)
    reads: list[str] = []
    watching = threading.Event()

    def count_reads() -> None:
        """Every stats read of this namespace MONITOR shows, up to the marker (sent last)."""
        with monitor.monitor() as m:
            watching.set()
            while True:
                command = m.next_command()["command"]
                if marker in command:
                    return
                if "_stats " in command and prefix in command:
                    reads.append(command)

    def storm(answers: list[bytes]) -> None:
        with Wire(server.host, server.port) as w:
            for _ in range(STORM_ROUNDS):
                w.send(b"stats\r\n" * STORM)
                answers.extend(w.reply() for _ in range(STORM))

    counter = threading.Thread(target=count_reads, daemon=True)
    try:
        with Wire(server.host, server.port) as w:
            assert w.ask(b"put 0 0 60 1\r\ny\r\n").startswith(b"INSERTED ")
        counter.start()
        assert watching.wait(10)
        answers: list[list[bytes]] = [[] for _ in range(STORMERS)]
        stormers = [threading.Thread(target=storm, args=(a,)) for a in answers]
        began = time.monotonic()
        for t in stormers:
            t.start()
        for t in stormers:
            t.join(STORM_BOUND_S)
        took = time.monotonic() - began
        assert not any(t.is_alive() for t in stormers), "the storm was not answered in time"
        with Wire(server.host, server.port) as w:
            stats = w.yaml("stats")
        other.echo(marker)  # after every read of the storm and of that last stats
        counter.join(STORM_BOUND_S)
        assert not counter.is_alive(), "MONITOR never showed the marker"
        assert all(len(a) == STORM * STORM_ROUNDS for a in answers)
        assert all(r.startswith(b"OK ") and b"current-jobs-ready: 1\n" in r
                   for a in answers for r in a)
        assert stats["current-jobs-ready"] == "1"
        # One read per spacing of the storm's time, the first at once, and the last stats's.
        assert 0 < len(reads) <= took / NAMESPACE_READ_SPACING_S + 2, (len(reads), took)
    finally:
        with contextlib.suppress(redis.RedisError):
            other.echo(marker)  # lets the counter end on every path
        if counter.is_alive():
            counter.join(10)
        monitor.close()
        other.close()
        server.stop()
