"""While Redis is down every command that needs it answers INTERNAL_ERROR at once (never a success
for a write that did not happen), and tubeq recovers by itself when Redis comes back.

The Redis here is a private one with an append-only file fsynced on every write (appendfsync
always): killed with SIGKILL and started again on the same port, it has every job it
acknowledged.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.servers import start_tubeq, unique_prefix
from tests.test_multiprocess import LineClient
from tubeq.redis_process import RedisProcess

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
