"""tube-set max-jobs (issue 12 part 8, per-tube cap on stored jobs) and the tube's settings on
every way a job is made (put, put-with, put-many), against a real tubeq on a real Redis."""

from __future__ import annotations

import redis

from tests.support.servers import ServerProcess
from tests.support.wire import Wire
from tubeq.store.keys import Keys


def test_a_full_tube_answers_out_of_memory_and_stores_nothing(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        assert w.ask("tube-set capped max-jobs=2") == b"SET\r\n"
        assert w.ask("use capped") == b"USING capped\r\n"
        first = w.ask(b"put 0 0 60 1\r\na\r\n")
        assert first.startswith(b"INSERTED ")
        assert w.ask(b"put 0 60 60 1\r\nb\r\n").startswith(b"INSERTED ")  # delayed counts too
        assert w.ask(b"put 0 0 60 1\r\nc\r\n") == b"OUT_OF_MEMORY\r\n"
        assert w.ask(b"put-with 0 0 60 1 key=k\r\nd\r\n") == b"OUT_OF_MEMORY\r\n"
        doc = w.yaml("stats-tube capped")
        assert (doc["total-jobs"], doc["current-jobs-ready"], doc["max-jobs"]) == ("2", "1", "2")
        # A reserved job still counts; a deleted one frees its place.
        assert w.ask("watch capped").startswith(b"WATCHING")
        reserved = w.ask("reserve-with-timeout 0")
        assert reserved.startswith(b"RESERVED ")
        assert w.ask(b"put 0 0 60 1\r\ne\r\n") == b"OUT_OF_MEMORY\r\n"
        assert w.ask(f"delete {reserved.split()[1].decode()}") == b"DELETED\r\n"
        assert w.ask(b"put 0 0 60 1\r\nf\r\n").startswith(b"INSERTED ")
        # put-many: each entry is judged as it comes.
        assert w.ask("tube-set capped max-jobs=3") == b"SET\r\n"
        assert w.ask(b"put-many 2\r\n0 0 60 1\r\ng\r\n0 0 60 1\r\nh\r\n") == b"BATCH 2\r\n"
        assert w.reply().startswith(b"INSERTED ")
        assert w.reply() == b"OUT_OF_MEMORY\r\n"
        assert w.yaml("stats-tube capped")["total-jobs"] == "4"  # a, b, f, g: refusals uncounted
        assert w.ask("tube-set capped max-jobs=0") == b"SET\r\n"  # no cap again
        assert w.ask(b"put 0 0 60 1\r\ni\r\n").startswith(b"INSERTED ")


def test_a_tube_ttl_applies_to_put_many_jobs(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        assert w.ask("tube-set ttl-many ttl-ms=60000") == b"SET\r\n"
        assert w.ask("use ttl-many") == b"USING ttl-many\r\n"
        assert w.ask(b"put-many 2\r\n0 0 60 1\r\na\r\n0 5 60 1\r\nb\r\n") == b"BATCH 2\r\n"
        ids = [int(w.reply().split()[1]) for _ in range(2)]
    keys = Keys(server.extra["prefix"])
    client = redis.Redis.from_url(server.extra["redis_url"])
    try:
        expiries = [client.hget(keys.job(i), "x") for i in ids]
        created = [client.hget(keys.job(i), "c") for i in ids]
    finally:
        client.close()
    assert all(x is not None and int(x) == int(c) + 60000
               for x, c in zip(expiries, created, strict=True))
