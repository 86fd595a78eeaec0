"""Whole-namespace reads against the number of tubes: what one `stats` and one `/metrics`
scrape cost (the client's wait, and the longest single Redis call behind it, from Redis's
SLOWLOG), and another client's lone put while one connection pipelines `stats` without pause.

    .venv/bin/python -m bench.probes.namespace_reads [--tubes 100,10000,100000] [--base REV]
                                                     [--puts 2000] [--phases 3] [--out FILE]

For each tube count: a private Redis and tubeq (`--metrics` on, events off), tubes made as a
client makes them (`use` + one `put` each, pipelined); then `stats` and a scrape, median of 20
each, asked 100 ms apart (a lone stats, not one that waits out the spacing of a storm's reads:
tubeq.server.ops.NAMESPACE_READ_SPACING_S); then PUTS puts one at a time, idle, again while a
second process pipelines `stats` 20 at a time for as long as the puts run (p50 and p99 of each,
and their ratio), and again while it pipelines `list-tube-used`, which tubeq answers without
Redis: the share of a storm that is only a busy neighbour on the machine's cores; those three
phases take PHASES turns, each percentile over every phase of its kind; and the Redis commands
a round of the stats storm cost (Redis's count during the storm, less the puts' share measured
idle; the median over the phases). The stormer runs at nice 19, standing for a client on
another machine. With ``--base
REV`` the same rows run on revision REV too, the two sides alternating per tube count (A/B
interleaved, one CPU model: printed). Loopback only; every loop is bounded by count; processes
stopped by PID.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.synchronize
import os
import socket
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.harness.machine import cpu_model
from bench.harness.servers import LOOPBACK, Tubeq, snapshot_revision, snapshot_tubeq
from tubeq.redisio.process import free_port

SAMPLES = 20
SAMPLE_GAP_S = 0.1  # between two samples of one read: more than the spacing of its calls
STORM_BATCH = 20  # stats pipelined at once by the stormer, as in issue 35's repro
FILL_BATCH = 2_000  # tubes made per write of the filler


def _read_replies(sock: socket.socket, buffer: bytearray, count: int) -> bytearray:
    """Read until ``count`` replies (lines, and the bodies of OK replies) are complete; returns
    what is left over."""
    while count:
        end = buffer.find(b"\r\n")
        if end < 0:
            buffer += sock.recv(1 << 20)
            continue
        line = bytes(buffer[:end])
        size = int(line.split()[1]) + 2 if line.startswith(b"OK ") else 0
        while len(buffer) < end + 2 + size:
            buffer += sock.recv(1 << 20)
        del buffer[:end + 2 + size]
        count -= 1
    return buffer


def fill(port: int, tubes: int) -> None:
    """``tubes`` tubes with one ready job each, as clients make them: `use` + `put`."""
    with socket.create_connection((LOOPBACK, port)) as sock:
        left = bytearray()
        for start in range(0, tubes, FILL_BATCH):
            batch = range(start, min(tubes, start + FILL_BATCH))
            sock.sendall(b"".join(b"use card%06d\r\nput 2000 0 60 1\r\nx\r\n" % i for i in batch))
            left = _read_replies(sock, left, 2 * len(batch))


def apart(sample: Callable[[], float]) -> float:
    """``sample()`` after a pause of SAMPLE_GAP_S."""
    time.sleep(SAMPLE_GAP_S)
    return sample()


def ask_timed(sock: socket.socket, command: bytes) -> float:
    """Seconds from sending ``command`` to its whole reply."""
    began = time.perf_counter()
    sock.sendall(command)
    _read_replies(sock, bytearray(), 1)
    return time.perf_counter() - began


def storm(port: int, stop: multiprocessing.synchronize.Event, command: bytes,
          rounds: Any) -> None:
    """Pipeline ``command`` STORM_BATCH at a time until told to stop (bounded by the caller's
    puts), counting the rounds answered in ``rounds``. At nice 19: it stands for a client on
    another machine, so what the put pays is what its commands cost tubeq and Redis, not what
    its own loop costs this machine's two cores."""
    os.nice(19)
    with socket.create_connection((LOOPBACK, port)) as sock:
        while not stop.is_set():
            sock.sendall(command * STORM_BATCH)
            _read_replies(sock, bytearray(), STORM_BATCH)
            rounds.value += 1


def redis_commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def puts_during(port: int, puts: int, command: bytes, raw: redis.Redis,
                per_put: float) -> tuple[list[float], float]:
    """``puts`` lone puts timed while another process pipelines ``command`` without pause, and
    the Redis commands per round of the storm (Redis's count less ``per_put`` a put)."""
    stop = multiprocessing.Event()
    rounds = multiprocessing.Value("q", 0, lock=False)
    stormer = multiprocessing.Process(target=storm, args=(port, stop, command, rounds))
    stormer.start()
    try:
        time.sleep(0.2)  # the storm under way
        rounds_before, commands_before = rounds.value, redis_commands(raw)
        latencies = puts_timed(port, puts)
        commands = redis_commands(raw) - commands_before - per_put * puts
        return latencies, commands / max(1, rounds.value - rounds_before)
    finally:
        stop.set()
        stormer.join(60)
        if stormer.is_alive():
            stormer.kill()


def slowest_redis_call_us(client: redis.Redis, action: object) -> int:
    """The longest single command Redis ran during ``action()`` (SLOWLOG at threshold 0)."""
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 10_000)
    client.slowlog_reset()
    action()  # type: ignore[operator]
    entries = client.slowlog_get(10_000)
    client.config_set("slowlog-log-slower-than", 10_000)
    return max((e["duration"] for e in entries if b"slowlog" not in e["command"].lower()),
               default=0)


def puts_timed(port: int, count: int) -> list[float]:
    with socket.create_connection((LOOPBACK, port)) as sock:
        ask_timed(sock, b"use steady\r\n")
        return [ask_timed(sock, b"put 0 0 60 1\r\ny\r\n") for _ in range(count)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(code_dir: Path, log_dir: Path, tubes: int, puts: int,
            phases: int) -> dict[str, float]:
    http_port = free_port(LOOPBACK)
    server = Tubeq(log_dir, code_dir=code_dir,
                   flags=("--metrics", f"{LOOPBACK}:{http_port}", "--events", "off"))
    server.start()
    try:
        assert server.redis is not None
        raw = redis.Redis.from_url(server.redis.url)
        fill(server.port, tubes)
        scrape_url = f"http://{LOOPBACK}:{http_port}/metrics"
        with socket.create_connection((LOOPBACK, server.port)) as sock:
            stats_s = statistics.median(apart(lambda: ask_timed(sock, b"stats\r\n"))
                                        for _ in range(SAMPLES))
            stats_redis = slowest_redis_call_us(raw, lambda: ask_timed(sock, b"stats\r\n"))

        def scrape() -> float:
            began = time.perf_counter()
            with urllib.request.urlopen(scrape_url, timeout=60) as answer:
                answer.read()
            return time.perf_counter() - began

        scrape_s = statistics.median(apart(scrape) for _ in range(SAMPLES))
        scrape_redis = slowest_redis_call_us(raw, scrape)
        idle: list[float] = []
        stormy: list[float] = []
        local: list[float] = []
        per_round: list[float] = []
        for _ in range(phases):
            # Idle, storm and no-Redis storm take turns, so a spell of the host's own noise
            # (other tenants, a slow second) falls on every kind of phase alike.
            commands_before = redis_commands(raw)
            idle += puts_timed(server.port, puts)
            per_put = (redis_commands(raw) - commands_before) / puts
            latencies, commands = puts_during(server.port, puts, b"stats\r\n", raw, per_put)
            stormy += latencies
            per_round.append(commands)
            # The same storm of a command answered without Redis: what a busy neighbour
            # process costs the put on this machine's cores, whatever it asks.
            local += puts_during(server.port, puts, b"list-tube-used\r\n", raw, per_put)[0]
        raw.close()
    finally:
        server.stop()
    return {
        "stats ms": stats_s * 1e3, "stats redis max ms": stats_redis / 1e3,
        "scrape ms": scrape_s * 1e3, "scrape redis max ms": scrape_redis / 1e3,
        "put p50 idle ms": percentile(idle, 0.5) * 1e3,
        "put p99 idle ms": percentile(idle, 0.99) * 1e3,
        "put p50 storm ms": percentile(stormy, 0.5) * 1e3,
        "put p99 storm ms": percentile(stormy, 0.99) * 1e3,
        "put p99 local storm ms": percentile(local, 0.99) * 1e3,
        "redis per stats round": statistics.median(per_round),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tubes", default="100,10000,100000")
    parser.add_argument("--puts", type=int, default=2000, help="puts per phase")
    parser.add_argument("--phases", type=int, default=3,
                        help="turns of idle, stats storm and no-Redis storm; each percentile is "
                             "over every phase of its kind")
    parser.add_argument("--base", help="a revision to run the same rows on, interleaved")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    counts = [int(n) for n in args.tubes.split(",")]
    lines = [f"CPU: {cpu_model()}", ""]
    with tempfile.TemporaryDirectory(prefix="tubeq-nsreads-") as scratch:
        root = Path(scratch)
        sides = {"head": snapshot_tubeq(root / "head")}
        if args.base:
            sides[f"base {args.base}"] = snapshot_revision(args.base, root / "base")
        header = ("| side | tubes | stats ms | stats: longest Redis call ms | scrape ms | "
                  "scrape: longest Redis call ms | put p50 / p99 idle ms | "
                  "put p50 / p99 during stats storm ms | p99 storm / idle | "
                  "put p99 during a storm of list-tube-used (no Redis) ms | "
                  f"Redis commands per {STORM_BATCH} pipelined stats |")
        lines += [header, "|" + "---|" * header.count(" | ") + "---|"]
        print("\n".join(lines), flush=True)
        for i, tubes in enumerate(counts):
            order = list(sides.items())
            if i % 2:
                order.reverse()
            for name, code_dir in order:
                f = measure(code_dir, root / "logs", tubes, args.puts, args.phases)
                row = (f"| {name} | {tubes:,} | {f['stats ms']:.2f} | "
                       f"{f['stats redis max ms']:.2f} | {f['scrape ms']:.2f} | "
                       f"{f['scrape redis max ms']:.2f} | {f['put p50 idle ms']:.3f} / "
                       f"{f['put p99 idle ms']:.3f} | {f['put p50 storm ms']:.3f} / "
                       f"{f['put p99 storm ms']:.3f} | "
                       f"{f['put p99 storm ms'] / f['put p99 idle ms']:.2f}x | "
                       f"{f['put p99 local storm ms']:.3f} | "
                       f"{f['redis per stats round']:.2f} |")
                lines.append(row)
                print(row, flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
