"""What one hop between two processes of this machine costs: the floor under every
round-trip-bound figure (a put awaited alone, one caller's request/reply).

Owns :func:`measure`: a round trip over loopback TCP between this process and a peer, one
byte each way (python <-> python: a uvloop echo server in a process of its own, asyncio
protocols, no streams) or ``PING`` to a private redis-server (started here on a free loopback
port, stopped by its PID), the next message sent once the answer is back; both ends free to
run on any CPU, as every benchmark runs them, or both pinned to CPU 0. It gives the round trip
and the CPU each side spends per message (from /proc, over the timed loop), and leaves this
process's CPU affinity as it found it. ``python -m bench.probes.hop_cost`` prints the table;
``bench.peers.call`` records the free and pinned python round trips with its results.

A request/reply of tubeq crosses eight such hops (caller -> tubeq -> Redis -> tubeq -> worker
-> tubeq -> Redis -> tubeq -> caller), one of beanstalkd's reply tubes four, BullMQ's about four;
a put awaited alone two round trips (client <-> tubeq <-> Redis) against beanstalkd's one. On a
host where a hop to a sleeping process on the other CPU is dear, those counts, not the work in
each process, set the figures. Standard library and uvloop only; loopback only; every loop is
bounded by its count.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tubeq.redisio.process import RedisProcess

PING = b"*1\r\n$4\r\nPING\r\n"
WARMUP = 500


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


def serve(port: int, pin: bool) -> None:
    """The echo server (a process of its own): until its client closes."""
    import uvloop

    if pin:
        os.sched_setaffinity(0, {0})

    async def main() -> None:
        loop = asyncio.get_running_loop()
        closed = loop.create_future()

        class Echo(_Echo):
            def connection_lost(self, exc: Exception | None) -> None:
                if not closed.done():
                    closed.set_result(None)

        server = await loop.create_server(Echo, "127.0.0.1", port)
        print("ready", flush=True)
        await closed
        server.close()

    uvloop.run(main())


class _Client(asyncio.Protocol):
    """Sends ``message``, waits for ``reply_end`` at the end of what came back, repeats."""

    def __init__(self, message: bytes, reply_end: bytes, count: int) -> None:
        self.message, self.reply_end, self.left = message, reply_end, count
        self.buffer = b""
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.message)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.buffer.endswith(self.reply_end):
            return
        self.buffer = b""
        self.left -= 1
        if self.left <= 0:
            self.done.set_result(None)
        else:
            self.transport.write(self.message)  # type: ignore[attr-defined]


def round_trips(port: int, message: bytes, reply_end: bytes, count: int,
                peer_pid: int) -> tuple[float, float, float]:
    """``count`` round trips to ``port`` from this process, on one connection, after a warm-up
    on it: the mean round trip (us), this process's CPU per reply received (us) and the peer's
    per message (us)."""
    import uvloop

    async def run() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        transport, client = await loop.create_connection(
            lambda: _Client(message, reply_end, WARMUP), "127.0.0.1", port)
        try:
            await asyncio.wait_for(client.done, 120)
            client.left = count
            client.done = loop.create_future()
            own0, peer0, t0 = _cpu_s(os.getpid()), _cpu_s(peer_pid), time.perf_counter()
            transport.write(message)
            await asyncio.wait_for(client.done, 300)
            wall = time.perf_counter() - t0
            own, peer = _cpu_s(os.getpid()) - own0, _cpu_s(peer_pid) - peer0
        finally:
            transport.close()
        return wall / count * 1e6, own / count * 1e6, peer / count * 1e6

    return uvloop.run(run())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def measure(kind: str, pin: bool, count: int) -> tuple[float, float, float]:
    """One run of ``kind`` ("python" or "redis"), both ends pinned to CPU 0 or free: the round
    trip (us), and the CPU per message (us) of this process and of the peer."""
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {0} if pin else range(os.cpu_count() or 1))
        return _measure(kind, pin, count)
    finally:
        os.sched_setaffinity(0, before)


def _measure(kind: str, pin: bool, count: int) -> tuple[float, float, float]:
    if kind == "python":
        port = _free_port()
        peer = subprocess.Popen([sys.executable, "-m", "bench.harness.hops", str(port),
                                 *(["--pin"] if pin else [])],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert peer.stdout is not None
            if peer.stdout.readline().strip() != "ready":
                raise RuntimeError("the echo server did not start")
            return round_trips(port, b"x", b"x", count, peer.pid)
        finally:
            peer.wait(30)
    with tempfile.TemporaryDirectory(prefix="tubeq-hop-") as data_dir:
        redis = RedisProcess(Path(data_dir))
        redis.start()
        try:
            assert redis.proc is not None
            if pin:
                os.sched_setaffinity(redis.proc.pid, {0})
            return round_trips(redis.port, PING, b"+PONG\r\n", count, redis.proc.pid)
        finally:
            redis.stop()


def _serve_main() -> None:
    """``python -m bench.harness.hops PORT [--pin]``: the echo server of :func:`measure`."""
    serve(int(sys.argv[1]), "--pin" in sys.argv[2:])


if __name__ == "__main__":
    _serve_main()
