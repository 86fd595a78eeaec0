"""Memory per idle connection: N connections each blocked in ``reserve`` on an empty
tube, the server's RSS before and after, per connection; for tubeq also Redis's used_memory.

    .venv/bin/python -m bench.harness.idle_connections [--connections 10000]
                                                            one measurement, printed

``make bench`` runs it for beanstalkd and tubeq (section "Idle connections" of RESULTS.md).
The target is at most 4 kB of tubeq RSS per connection. 100 connections are opened
and blocked first, so objects made once per process (not per connection) are in the baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness.redisinfo import redis_info
from bench.harness.servers import LOOPBACK, Beanstalkd, Server, Tubeq

WARM_CONNECTIONS = 100
# How long the server may take to count every connection as waiting.
SETTLE_TIMEOUT_S = 120.0
RESERVE = b"reserve\r\n"


def used_memory(url: str) -> int:
    return int(redis_info(url, "memory")["used_memory"])


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _waiting(port: int) -> int:
    with socket.create_connection((LOOPBACK, port), timeout=10) as sock:
        sock.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"\r\n") or data.count(b"\r\n") < 2:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    for line in data.decode().splitlines():
        if line.startswith("current-waiting: "):
            return int(line.split(": ")[1])
    raise RuntimeError("no current-waiting in stats")


def _open_blocked(port: int, count: int, into: list[socket.socket]) -> None:
    for _ in range(count):
        sock = socket.create_connection((LOOPBACK, port), timeout=10)
        sock.sendall(RESERVE)
        into.append(sock)


def _settle(port: int, expected: int) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while _waiting(port) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {expected} connections waiting after "
                               f"{SETTLE_TIMEOUT_S:.0f} s")
        time.sleep(0.2)
    time.sleep(0.5)  # let the last allocations land


def raise_fd_limit(needed: int) -> None:
    """Raise this process's open-file soft limit (inherited by the servers it starts)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise RuntimeError(f"{needed} connections need {needed} open files; hard limit "
                               f"is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def measure(server: Server, count: int) -> dict[str, Any]:
    """Open ``count`` connections blocked in reserve on the started ``server``; bytes each."""
    pid = next(iter(server.pids.values()))  # the server process (tubeq's first, not Redis)
    socks: list[socket.socket] = []
    try:
        _open_blocked(server.port, WARM_CONNECTIONS, socks)
        _settle(server.port, WARM_CONNECTIONS)
        rss_before = rss_kb(pid)
        redis_before = used_memory(server.redis_url) if server.redis_url else None
        started = time.monotonic()
        _open_blocked(server.port, count, socks)
        _settle(server.port, WARM_CONNECTIONS + count)
        opened_s = time.monotonic() - started
        rss_after = rss_kb(pid)
        redis_after = used_memory(server.redis_url) if server.redis_url else None
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
    redis_per_conn = (None if redis_before is None or redis_after is None
                      else (redis_after - redis_before) / count)
    return {"server": server.name, "connections": count,
            "rss_before_kb": rss_before, "rss_after_kb": rss_after,
            "bytes_per_connection": (rss_after - rss_before) * 1024 / count,
            "redis_bytes_per_connection": redis_per_conn, "open_and_settle_s": round(opened_s, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.harness.idle_connections",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/logs-idle"))
    args = p.parse_args(argv)
    raise_fd_limit(args.connections + WARM_CONNECTIONS + 200)
    for server in (Beanstalkd(args.log_dir), Tubeq(args.log_dir)):
        try:
            server.start()
            result = measure(server, args.connections)
        finally:
            server.stop()
        print(result, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
