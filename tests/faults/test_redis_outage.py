"""While Redis is down every command that needs it answers INTERNAL_ERROR at once (never a success
for a write that did not happen), and tubeq recovers by itself when Redis comes back.

The Redis here is a private one with an append-only file fsynced on every write (appendfsync
always): killed with SIGKILL and started again on the same port, it has every job it
acknowledged.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.server.test_multiprocess import LineClient
from tests.support.servers import start_tubeq, unique_prefix
from tubeq.redisio.process import RedisProcess

RECOVERY_BOUND_S = 20.0  # bound on the wait for tubeq to serve again, never asserted as a time


def test_commands_fail_fast_while_redis_is_down_and_recover_after(tmp_path: Path) -> None:
    redis = RedisProcess(tmp_path / "redis", persistent=True, appendfsync="always")
    redis.start()
    server = start_tubeq(redis.url, unique_prefix(), tmp_path / "logs")
    try:
        client = LineClient(server)
        kept = client.put(b"acknowledged before the outage")

        assert redis.proc is not None
        redis.proc.kill()
        redis.proc.wait()

        for command in ("put 0 0 60 4\r\nlost", "reserve-with-timeout 0", f"delete {kept}",
                        f"peek {kept}", "stats-tube default", "kick 10", "stats"):
            assert client.call(command).head == b"INTERNAL_ERROR", command
        assert client.call("list-tube-used").head == b"USING default"  # needs no Redis

        redis.start()  # same port, same append-only file
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while (reply := client.call(f"peek {kept}")).head == b"INTERNAL_ERROR":
            assert time.monotonic() < deadline, "tubeq did not recover"
            time.sleep(0.1)
        assert reply.head == f"FOUND {kept} 30".encode() and reply.data == (
            b"acknowledged before the outage"), reply
        after = client.put(b"after")
        assert after > kept
        worker = LineClient(server)
        for job_id in (kept, after):
            reserved = worker.call("reserve-with-timeout 5")
            assert reserved.words[:2] == [b"RESERVED", str(job_id).encode()], reserved
        client.close()
        worker.close()
    finally:
        server.stop()
        redis.stop()


def test_a_watch_redis_did_not_take_is_sent_again(tmp_path: Path) -> None:
    """A watch (or ignore) that answered INTERNAL_ERROR changed nothing: the watch list is as
    it was, and the same command sent after Redis is back reaches Redis and takes effect."""
    redis = RedisProcess(tmp_path / "redis", persistent=True, appendfsync="always")
    redis.start()
    server = start_tubeq(redis.url, unique_prefix(), tmp_path / "logs")
    try:
        worker = LineClient(server)
        assert redis.proc is not None
        redis.proc.kill()
        redis.proc.wait()
        assert worker.call("watch later").head == b"INTERNAL_ERROR"
        assert worker.call("list-tubes-watched").data == b"---\n- default\n"
        redis.start()
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while (reply := worker.call("watch later")).head == b"INTERNAL_ERROR":
            assert time.monotonic() < deadline, "tubeq did not recover"
            time.sleep(0.1)
        assert reply.head == b"WATCHING 2", reply
        assert worker.call("ignore default").head == b"WATCHING 1"
        producer = LineClient(server)
        assert producer.call("use later").head == b"USING later"
        job_id = producer.put(b"for the watch")
        reserved = worker.call("reserve-with-timeout 5")
        assert reserved.words[:2] == [b"RESERVED", str(job_id).encode()], reserved
        worker.close()
        producer.close()
    finally:
        server.stop()
        redis.stop()


# A stalled Redis: the reply bounds protocol.md gives ("Redis stalls").
RESERVE_ONE_BOUND_S = 1.5  # reserve-with-timeout 1: its timeout plus RESERVE_GRACE_S and slack
# The --redis-timeout this test runs with: longer than the reserve's own bound, so the reserve
# shows that bound (TIMED_OUT) rather than the connection's (INTERNAL_ERROR, also within 1.5 s).
REDIS_TIMEOUT_S = 3.0
OTHER_BOUND_S = REDIS_TIMEOUT_S * 1.25 + 1.0  # detection within a quarter of it, plus slack
STALL_S = 5.0


def test_a_stalled_redis_holds_no_reply_past_its_bound(tmp_path: Path) -> None:
    """Redis frozen (SIGSTOP) for 5 s: a reserve-with-timeout 1 sent into the stall answers
    TIMED_OUT within 1.5 s, a put answers INTERNAL_ERROR within the --redis-timeout bound, and
    after the thaw every acknowledged job is delivered to the connections that were open
    before the stall. (The reserve's try may still run when Redis thaws: the job it took then
    comes back by its TTR, 2 s here.)"""
    redis = RedisProcess(tmp_path / "redis")
    redis.start()
    server = start_tubeq(redis.url, unique_prefix(), tmp_path / "logs",
                         flags=("--redis-timeout", str(REDIS_TIMEOUT_S)))
    assert redis.proc is not None
    try:
        producer, worker = LineClient(server), LineClient(server)
        kept = set()
        for n in range(3):
            reply = producer.call(f"put 0 0 2 6\r\nkept {n}")
            assert reply.head.startswith(b"INSERTED"), reply
            kept.add(int(reply.words[1]))
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(0.5)
            started = time.monotonic()
            worker.sock.settimeout(RESERVE_ONE_BOUND_S)
            assert worker.call("reserve-with-timeout 1").head == b"TIMED_OUT"
            assert time.monotonic() - started < RESERVE_ONE_BOUND_S
            producer.sock.settimeout(OTHER_BOUND_S)
            put = producer.call("put 0 0 2 4\r\nmay!")  # it may or may not have run
            assert put.head == b"INTERNAL_ERROR", put
            assert producer.call("list-tube-used").head == b"USING default"  # needs no Redis
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        worker.sock.settimeout(RECOVERY_BOUND_S)
        producer.sock.settimeout(RECOVERY_BOUND_S)
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while producer.call("stats-tube default").head == b"INTERNAL_ERROR":
            assert time.monotonic() < deadline, "tubeq did not recover"
            time.sleep(0.1)
        got: dict[int, bytes] = {}
        while not kept <= got.keys():
            reserved = worker.call("reserve-with-timeout 5")
            assert reserved.head.startswith(b"RESERVED"), (reserved, kept - got.keys())
            got[int(reserved.words[1])] = reserved.data or b""
            assert worker.call(f"delete {reserved.words[1].decode()}").head == b"DELETED"
        assert set(got.values()) <= {b"kept 0", b"kept 1", b"kept 2", b"may!"}, got
        producer.close()
        worker.close()
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        server.stop()
        redis.stop()


def test_a_connection_closed_while_redis_is_down_is_cleaned_up_after(tmp_path: Path) -> None:
    """Its disconnect clean-up fails while Redis is away and is sent again until Redis takes
    it: the connection is not left watching (nor counted) for the life of the process."""
    redis = RedisProcess(tmp_path / "redis", persistent=True, appendfsync="always")
    redis.start()
    server = start_tubeq(redis.url, unique_prefix(), tmp_path / "logs")
    try:
        leaving = LineClient(server)
        assert leaving.call("watch gone-while-down").head == b"WATCHING 2"
        assert redis.proc is not None
        redis.proc.kill()
        redis.proc.wait()
        leaving.close()
        time.sleep(0.5)  # its clean-up is tried, and fails
        redis.start()
        observer = LineClient(server)
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while True:
            reply = observer.call("stats-tube gone-while-down")
            if reply.head == b"NOT_FOUND":  # its last watcher gone: the tube went with it
                break
            assert time.monotonic() < deadline, reply
            time.sleep(0.2)
        observer.close()
    finally:
        server.stop()
        redis.stop()
