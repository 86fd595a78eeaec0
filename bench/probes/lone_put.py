"""What one put costs when it is sent and awaited alone, as a web handler does: the round trip
seen by a raw socket (send, wait for ``INSERTED``, send the next) and by the bundled client
(``await client.put(...)`` in a loop), with tubeq's and Redis's CPU per put from /proc.

    .venv/bin/python -m bench.probes.lone_put [--puts 3000] [--reps 3] [--base REV] [--events on]

With ``--base REV`` the tubeq of ``REV`` runs too, each repetition alternating which goes first
(A/B interleaved, one CPU model: printed). Loopback only: one private redis-server and one tubeq
process per side, started and stopped by PID; every loop is bounded by ``--puts``.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.harness.machine import cpu_model
from bench.harness.procstat import CpuSnapshot, CpuWindow
from bench.harness.servers import LOOPBACK, Tubeq, snapshot_revision, snapshot_tubeq

BODY = b"x" * 100


def raw_socket_puts(port: int, puts: int) -> None:
    """``puts`` puts over one blocking socket, each awaited before the next."""
    command = b"put 0 0 60 %d\r\n%s\r\n" % (len(BODY), BODY)
    with socket.create_connection((LOOPBACK, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(puts):
            sock.sendall(command)
            reply = sock.recv(64)
            if not reply.startswith(b"INSERTED"):
                raise RuntimeError(f"put answered {reply!r}")


def client_puts(port: int, puts: int) -> None:
    """``puts`` awaited ``client.put`` calls of the bundled client, on uvloop."""
    import uvloop

    from tubeq.client import Client

    async def run() -> None:
        client = Client(LOOPBACK, port)
        await client.connect()
        try:
            for _ in range(puts):
                await client.put(BODY)
        finally:
            await client.aclose()

    uvloop.run(run())


def measure(server: Tubeq, load: Callable[[int, int], None], puts: int) -> dict[str, float]:
    """us of wall time per put, and tubeq's and Redis's CPU us per put, for one load."""
    load(server.port, min(200, puts))  # warm-up: connections, scripts, the tube
    start = CpuSnapshot.take(server.pids)
    began = time.perf_counter()
    load(server.port, puts)
    wall = time.perf_counter() - began
    window = CpuWindow.between(start, CpuSnapshot.take(server.pids))
    per_put = {"wall": wall / puts * 1e6, "other cores": window.other_cores}
    for label in ("tubeq", "redis"):
        percent = window.percent_by_label[label] or 0.0
        per_put[label] = percent / 100 * window.seconds / puts * 1e6
    return per_put


LOADS: dict[str, Callable[[int, int], None]] = {
    "raw socket": raw_socket_puts,
    "bundled client": client_puts,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--puts", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--base", help="git revision of a base tubeq to run interleaved")
    parser.add_argument("--events", choices=("on", "off"), default="off")
    args = parser.parse_args()
    flags = ("--events", args.events)
    with tempfile.TemporaryDirectory(prefix="lone-put-") as tmp:
        sides = {"head": snapshot_tubeq(Path(tmp) / "head")}
        if args.base:
            sides["base"] = snapshot_revision(args.base, Path(tmp) / "base")
        results: dict[tuple[str, str], list[dict[str, float]]] = {}
        for rep in range(args.reps):
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for side in order:
                server = Tubeq(Path(tmp) / f"logs-{side}", code_dir=sides[side], flags=flags)
                server.start()
                try:
                    for name, load in LOADS.items():
                        figures = measure(server, load, args.puts)
                        results.setdefault((side, name), []).append(figures)
                        print(f"rep {rep} {side:4} {name:14} " + ", ".join(
                            f"{k} {v:.2f}" for k, v in figures.items()), flush=True)
                finally:
                    server.stop()
    print(f"\n{cpu_model()}, {args.puts} puts of {len(BODY)} B, events {args.events}, "
          f"{args.reps} reps; medians, us per put (min-max of wall)")
    for (side, name), runs in results.items():
        walls = [r["wall"] for r in runs]
        print(f"{side:4} {name:14} wall {statistics.median(walls):7.1f} "
              f"({min(walls):.1f}-{max(walls):.1f}), tubeq CPU "
              f"{statistics.median(r['tubeq'] for r in runs):5.1f}, redis CPU "
              f"{statistics.median(r['redis'] for r in runs):5.1f}, other cores "
              f"{max(r['other cores'] for r in runs):.2f}")


if __name__ == "__main__":
    main()
