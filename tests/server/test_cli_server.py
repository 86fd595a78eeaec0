"""The ``tubeq`` command itself: flags, the private redis-server, signals, errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tubeq.redisio.process import free_port

START_TIMEOUT_S = 15.0


def _wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("tubeq did not start listening")


def _session(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def test_embedded_redis_with_a_relative_data_dir_keeps_jobs_across_restarts(
        tmp_path: Path) -> None:
    """``make run``'s shape: no --redis, a relative data dir; a job survives a clean restart."""
    port = free_port()
    argv = [sys.executable, "-m", "tubeq", "-p", str(port), "--data-dir", "data"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for round_trip in (b"put 0 0 60 5\r\nhello\r\nquit\r\n", b"peek-ready\r\nquit\r\n"):
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE)
        try:
            _wait_for_port(port, proc)
            out = _session(port, round_trip)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
        assert out in (b"INSERTED 1\r\n", b"FOUND 1 5\r\nhello\r\n")
    assert out == b"FOUND 1 5\r\nhello\r\n"
    assert (tmp_path / "data").is_dir()


def test_unreachable_redis_is_one_clear_line_and_a_nonzero_exit() -> None:
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "tubeq", "-p", str(free_port()), "--redis",
         f"redis://127.0.0.1:{port}/0"], capture_output=True, timeout=30)
    assert proc.returncode != 0
    assert b"tubeq:" in proc.stderr.splitlines()[-1]


@pytest.mark.parametrize(("flags", "message"), [
    (["-z", "0"], b"-z must be between"),
    (["--max-in-flight", "0"], b"--max-in-flight must be at least 1"),
    (["--max-client-buffer", "1000"], b"--max-client-buffer must be at least 65536"),
    (["-z", "100", "--max-result-size", "101"], b"--max-result-size must be between 0 and"),
    (["--result-ttl", "0"], b"--result-ttl must be between 0.001 and"),
    (["--idle-poll-us", "-1"], b"--idle-poll-us must be between 0 (off) and 100000"),
    (["--idle-poll-us", "100001"], b"--idle-poll-us must be between 0 (off) and 100000"),
])
def test_bad_flags_are_refused(flags: list[str], message: bytes) -> None:
    proc = subprocess.run([sys.executable, "-m", "tubeq", *flags], capture_output=True,
                          timeout=30)
    assert proc.returncode == 2 and message in proc.stderr


def test_without_redis_server_it_says_what_to_install(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # a PATH with no redis-server on it
    proc = subprocess.run([sys.executable, "-m", "tubeq", "-p", str(free_port()), "--data-dir",
                           str(tmp_path / "d")], capture_output=True, timeout=30, env=env)
    assert proc.returncode == 2
    assert b"apt-get install -y redis-server" in proc.stderr
