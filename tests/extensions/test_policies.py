"""put-with, peek-key and the job policies' extra stats keys: the parser byte by byte, then a
real tubeq on a real Redis (exact reply bytes), then one real-time run of each time-driven
policy through the server with short durations."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

from tests.protocol.test_protocol import BAD, UNKNOWN, cases, check, line
from tests.support.servers import ServerProcess, TubeqCluster, unique_prefix
from tests.support.wire import Wire
from tubeq.protocol import replies
from tubeq.protocol.commands import (
    PeekKey,
    PutExpectedCrlf,
    PutTooBig,
    PutWith,
    Rejected,
    Stats,
    StatsTube,
)

BAD_OPTION_DELAY_MS = Rejected(reply=b"BAD_OPTION delay-ms\r\n")


def bad_option(name: str) -> Rejected:
    return Rejected(reply=replies.bad_option(name))


# -- the parser ----------------------------------------------------------------------------------


@cases(
    (line(b"put-with 1 2 3 5") + line(b"hello"), [PutWith(1, 2, 3, b"hello", ())]),
    (line(b"put-with 0 0 1 2 key=a:b max-tries=3 delay-ms=250") + line(b"hi"),
     [PutWith(0, 0, 1, b"hi", (("delay-ms", 250), ("max-tries", 3), ("key", "a:b")))]),
    (line(b"put-with 0 0 1 0  ttl-ms=9   on-expire=delete") + line(b""),
     [PutWith(0, 0, 1, b"", (("ttl-ms", 9), ("on-expire", "delete")))]),
    (line(b"put-with 0 0 1 2 backoff-ms=100 backoff-max-ms=1000") + line(b"hi"),
     [PutWith(0, 0, 1, b"hi", (("backoff-ms", 100), ("backoff-max-ms", 1000)))]),
    (line(b"put-with 0 0 1 2 delay-ms=0") + line(b"hi"),
     [PutWith(0, 0, 1, b"hi", (("delay-ms", 0),))]),
    # Refused options: the body is read all the same, never taken for commands.
    (line(b"put-with 0 5 1 2 delay-ms=250") + line(b"hi"), [BAD_OPTION_DELAY_MS]),
    (line(b"put-with 0 0 1 5 colour=red") + line(b"stats"), [bad_option("colour")]),
    (line(b"put-with 0 0 1 2 rate=1") + line(b"hi"), [bad_option("rate")]),  # a tube's
    (line(b"put-with 0 0 1 2 max-tries=1 max-tries=2") + line(b"hi"), [bad_option("max-tries")]),
    (line(b"put-with 0 0 1 2 ttl-ms=-1") + line(b"hi"), [bad_option("ttl-ms")]),
    (line(b"put-with 0 0 1 2 on-expire=keep") + line(b"hi"), [bad_option("on-expire")]),
    (line(b"put-with 0 0 1 2 key=a=b") + line(b"hi"), [bad_option("key")]),
    (line(b"put-with 0 0 1 2 delay-ms=4294967295001") + line(b"hi"), [bad_option("delay-ms")]),
    (line(b"put-with 0 0 1 2 max-tries") + line(b"hi"), [BAD]),
    (line(b"put-with 0 0 1 2 max-tries=1 ") + line(b"hi"), [BAD]),
    (line(b"put-with 0 0 1 2x") + line(b"hi"), [BAD]),
    (line(b"put-with 0 0 1 5 delay-ms=1x") + line(b"stats"), [bad_option("delay-ms")]),
    # The four numbers themselves: no size, nothing to read (the next line is a command).
    (line(b"put-with 0 0 1") + line(b"stats"), [BAD, Stats()]),
    (line(b"put-with 0 0 1 4294967296") + line(b"peek-key k"), [BAD, PeekKey("k")]),
    (line(b"put-with -1 0 1 2") + line(b"peek-key k"), [BAD, PeekKey("k")]),
    (line(b"put-with") + line(b"peek-key k"), [UNKNOWN, PeekKey("k")]),  # as "put"
    # The body as put's: EXPECTED_CRLF after exactly size+2 bytes.
    (line(b"put-with 0 0 1 3 max-tries=1") + line(b"abcde"), [PutExpectedCrlf(), UNKNOWN]),
    (line(b"put-with 0 0 1 3") + b"abcxx" + line(b"stats-tube a"),
     [PutExpectedCrlf(), StatsTube("a")]),
)
def test_put_with(data: bytes, expected: list[object]) -> None:
    check(data, expected)  # type: ignore[arg-type]


@cases(
    (line(b"put-with 0 0 1 11 key=k") + line(b"0123456789a"), [PutTooBig()]),
    (line(b"put-with 0 0 1 11 colour=red") + line(b"0123456789a"), [PutTooBig()]),
    (line(b"put-with 0 0 1 10 key=k") + line(b"0123456789"),
     [PutWith(0, 0, 1, b"0123456789", (("key", "k"),))]),
)
def test_put_with_job_too_big_wins_as_for_put(data: bytes, expected: list[object]) -> None:
    check(data, expected, max_job_size=10)  # type: ignore[arg-type]


def test_put_with_may_carry_a_long_line() -> None:
    key = b"k" * 200
    opts = b" key=" + key + b" max-tries=1 backoff-ms=1 backoff-max-ms=2 ttl-ms=3 on-expire=bury"
    data = line(b"put-with 4294967295 0 4294967295 1" + opts) + line(b"x")
    assert len(data) > 224
    check(data, [PutWith(2**32 - 1, 0, 2**32 - 1, b"x", (
        ("max-tries", 1), ("backoff-ms", 1), ("backoff-max-ms", 2), ("ttl-ms", 3),
        ("on-expire", "bury"), ("key", key.decode())))])


@cases(
    (line(b"peek-key order:42"), [PeekKey("order:42")]),
    (line(b"peek-key " + b"k" * 200), [PeekKey("k" * 200)]),
    (line(b"peek-key " + b"k" * 201), [BAD]),
    (line(b"peek-key "), [BAD]),
    (line(b"peek-key a b"), [BAD]),
    (line(b"peek-key a=b"), [BAD]),
    (line(b"peek-key caf\xc3\xa9"), [BAD]),
)
def test_peek_key(data: bytes, expected: list[object]) -> None:
    check(data, expected)  # type: ignore[arg-type]


# -- through the server --------------------------------------------------------------------------


def inserted_id(reply: bytes) -> int:
    assert reply.startswith(b"INSERTED "), reply
    return int(reply.split()[1])


def test_put_with_counts_total_jobs_before_a_pipelined_stats_tube(server: ServerProcess) -> None:
    # One write: stats-tube flushes this process's counts before it reads, so a job whose put
    # went out before it is in total-jobs, as for a plain put.
    for put in (b"put 0 0 60 2\r\nhi\r\n", b"put-with 0 0 60 2 max-tries=3\r\nhi\r\n"):
        tube = "pw-count-" + put.split()[0].decode()
        with Wire(server.host, server.port) as w:
            w.send(b"use " + tube.encode() + b"\r\n" + put + b"stats-tube " + tube.encode()
                   + b"\r\n")
            assert w.reply() == b"USING " + tube.encode() + b"\r\n"
            inserted_id(w.reply())
            doc = w.yaml(b"")
            assert (put.split()[0], doc["current-jobs-ready"], doc["total-jobs"]) == (
                put.split()[0], "1", "1")


def test_put_with_inserts_and_a_duplicate_key_answers_the_living_job(
        server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use pw-dedupe")
        job_id = inserted_id(w.ask(b"put-with 5 0 60 5 key=order:42\r\nhello\r\n"))
        assert w.ask(b"put-with 1 0 60 3 key=order:42 ttl-ms=5\r\nbye\r\n") == (
            b"DUPLICATE %d\r\n" % job_id)
        assert w.ask("peek-key order:42") == b"FOUND %d 5\r\nhello\r\n" % job_id
        assert w.ask("peek-key order:43") == b"NOT_FOUND\r\n"
        doc = w.yaml("stats-tube pw-dedupe")
        assert (doc["current-jobs-ready"], doc["total-jobs"]) == ("1", "1")
        keys = list(doc)
        at = keys.index("total-expired")  # after the settings, before the admin figures
        assert keys[at:at + 3] == ["total-expired", "total-dead-lettered", "total-deduplicated"]
        assert (doc["total-expired"], doc["total-dead-lettered"],
                doc["total-deduplicated"]) == ("0", "0", "1")
        assert w.ask(f"delete {job_id}") == b"DELETED\r\n"
        assert w.ask("peek-key order:42") == b"NOT_FOUND\r\n"
        again = inserted_id(w.ask(b"put-with 5 0 60 5 key=order:42\r\nagain\r\n"))
        assert again > job_id
        assert w.ask(f"delete {again}") == b"DELETED\r\n"


def test_stats_job_shows_the_policy_keys_at_the_end_to_a_tubeq_client_only(
        server: ServerProcess) -> None:
    with Wire(server.host, server.port) as plain, Wire(server.host, server.port) as ext:
        ext.ask("use pw-stats")
        job_id = inserted_id(ext.ask(
            b'put-with 0 0 60 1 max-tries=4 ttl-ms=600000 key=#a"b\\c\r\nx\r\n'))
        doc = ext.yaml(f"stats-job {job_id}")
        assert list(doc)[:14] == [
            "id", "tube", "state", "pri", "age", "delay", "ttr", "time-left", "file",
            "reserves", "timeouts", "releases", "buries", "kicks"]
        assert list(doc)[14:] == ["reason", "tries", "max-tries", "expires-at-ms", "key",
                                  "failures", "error", "progress-reports", "parents-pending"]
        assert (doc["reason"], doc["tries"], doc["max-tries"]) == ('""', "0", "4")
        assert int(doc["expires-at-ms"]) > 0
        assert doc["key"] == '"#a\\"b\\\\c"'  # a YAML double-quoted string
        assert list(plain.yaml(f"stats-job {job_id}"))[-1] == "kicks"
        assert ext.ask("stats-job 999999") == b"NOT_FOUND\r\n"
        assert ext.ask(f"delete {job_id}") == b"DELETED\r\n"


@pytest.mark.parametrize(("data", "reply"), [
    (b"put-with 0 1 60 1 delay-ms=1\r\nx\r\n", b"BAD_OPTION delay-ms\r\n"),
    (b"put-with 0 0 60 1 colour=red\r\nx\r\n", b"BAD_OPTION colour\r\n"),
    (b"put-with 0 0 60 1 concurrency=2\r\nx\r\n", b"BAD_OPTION concurrency\r\n"),
    (b"put-with 0 0 60 1 key=\r\nx\r\n", b"BAD_OPTION key\r\n"),
    (b"put-with 0 0 60 1 max-tries=4294967296\r\nx\r\n", b"BAD_OPTION max-tries\r\n"),
    (b"put-with 0 0 60 1 ttl-ms\r\nx\r\n", b"BAD_FORMAT\r\n"),
    (b"put-with 0 0 60 1 ttl-ms=1 \r\nx\r\n", b"BAD_FORMAT\r\n"),
    (b"put-with 0 0 60\r\n", b"BAD_FORMAT\r\n"),
    (b"put-with 0 0 60 3 key=a\r\nxxxxx", b"EXPECTED_CRLF\r\n"),
    (b"put-with 0 0 60 70000 key=a\r\n" + b"x" * 70000 + b"\r\n", b"JOB_TOO_BIG\r\n"),
    (b"peek-key a b\r\n", b"BAD_FORMAT\r\n"),
    (b"peek-key\r\n", b"UNKNOWN_COMMAND\r\n"),  # as beanstalkd: the word needs its argument
])
def test_refused_put_with_stores_nothing_and_keeps_serving(
        server: ServerProcess, data: bytes, reply: bytes) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use pw-refused")
        assert w.ask(data) == reply
        assert w.ask("peek-ready") == b"NOT_FOUND\r\n"
        assert w.ask("peek-key a") == b"NOT_FOUND\r\n"
        assert w.ask("list-tube-used") == b"USING pw-refused\r\n"


def test_delay_ms_and_ttl_ms_run_on_time_through_the_server(server: ServerProcess) -> None:
    """Real time, short durations: a 200 ms delay, a 300 ms TTL (deleted, and buried), and
    max-tries reached through a 1 s TTR. Nothing is asserted about how long it took."""
    with Wire(server.host, server.port) as w:
        w.ask("use pw-live")
        w.ask("watch pw-live")
        w.ask("ignore default")
        delayed = inserted_id(w.ask(b"put-with 0 0 60 1 delay-ms=200\r\nd\r\n"))
        assert w.ask("reserve-with-timeout 2") == b"RESERVED %d 1\r\nd\r\n" % delayed
        assert w.ask(f"delete {delayed}") == b"DELETED\r\n"

        gone = inserted_id(w.ask(b"put-with 0 0 60 1 ttl-ms=300 on-expire=delete key=live\r\n"
                                 b"g\r\n"))
        kept = inserted_id(w.ask(b"put-with 0 0 60 1 ttl-ms=300\r\nk\r\n"))
        eventually(lambda: w.ask(f"peek {gone}") == b"NOT_FOUND\r\n", "TTL deleted the job")
        eventually(lambda: w.yaml(f"stats-job {kept}")["state"] == "buried", "TTL buried it")
        assert w.yaml(f"stats-job {kept}")["reason"] == "expired"
        assert w.ask("peek-key live") == b"NOT_FOUND\r\n"

        dead = inserted_id(w.ask(b"put-with 0 0 1 1 max-tries=1\r\nm\r\n"))
        assert w.ask("reserve-with-timeout 2") == b"RESERVED %d 1\r\nm\r\n" % dead
        eventually(lambda: w.yaml(f"stats-job {dead}")["state"] == "buried", "dead-lettered")
        doc = w.yaml(f"stats-job {dead}")
        assert (doc["reason"], doc["tries"], doc["timeouts"]) == ("max-tries", "1", "1")
        tube = w.yaml("stats-tube pw-live")
        assert (tube["total-expired"], tube["total-dead-lettered"]) == ("2", "1")

        # A TTR timeout with a backoff: delayed, then delivered again.
        retried = inserted_id(w.ask(b"put-with 0 0 1 1 backoff-ms=300\r\nr\r\n"))
        assert w.ask("reserve-with-timeout 2") == b"RESERVED %d 1\r\nr\r\n" % retried
        eventually(lambda: w.yaml(f"stats-job {retried}")["state"] == "delayed", "backed off")
        assert w.ask("reserve-with-timeout 3") == b"RESERVED %d 1\r\nr\r\n" % retried
        doc = w.yaml(f"stats-job {retried}")
        assert (doc["tries"], doc["timeouts"], doc["reserves"]) == ("1", "1", "2")
        assert w.ask(f"delete {retried}") == b"DELETED\r\n"

        # A connection that goes away with the job ends a try too (backoff, then delivered).
        with Wire(server.host, server.port) as worker:
            worker.ask("watch pw-live")
            worker.ask("ignore default")
            crashed = inserted_id(w.ask(b"put-with 0 0 60 1 backoff-ms=200\r\nc\r\n"))
            assert worker.ask("reserve-with-timeout 2") == b"RESERVED %d 1\r\nc\r\n" % crashed
        assert w.ask("reserve-with-timeout 3") == b"RESERVED %d 1\r\nc\r\n" % crashed
        assert w.yaml(f"stats-job {crashed}")["tries"] == "1"
        assert w.ask(f"delete {crashed}") == b"DELETED\r\n"


def test_two_processes_racing_the_same_key_insert_once(tubeq_cluster: TubeqCluster) -> None:
    first = tubeq_cluster.start(label="tubeq-race-a")
    second = tubeq_cluster.start(prefix=first.extra["prefix"], label="tubeq-race-b")
    try:
        with Wire(first.host, first.port) as a, Wire(second.host, second.port) as b:
            burst = b"".join(b"put-with 0 0 60 1 key=race\r\nx\r\n" for _ in range(50))
            a.send(burst)
            b.send(burst)
            got = [a.reply() for _ in range(50)] + [b.reply() for _ in range(50)]
            inserted = [r for r in got if r.startswith(b"INSERTED")]
            assert len(inserted) == 1
            job_id = inserted_id(inserted[0])
            assert sorted(set(got)) == sorted({inserted[0], b"DUPLICATE %d\r\n" % job_id})
            assert a.yaml("stats-tube default")["current-jobs-ready"] == "1"
            assert b.yaml("stats-tube default")["total-deduplicated"] == "99"
    finally:
        second.stop()
        first.stop()


def eventually(ok: Callable[[], bool], what: str, within_s: float = 10.0) -> None:
    """Poll ``ok`` until it holds; fail (naming ``what``) if it never does within the bound."""
    deadline = time.monotonic() + within_s
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def test_a_draining_server_refuses_put_with_as_put(
        tubeq_factory: Callable[[str], ServerProcess]) -> None:
    server = tubeq_factory(unique_prefix("pw-drain"))
    with Wire(server.host, server.port) as w:
        first = inserted_id(w.ask(b"put-with 0 0 60 1 key=drain\r\nx\r\n"))
        os.kill(server.pid, signal.SIGUSR1)
        eventually(lambda: w.yaml("stats")["draining"] == "true", "the server drains")
        assert w.ask(b"put-with 0 0 60 1 key=other\r\nx\r\n") == b"DRAINING\r\n"
        assert w.ask(b"put-with 0 0 60 1 key=drain\r\nx\r\n") == b"DRAINING\r\n"
        assert w.ask("peek-key other") == b"NOT_FOUND\r\n"
        assert w.ask(b"put 0 0 60 1\r\nx\r\n") == b"DRAINING\r\n"
        assert w.ask("peek-key drain") == b"FOUND %d 1\r\nx\r\n" % first
