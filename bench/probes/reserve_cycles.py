"""Whether tubeq's memory comes back after many blocked reserves: N connections blocked in
``reserve`` on an empty tube, then all closed, several times over, with the server's RSS after
each half. RSS that climbs cycle after cycle is a leak; RSS that stays near the first cycle's
figure is the allocator keeping freed memory for the next burst.

    .venv/bin/python -m bench.probes.reserve_cycles [--connections 3000] [--cycles 5]

Loopback only, one private redis-server and one tubeq process; bounded by ``SETTLE_TIMEOUT_S``
per step. Prints one line per step and the CPU model.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import time
from pathlib import Path

from bench.harness.idle_connections import (
    SETTLE_TIMEOUT_S,
    _open_blocked,
    _settle,
    raise_fd_limit,
    rss_kb,
)
from bench.harness.machine import cpu_model
from bench.harness.servers import LOOPBACK, Tubeq


def _stat(port: int, name: str) -> int:
    with socket.create_connection((LOOPBACK, port), timeout=10) as sock:
        sock.sendall(b"stats\r\n")
        data = b""
        while data.count(b"\r\n") < 2:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    for line in data.decode().splitlines():
        if line.startswith(name + ": "):
            return int(line.split(": ")[1])
    raise RuntimeError(f"no {name} in stats")


def _drained(port: int) -> None:
    """Until the server holds no connection but the one asking (and nothing waits)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while _stat(port, "current-connections") > 1 or _stat(port, "current-waiting") > 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"connections still open after {SETTLE_TIMEOUT_S:.0f} s")
        time.sleep(0.2)
    time.sleep(0.5)  # let the last frees land


def run(server: Tubeq, connections: int, cycles: int) -> list[tuple[int, int]]:
    """(RSS kB with the connections blocked, RSS kB after they closed), per cycle."""
    pid = server.pids["tubeq"]
    print(f"start: rss {rss_kb(pid)} kB", flush=True)
    figures = []
    for cycle in range(1, cycles + 1):
        socks: list[socket.socket] = []
        try:
            _open_blocked(server.port, connections, socks)
            _settle(server.port, connections)
            blocked = rss_kb(pid)
        finally:
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.close()
        _drained(server.port)
        closed = rss_kb(pid)
        figures.append((blocked, closed))
        print(f"cycle {cycle}: {connections} blocked rss {blocked} kB, all closed rss "
              f"{closed} kB", flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.reserve_cycles",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--connections", type=int, default=3000)
    p.add_argument("--cycles", type=int, default=5)
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/logs-reserve-cycles"))
    args = p.parse_args(argv)
    raise_fd_limit(args.connections + 200)
    print(f"cpu: {cpu_model()}", flush=True)
    server = Tubeq(args.log_dir)
    try:
        server.start()
        run(server, args.connections, args.cycles)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
