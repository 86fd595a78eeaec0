"""``tubeq --workers N`` (tubeq.server.workers): N processes on one port, sharing one namespace; a
worker that dies is replaced; SIGTERM stops them all. Real processes, the session's Redis."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.servers import unique_prefix
from tests.support.wire import Wire
from tubeq.redisio.process import RedisProcess, free_port
from tubeq.server.idle_poll import default_window_us

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 20.0


def _pid_behind(port: int) -> int:
    with Wire("127.0.0.1", port) as w:
        return int(w.yaml("stats")["pid"])


def _other_worker(port: int, mine: int, deadline: float) -> Wire:
    """A connection that landed on a worker other than pid ``mine`` (the kernel spreads new
    connections over the workers), by ``deadline``."""
    while True:
        assert time.monotonic() < deadline, "no connection reached the other worker"
        wire = Wire("127.0.0.1", port)
        if int(wire.yaml("stats")["pid"]) != mine:
            return wire
        wire.sock.close()


def _pids(port: int, connections: int = 24) -> set[int]:
    return {_pid_behind(port) for _ in range(connections)}


def _wait_for(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        assert proc.poll() is None, "the supervisor exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "no worker listened"
            time.sleep(0.05)


def _two_workers(redis_process: RedisProcess) -> tuple[int, subprocess.Popen[bytes]]:
    """``tubeq --workers 2`` on a free port, a namespace of its own: the port and the
    supervisor (the caller stops it with SIGTERM)."""
    port = free_port()
    argv = [sys.executable, "-m", "tubeq", "--workers", "2", "-p", str(port), "--redis",
            redis_process.url, "--prefix", unique_prefix()]
    return port, subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(REPO)},
                                  stderr=subprocess.DEVNULL)


def test_two_workers_share_the_port_and_the_tubes(redis_process: RedisProcess) -> None:
    port, proc = _two_workers(redis_process)
    try:
        _wait_for(port, proc)
        deadline = time.monotonic() + WAIT_S
        pids = _pids(port)
        while len(pids) < 2 and time.monotonic() < deadline:  # the second may still be starting
            time.sleep(0.1)
            pids |= _pids(port)
        assert len(pids) == 2 and proc.pid not in pids  # two workers, the supervisor serves none
        # Each worker polls with the window resolved for two processes (it sees --workers 1).
        for pid in pids:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            given = [argv[i + 1] for i, arg in enumerate(argv) if arg == b"--idle-poll-us"]
            assert given[-1] == str(default_window_us(2)).encode()
        # A job put through one worker is reserved through the other.
        with Wire("127.0.0.1", port) as a:
            first = int(a.yaml("stats")["pid"])
            assert a.ask(b"put 0 0 60 5\r\nshare\r\n") == b"INSERTED 1\r\n"
        while True:
            with Wire("127.0.0.1", port) as b:
                if int(b.yaml("stats")["pid"]) != first:
                    assert b.ask("reserve-with-timeout 5") == b"RESERVED 1 5\r\nshare\r\n"
                    break
        # A worker killed is replaced by a new process.
        victim = first
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                now = _pids(port, 8)
            except (OSError, AssertionError):
                now = set()
            if len(now - pids) >= 1 and victim not in now:
                break
            time.sleep(0.2)
        assert victim not in now and len(now - pids) >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    # Every worker went with the supervisor: nothing listens any more.
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        refused = False
    except OSError:
        refused = True
    assert refused


def test_workers_need_a_fixed_tcp_port() -> None:
    out = subprocess.run([sys.executable, "-m", "tubeq", "--workers", "2", "-p", "0"],
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                         timeout=60, check=False)
    assert out.returncode == 2 and b"--workers needs a TCP port" in out.stderr


def test_a_wait_on_one_worker_hears_a_finish_on_the_other(redis_process: RedisProcess) -> None:
    """--workers 2: a wait (and a request/reply) on one process is answered by a finish on
    the other (the ends channel reaches every worker), and a held child on one runs after its
    parent finished on the other."""
    port, proc = _two_workers(redis_process)
    try:
        _wait_for(port, proc)
        with Wire("127.0.0.1", port) as caller:
            mine = int(caller.yaml("stats")["pid"])
            caller.send(b"put-with 0 0 60 3 wait-ms=20000\r\nabc\r\n")
            deadline = time.monotonic() + WAIT_S
            with _other_worker(port, mine, deadline) as worker:
                assert worker.ask("reserve-with-timeout 5") == b"RESERVED 1 3\r\nabc\r\n"
                assert worker.ask(b"finish 1 3\r\nABC\r\n") == b"FINISHED\r\n"
            assert caller.reply() == b"ENDED 1 finished 3\r\nABC\r\n"
            # dependencies: a child put on this worker runs once its parent finished on the
            # other (its end reaches the child through Redis, whichever process drains it)
            assert caller.ask(b"put 0 0 60 1\r\np\r\n") == b"INSERTED 2\r\n"
            assert caller.ask(b"put-with 0 0 60 1 after=2\r\nc\r\n") == b"INSERTED 3\r\n"
            with _other_worker(port, mine, deadline) as worker:
                assert worker.ask("reserve-with-timeout 5") == b"RESERVED 2 1\r\np\r\n"
                assert worker.ask(b"finish 2 0\r\n\r\n") == b"FINISHED\r\n"
            assert caller.ask("reserve-with-timeout 10") == b"RESERVED 3 1\r\nc\r\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_groups_take_turns_and_a_group_cap_holds_across_workers(
        redis_process: RedisProcess) -> None:
    """--workers 2: jobs of two groups put through one worker are reserved through the other in
    turns, and group-concurrency counts the reservations of both workers."""
    port, proc = _two_workers(redis_process)
    try:
        _wait_for(port, proc)
        with Wire("127.0.0.1", port) as first:
            mine = int(first.yaml("stats")["pid"])
            assert first.ask("tube-set tenants group-concurrency=1") == b"SET\r\n"
            first.ask("use tenants")
            first.ask("watch tenants")
            ids = [int(first.ask(f"put-with 0 0 60 1 group={g}\r\nx").split()[1])
                   for g in ("a", "a", "b")]
            assert first.ask("reserve-with-timeout 5").startswith(f"RESERVED {ids[0]} ".encode())
            with _other_worker(port, mine, time.monotonic() + WAIT_S) as other:
                other.ask("watch tenants")
                other.ask("ignore default")
                assert other.ask("reserve-with-timeout 5").startswith(
                    f"RESERVED {ids[2]} ".encode())
                assert other.ask("reserve-with-timeout 0") == b"TIMED_OUT\r\n"  # a's cap
                assert first.ask(f"delete {ids[0]}") == b"DELETED\r\n"
                assert other.ask("reserve-with-timeout 5").startswith(
                    f"RESERVED {ids[1]} ".encode())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
