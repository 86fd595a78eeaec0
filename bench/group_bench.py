"""Groups inside a tube (put-with group=): is the round robin fair, and what does it cost?

    .venv/bin/python -m bench.group_bench [--reps 3] [--quick] [--write]

The load, put into one tube through one connection (put-with pipelined, 500 lines at a time):
one group of ``--big`` (100,000) ready jobs, then 50 groups of 10 each. The same load goes
into a second tube without groups (put-with with no option). One consumer per tube (one
connection, reserve-with-timeout 0 and delete, 16 in flight) then takes ``--consume`` jobs
(20,000). Per tube the row reports:

* fairness: how many of the 500 jobs of the small groups are among the consumer's first 600
  reservations (the issue's target: all 500), and the place of the last of them;
* the fill's jobs/s and the consumer's jobs/s, and CPU per job of redis-server and tubeq
  (/proc, over each phase): the target is a grouped tube's consumer throughput at least 0.8x
  of the same load without groups.

Every repetition starts a fresh redis-server and tubeq (bench.harness.servers.Tubeq), and the
two tubes alternate which goes first; figures are medians over the repetitions. The machine is
shared: the other processes' load (cores) is printed beside each phase. Loopback only; every
phase is bounded in jobs and by ``PHASE_TIMEOUT_S``. ``--write`` writes bench/RESULTS-groups.md
(not with ``--quick``, which writes bench/out/groups-quick.md).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness.machine import cpu_model
from bench.harness.paths import REPO_ROOT
from bench.harness.procstat import CpuSnapshot, CpuWindow
from bench.harness.servers import LOOPBACK, Tubeq

SMALL_GROUPS = 50
SMALL_JOBS = 10
FIRST = 600  # the reservations looked at for fairness
PIPELINE = 500  # put-with lines sent before their replies are read
IN_FLIGHT = 16  # the consumer's reserves sent at once
MAX_MISSES = 1000  # reserves answered TIMED_OUT (Redis slower than their grace) before giving up
PHASE_TIMEOUT_S = 600.0


class Conn:
    """One blocking protocol connection that reads whole replies."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((LOOPBACK, port), timeout=PHASE_TIMEOUT_S)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk
        end = self.buffer.index(b"\r\n")
        out, self.buffer = self.buffer[:end], self.buffer[end + 2:]
        return out

    def body(self, size: int) -> bytes:
        while len(self.buffer) < size + 2:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:size], self.buffer[size + 2:]
        return out

    def close(self) -> None:
        self.sock.close()


def load(big: int) -> list[bytes]:
    """The groups of the jobs in put order: the big group's, then the small groups' in turn."""
    small = [b"s%d" % g for _ in range(SMALL_JOBS) for g in range(SMALL_GROUPS)]
    return [b"big"] * big + small


def fill(conn: Conn, tube: str, groups: list[bytes], grouped: bool) -> None:
    """Put one job per entry of ``groups`` (its body: its group), with group= when grouped."""
    conn.send(b"use %s\r\n" % tube.encode())
    assert conn.line().startswith(b"USING")
    for start in range(0, len(groups), PIPELINE):
        chunk = groups[start:start + PIPELINE]
        conn.send(b"".join(
            b"put-with 0 0 600 %d%s\r\n%s\r\n" % (len(g), b" group=" + g if grouped else b"", g)
            for g in chunk))
        for _ in chunk:
            reply = conn.line()
            assert reply.startswith(b"INSERTED"), reply


def consume(conn: Conn, tube: str, count: int) -> list[bytes]:
    """Reserve and delete ``count`` jobs of ``tube``; the bodies (groups) in reserve order."""
    conn.send(b"watch %s\r\nignore default\r\n" % tube.encode())
    assert conn.line().startswith(b"WATCHING") and conn.line().startswith(b"WATCHING")
    got: list[bytes] = []
    misses = 0
    while len(got) < count:
        n = min(IN_FLIGHT, count - len(got))
        conn.send(b"reserve-with-timeout 0\r\n" * n)
        ids = []
        for _ in range(n):
            words = conn.line().split()
            if words[0] == b"TIMED_OUT":
                # Redis took longer than the reserve's grace (tubeq.server.reserves
                # RESERVE_GRACE_S) on a loaded host: the job it grants goes to a later reserve.
                misses += 1
                if misses > MAX_MISSES:
                    raise RuntimeError(f"{misses} reserves timed out: is the tube empty?")
                continue
            assert words[0] == b"RESERVED", words
            ids.append(words[1])
            got.append(conn.body(int(words[2])))
        conn.send(b"".join(b"delete %s\r\n" % i for i in ids))
        for _ in ids:
            assert conn.line() == b"DELETED"
    return got


@dataclass(frozen=True)
class Phase:
    jobs: int
    seconds: float
    cpu: CpuWindow

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    def us_per_job(self, label: str) -> float:
        percent = self.cpu.percent_by_label.get(label) or 0.0
        return percent / 100 * self.seconds / self.jobs * 1e6


def timed(server: Tubeq, jobs: int, work: object) -> Phase:
    start, t0 = CpuSnapshot.take(server.pids), time.monotonic()
    assert callable(work)
    work()
    seconds = time.monotonic() - t0
    return Phase(jobs, seconds, CpuWindow.between(start, CpuSnapshot.take(server.pids)))


@dataclass(frozen=True)
class Run:
    small_in_first: int  # jobs of the small groups among the first FIRST reservations
    last_small_at: int  # the place (1-based) of the last job of a small group reserved
    put: Phase
    take: Phase


def run_one(server: Tubeq, grouped: bool, big: int, count: int) -> Run:
    tube = "grouped" if grouped else "plain"
    groups = load(big)
    producer, consumer = Conn(server.port), Conn(server.port)
    try:
        put = timed(server, len(groups), lambda: fill(producer, tube, groups, grouped))
        order: list[bytes] = []
        take = timed(server, count, lambda: order.extend(consume(consumer, tube, count)))
    finally:
        producer.close()
        consumer.close()
    small = [i for i, g in enumerate(order) if g != b"big"]
    return Run(sum(1 for i in small if i < FIRST), small[-1] + 1 if small else 0, put, take)


def median(values: list[float]) -> float:
    return statistics.median(values)


def _place(at: float, count: int) -> str:
    return f"{at:,.0f}" if at else f"none in {count:,}"


def table(runs: dict[bool, list[Run]], big: int, count: int) -> str:
    rows = ["| tube | small-group jobs in the first 600 (of 500) | last small-group job at | "
            "fill jobs/s | consume jobs/s | consume CPU/job redis | consume CPU/job tubeq | "
            "other cores (fill, consume) |",
            "|---|---|---|---|---|---|---|---|"]
    for grouped in (True, False):
        rs = runs[grouped]
        rows.append(
            f"| {'with groups' if grouped else 'without groups'} "
            f"| {median([r.small_in_first for r in rs]):.0f} "
            f"| {_place(median([r.last_small_at for r in rs]), count)} "
            f"| {median([r.put.rate for r in rs]):,.0f} "
            f"| {median([r.take.rate for r in rs]):,.0f} "
            f"| {median([r.take.us_per_job('redis') for r in rs]):.1f} us "
            f"| {median([r.take.us_per_job('tubeq') for r in rs]):.1f} us "
            f"| {median([r.put.cpu.other_cores for r in rs]):.2f}, "
            f"{median([r.take.cpu.other_cores for r in rs]):.2f} |")
    ratio = (median([r.take.rate for r in runs[True]])
             / median([r.take.rate for r in runs[False]]))
    each = ", ".join(f"{g.take.rate / p.take.rate:.2f}"
                     for g, p in zip(runs[True], runs[False], strict=True))
    rows.append("")
    rows.append(f"Consume throughput with groups / without: {ratio:.2f}x (median of each; per "
                f"repetition {each}). Load: one group of {big:,} jobs then {SMALL_GROUPS} "
                f"groups of {SMALL_JOBS}; {count:,} jobs consumed per tube.")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.group_bench",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--big", type=int, default=100_000)
    p.add_argument("--consume", type=int, default=20_000)
    p.add_argument("--quick", action="store_true", help="10,000 big, 2,000 consumed, 1 rep")
    p.add_argument("--write", action="store_true", help="write bench/RESULTS-groups.md")
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/logs-groups"))
    args = p.parse_args(argv)
    if args.quick:
        args.big, args.consume, args.reps = 10_000, 2_000, 1
    cpu = cpu_model()
    start_load = os.getloadavg()[0]
    print(f"cpu: {cpu}; load average {os.getloadavg()}", flush=True)
    runs: dict[bool, list[Run]] = {True: [], False: []}
    for rep in range(args.reps):
        for grouped in ((True, False) if rep % 2 == 0 else (False, True)):
            server = Tubeq(args.log_dir)
            try:
                server.start()
                r = run_one(server, grouped, args.big, args.consume)
            finally:
                server.stop()
            runs[grouped].append(r)
            print(f"rep {rep + 1} {'grouped' if grouped else 'plain  '}: small in first "
                  f"{FIRST} {r.small_in_first}, last small at {r.last_small_at}, fill "
                  f"{r.put.rate:,.0f}/s, consume {r.take.rate:,.0f}/s (other cores "
                  f"{r.take.cpu.other_cores:.2f})", flush=True)
    text = table(runs, args.big, args.consume)
    print(text)
    out = (Path("bench/out/groups-quick.md") if args.quick
           else REPO_ROOT / "bench" / "RESULTS-groups.md" if args.write else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        command = " ".join(["python -m bench.group_bench", *(argv or sys.argv[1:])])
        out.write_text(f"# Groups inside a tube: fairness and cost\n\n`{command}`, "
                       f"{time.strftime('%Y-%m-%d', time.gmtime())}, cpu {cpu}, load "
                       f"average {start_load:.2f} at the start, {os.getloadavg()[0]:.2f} at the "
                       f"end (a shared machine).\n\n"
                       f"{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
