"""Listen first, as beanstalkd does (issue 31, part 1): ``python -m tubeq`` binds its protocol
socket before its imports and its Redis (tubeq.__main__), and answers what queued there once it
is up; signals that come before the event loop are held, not fatal.

Behaviour only; how fast is bench/start_time.py's business.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import unique_prefix
from tubeq.__main__ import listen_flags
from tubeq.redisio.process import RedisProcess, free_port
from tubeq.server.listeners import listen_before_start

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 15.0


class HeldRedis:
    """A TCP relay to a real Redis that passes nothing on until :meth:`release`: a tubeq pointed
    at it is stuck in its start, waiting for Redis's first reply."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.released = threading.Event()
        self.reached = threading.Event()  # tubeq opened a connection to "Redis"
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                self.reached.set()
                upstream = socket.create_connection(self.target)
                self._sockets += [client, upstream]
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        self.released.wait()
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.released.set()
        for sock in self._sockets:
            sock.close()


@pytest.fixture
def held_redis(redis_process: RedisProcess) -> Iterator[HeldRedis]:
    host, port = redis_process.url.removeprefix("redis://").split("/")[0].split(":")
    relay = HeldRedis((host, int(port)))
    yield relay
    relay.close()


def _tubeq(*flags: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tubeq", *flags],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE)


def _connect(address: tuple[str, int] | str, proc: subprocess.Popen[bytes]) -> socket.socket:
    """A connection to tubeq's protocol socket as soon as it listens."""
    deadline = time.monotonic() + WAIT_S
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            time.sleep(0.005)
        else:
            sock.settimeout(WAIT_S)
            return sock
    raise AssertionError("tubeq never listened")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_port_listens_before_redis_answers_and_what_queued_is_answered_once_up(
        held_redis: HeldRedis) -> None:
    port = free_port()
    proc = _tubeq("-p", str(port), "--redis", held_redis.url, "--prefix", unique_prefix())
    try:
        with _connect(("127.0.0.1", port), proc) as early:
            early.sendall(b"use early\r\n")
            assert held_redis.reached.wait(WAIT_S)  # tubeq is in its start, Redis silent
            assert proc.poll() is None
            held_redis.release()
            assert early.recv(100) == b"USING early\r\n"
    finally:
        assert _stop(proc) == 0


def test_a_sigterm_while_the_start_waits_stops_the_server_once_up(
        held_redis: HeldRedis, tmp_path: Path) -> None:
    path = tmp_path / "tubeq.sock"
    proc = _tubeq("-l", f"unix:{path}", "--redis", held_redis.url, "--prefix", unique_prefix())
    try:
        _connect(str(path), proc).close()
        proc.send_signal(signal.SIGTERM)  # most likely still importing; at most starting
        time.sleep(0.2)
        assert proc.poll() is None  # held, not fatal
        held_redis.release()
        assert proc.wait(WAIT_S) == 0
    finally:
        _stop(proc)
    assert b"Traceback" not in proc.stderr.read() if proc.stderr else True
    assert not path.exists()  # removed at the stop, as after any stop


@pytest.mark.parametrize("when", ["listening", "waiting for redis"])
def test_a_sigusr1_during_the_start_puts_it_in_drain_mode_from_the_first_command(
        held_redis: HeldRedis, when: str) -> None:
    # As soon as it listens it is most likely still importing (the signal is held); once it
    # has reached Redis the event loop has the signal, and the server's namespaces are not open.
    port = free_port()
    proc = _tubeq("-p", str(port), "--redis", held_redis.url, "--prefix", unique_prefix())
    try:
        with _connect(("127.0.0.1", port), proc) as early:
            if when == "waiting for redis":
                assert held_redis.reached.wait(WAIT_S)
            proc.send_signal(signal.SIGUSR1)
            early.sendall(b"put 0 0 60 1\r\nx\r\n")
            assert held_redis.reached.wait(WAIT_S)
            time.sleep(0.1)  # the signal's handler runs before Redis answers
            held_redis.release()
            assert early.recv(100) == b"DRAINING\r\n"
    finally:
        assert _stop(proc) == 0


def test_a_start_that_fails_after_listening_is_one_line_and_leaves_no_socket_file(
        tmp_path: Path) -> None:
    path = tmp_path / "tubeq.sock"
    proc = _tubeq("-l", f"unix:{path}", "--redis", f"redis://127.0.0.1:{free_port()}")
    try:
        _connect(str(path), proc).close()  # listening, though no Redis is there
        assert proc.wait(WAIT_S) == 1
    finally:
        _stop(proc)
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert err.count("\n") == 1 and err.startswith("tubeq: cannot connect to Redis"), err
    assert not path.exists()


@pytest.mark.parametrize(("argv", "flags"), [
    ([], ("127.0.0.1", 11300, False)),
    (["-l", "0.0.0.0", "-p", "0"], ("0.0.0.0", 0, False)),
    (["-l::1", "-p11301", "--reuse-port"], ("::1", 11301, True)),
    (["-l", "unix:/run/tq.sock", "--redis", "redis://h:1/0"], ("unix:/run/tq.sock", 11300, False)),
    (["--workers", "1", "--prefix", "p"], ("127.0.0.1", 11300, False)),
    (["--workers=1", "-p", "9"], ("127.0.0.1", 9, False)),
    (["--workers", "2"], None),  # the supervisor serves nothing
    (["--workers=3"], None),
    (["--help"], None),
    (["-h"], None),
    (["--version"], None),
    (["--reuse", "-p", "9"], None),  # an abbreviation: argparse decides, later
    (["--work", "2"], None),
    (["-p", "x"], None),
    (["-p"], None),
    (["--", "-p", "9"], ("127.0.0.1", 11300, False)),
])
def test_the_listen_flags_are_read_as_argparse_reads_them_or_not_at_all(
        argv: list[str], flags: tuple[str, int, bool] | None) -> None:
    assert listen_flags(argv) == flags


def test_only_an_ip_address_or_a_unix_path_is_bound_before_the_start(tmp_path: Path) -> None:
    assert listen_before_start("localhost", 0, False) is None  # a name: the server resolves it
    taken = socket.create_server(("127.0.0.1", 0))
    try:  # a bind that fails is the server's to report
        assert listen_before_start("127.0.0.1", taken.getsockname()[1], False) is None
    finally:
        taken.close()
    tcp = listen_before_start("127.0.0.1", 0, True)
    assert tcp is not None and tcp.matches("127.0.0.1", 0, True)
    assert not tcp.matches("127.0.0.1", 0, False) and not tcp.matches("0.0.0.0", 0, True)
    tcp.close()
    path = tmp_path / "s.sock"
    unix = listen_before_start(f"unix:{path}", 11300, False)
    assert unix is not None and path.exists() and unix.matches(f"unix:{path}", 1, False)
    unix.close()
    assert not path.exists()
