"""Structured log lines of a real tubeq process (``--log-format json|console``): one line per
connection opened and closed, per slow command, per fault; none per job at the default level."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.servers import ServerProcess, start_tubeq, unique_prefix
from tubeq.redisio.process import RedisProcess

LINE_WAIT_S = 15.0


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A Redis of this test's own: the fault test stops it."""
    proc = RedisProcess(tmp_path / "redis")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def tubeq_with(own_redis: RedisProcess, tmp_path: Path
               ) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(*flags: str) -> ServerProcess:
        server = start_tubeq(own_redis.url, unique_prefix(), tmp_path / "logs", "tubeq-logs",
                             flags)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def json_lines(server: ServerProcess) -> list[dict[str, Any]]:
    """Every line the server logged, each parsed as JSON (a line that is not JSON fails)."""
    text = server.log_path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_for_line(server: ServerProcess, read: Callable[[ServerProcess], list[Any]],
                  match: Callable[[Any], bool], what: str) -> Any:
    deadline = time.monotonic() + LINE_WAIT_S
    while time.monotonic() < deadline:
        for line in read(server):
            if match(line):
                return line
        time.sleep(0.05)
    raise AssertionError(f"no {what} line; the log:\n{server.log_tail()}")


def talk(port: int, payload: bytes, replies: int) -> tuple[str, list[bytes]]:
    """Send ``payload``, read ``replies`` CRLF lines, close; the local address and the lines."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        host, port_ = sock.getsockname()[:2]
        local = f"{host}:{port_}"
        sock.sendall(payload)
        buf = b""
        while buf.count(b"\r\n") < replies:
            chunk = sock.recv(65536)
            assert chunk, "server closed the connection"
            buf += chunk
    return local, buf.split(b"\r\n")[:replies]


def test_json_lines_per_connection_and_none_per_job(tubeq_with: Callable[..., ServerProcess]
                                                    ) -> None:
    server = tubeq_with("--log-format", "json")
    jobs = 50
    payload = b"".join(b"put 0 0 60 3\r\njob\r\n" for _ in range(jobs))
    payload += b"".join(b"reserve\r\n" for _ in range(jobs))
    local, replies = talk(server.port, payload, 2 * jobs + jobs)  # RESERVED has 2 lines
    assert replies[0].startswith(b"INSERTED")
    # (The harness's own probe, which waited for the port, has its pair of lines too.)
    mine = [r for r in json_lines(server) if r.get("peer") == local]
    assert [r["event"] for r in mine] == ["connection opened"] and mine[0]["level"] == "info"
    closed = wait_for_line(
        server, json_lines,
        lambda r: r["event"] == "connection closed" and r["conn"] == mine[0]["conn"],
        "connection closed")
    assert closed["level"] == "info"
    lines = json_lines(server)
    for line in lines:
        assert {"timestamp", "level", "event"} <= set(line)
        assert line["timestamp"].endswith("Z")
    # 150 commands on 50 jobs, and not one line about them.
    assert {r["event"] for r in lines} == {"listening", "connection opened", "connection closed"}


def test_a_slow_command_and_a_redis_fault_each_get_a_line(
        tubeq_with: Callable[..., ServerProcess], own_redis: RedisProcess) -> None:
    # --redis-timeout past the pause: a stalled Redis is what the pause imitates, and the
    # default bound (2 s) would drop the connection as it ends instead of logging a slow put.
    server = tubeq_with("--log-format", "json", "--slow-ms", "200", "--redis-timeout", "10")
    with redis.Redis.from_url(own_redis.url) as admin:
        # Redis holds every other client's commands for 2 s: the put below takes at least
        # the rest of that, far past 200 ms.
        admin.execute_command("CLIENT", "PAUSE", "2000", "ALL")
    _, replies = talk(server.port, b"put 0 0 60 4\r\nslow\r\n", 1)
    assert replies[0].startswith(b"INSERTED")
    slow = wait_for_line(server, json_lines, lambda r: r["event"] == "slow command",
                         "slow command")
    assert (slow["level"], slow["command"], slow["reply"]) == ("warning", "put", "INSERTED")
    assert slow["ms"] >= 200 and slow["conn"]

    own_redis.stop()  # a fault: the Redis connection is lost
    lost = wait_for_line(server, json_lines, lambda r: r["event"] == "redis connection lost",
                         "redis connection lost")
    assert lost["level"] == "warning"


def test_console_lines_by_default(tubeq_with: Callable[..., ServerProcess]) -> None:
    server = tubeq_with()

    def text_lines(s: ServerProcess) -> list[str]:
        return s.log_path.read_text().splitlines()

    talk(server.port, b"list-tube-used\r\n", 1)
    line = wait_for_line(server, text_lines, lambda line: "connection closed" in line,
                         "connection closed")
    assert "[info" in line and "conn=" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)
