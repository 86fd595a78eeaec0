"""The private redis-server of ``tubeq`` without --redis dies with tubeq and never runs twice on
one data directory (tubeq.redisio.process): SIGKILL of tubeq takes its redis-server with it, a
second tubeq on the same --data-dir is refused while the first runs, and a redis-server left on
the directory (an orphan) is stopped before a new one starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.server.test_multiprocess import LineClient
from tests.support.servers import ServerProcess, _spawn_and_wait
from tubeq.redisio.process import LOCK_FILE, PID_FILE, RedisProcess, free_port

WAIT_S = 15.0  # a bound on every wait below, never asserted as a duration


def start_embedded(data_dir: Path, log_dir: Path, label: str) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, "-m", "tubeq", "-l", "127.0.0.1", "-p", str(port), "--data-dir",
            str(data_dir)]
    return _spawn_and_wait("tubeq", argv, port, log_dir / f"{label}.log", label)


def process_gone(pid: int) -> bool:
    """No such process, or only a zombie (our container's init may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"not within {WAIT_S:g} s: {what}"
        time.sleep(0.05)


def redis_pid(data_dir: Path) -> int:
    wait_for(lambda: (data_dir / PID_FILE).exists(), "redis.pid is written")
    return int((data_dir / PID_FILE).read_text())


def test_sigkill_of_tubeq_takes_its_redis_along(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    tubeq = start_embedded(data_dir, tmp_path, "tubeq")
    try:
        pid = redis_pid(data_dir)
        assert not process_gone(pid)
        client = LineClient(tubeq)
        client.put(b"survives in the AOF")
        client.close()
        os.kill(tubeq.pid, signal.SIGKILL)
        tubeq.proc.wait(WAIT_S)
        wait_for(lambda: process_gone(pid), f"redis-server {pid} exits after tubeq's SIGKILL")

        again = start_embedded(data_dir, tmp_path, "tubeq-again")
        try:
            client = LineClient(again)
            assert client.call("stats-tube default").data is not None
            peeked = client.call("peek-ready")
            assert peeked.data == b"survives in the AOF", peeked
            client.close()
            assert redis_pid(data_dir) != pid
        finally:
            again.stop()
    finally:
        tubeq.stop()


def test_a_second_tubeq_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = start_embedded(data_dir, tmp_path, "first")
    try:
        pid = redis_pid(data_dir)
        done = subprocess.run([sys.executable, "-m", "tubeq", "-p", str(free_port()),
                               "--data-dir", str(data_dir)], capture_output=True, text=True,
                              timeout=30, check=False)
        assert done.returncode == 1, done
        assert "Traceback" not in done.stderr
        assert f"in use by another tubeq (pid {first.pid})" in done.stderr, done.stderr
        assert (data_dir / LOCK_FILE).read_text().strip() == str(first.pid)
        # The first one and its Redis are untouched.
        assert not process_gone(pid) and first.alive()
        client = LineClient(first)
        assert client.put(b"still served") > 0
        client.close()
    finally:
        first.stop()
    wait_for(lambda: process_gone(pid), "the redis-server exits with its tubeq (SIGTERM)")
    assert first.proc.returncode == 0


def test_an_orphaned_redis_on_the_data_dir_is_stopped_first(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    # An orphan as a tubeq without the parent-death signal would leave it: a redis-server of
    # this directory that writes redis.pid, and no tubeq holding the lock.
    orphan = RedisProcess(data_dir, persistent=True)
    orphan.start()
    assert orphan.proc is not None
    try:
        tubeq = start_embedded(data_dir, tmp_path, "tubeq")
        try:
            assert orphan.proc.wait(WAIT_S) == 0  # SIGTERM: Redis exits cleanly
            assert redis_pid(data_dir) != orphan.proc.pid
            assert "stopped a redis-server left running" in tubeq.log_tail()
            client = LineClient(tubeq)
            assert client.put(b"served by the new redis-server") > 0
            client.close()
        finally:
            tubeq.stop()
    finally:
        orphan.stop()
