"""What metrics cost in instructions: tubeq under callgrind, a lockstep load, metrics on and off.

    .venv/bin/python -m bench.probes.metrics_instructions [--base REV] [--rounds 150] [--batch 16]

Owns: a load whose every step the server sees the same way each run, and the instruction count
per job of the tubeq process under it, read from valgrind's callgrind (counting only while the
measured rounds run: ``callgrind_control -i on/off``, so start-up and warm-up are left out).

Why: on a shared 2-core machine a throughput or CPU-time figure swings with the other tenants
by more than the few per cent metrics cost (bench/RESULTS-metrics.md). An instruction count
does not: it is the same however the cores are shared, as long as the server sees the same
reads. So the load is lockstep: one producer and one consumer connection; each round the
producer writes ``--batch`` puts in one write and reads their replies, then the consumer
writes as many ``reserve-with-timeout 0`` and reads them, then the deletes of the jobs it got.
Each write is one read and one turn of the server (one put_many, one reserve call, one
delete_many, one write of replies), whatever the machine does meanwhile. What is not per job
is tubeq's timers (heartbeat, scheduler: ~0.6 M instructions per second under callgrind), which
a run pays per second of wall time, and a busy machine stretches the run: so each run first
counts ``IDLE_S`` seconds of the idle server, and the rate it finds, times the run's wall
time, is taken off the run's count. ``--mode put`` does the puts alone (the put rows).

Each of "off" (``--slow-ms 0``: no hook, the default) and "on" (``--metrics 127.0.0.1:0``:
every hook, the slow log at its default) runs on this tree's tubeq and, with ``--base REV``,
on that revision's (a ``git archive`` snapshot), each on a fresh private Redis, events on as
in ``make bench``. Prints instructions per job of each and on / off. The tubeq processes are
this probe's children, stopped by PID; every load is bounded by ``--rounds``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness.machine import cpu_model
from bench.harness.paths import OUT_DIR
from bench.harness.servers import (
    EVENTS_ON,
    METRICS_OFF,
    METRICS_ON,
    Tubeq,
    snapshot_revision,
    snapshot_tubeq,
)

KINDS = {"off": EVENTS_ON + METRICS_OFF, "on": EVENTS_ON + METRICS_ON}
# Python under callgrind starts ~50x slower than natively.
STARTUP_TIMEOUT_S = 300.0
WARMUP_ROUNDS = 20
BODY = b"x" * 100
# A round's replies must come within this, or the run fails (callgrind slows tubeq ~50x).
ROUND_TIMEOUT_S = 60.0
# Seconds of the idle server counted before the load, for the rate of its timers.
IDLE_S = 3.0


async def _replies(reader: asyncio.StreamReader, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        line = await asyncio.wait_for(reader.readline(), ROUND_TIMEOUT_S)
        words = line.split()
        if words and words[0] == b"RESERVED":
            line += await reader.readexactly(int(words[2]) + 2)
        out.append(line)
    return out


async def _lockstep(port: int, mode: str, rounds: int, batch: int) -> int:
    """``rounds`` rounds of ``batch`` jobs; returns the jobs the server completed."""
    put_r, put_w = await asyncio.open_connection("127.0.0.1", port)
    take_r, take_w = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    try:
        put = b"put 0 0 60 %d\r\n%s\r\n" % (len(BODY), BODY)
        for _ in range(rounds):
            put_w.write(put * batch)
            if not all(r.startswith(b"INSERTED") for r in await _replies(put_r, batch)):
                raise RuntimeError("a put failed")
            if mode == "put":
                done += batch
                continue
            take_w.write(b"reserve-with-timeout 0\r\n" * batch)
            got = [int(r.split()[1]) for r in await _replies(take_r, batch)
                   if r.startswith(b"RESERVED")]
            take_w.write(b"".join(b"delete %d\r\n" % i for i in got))
            done += sum(r == b"DELETED\r\n" for r in await _replies(take_r, len(got)))
    finally:
        for w in (put_w, take_w):
            w.close()
    return done


def _callgrind(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _totals(dump: Path) -> int:
    found = re.search(r"^totals: (\d+)", dump.read_text(errors="replace"), re.MULTILINE)
    return int(found[1]) if found else 0


def one_run(code_dir: Path, flags: tuple[str, ...], mode: str, rounds: int, batch: int,
            out: Path) -> dict[str, float]:
    """Instructions per job of a fresh tubeq from ``code_dir`` with ``flags``: ``per_job``
    with the idle rate taken off, ``raw`` without, and the ``idle_per_s`` rate."""
    for old in out.parent.glob(out.name + "*"):
        old.unlink()
    server = Tubeq(out.parent, code_dir=code_dir, flags=flags, startup_timeout_s=STARTUP_TIMEOUT_S,
                   wrapper=("valgrind", "--tool=callgrind", "--instr-atstart=no",
                            f"--callgrind-out-file={out}"))
    server.start()
    try:
        pid = server.pids["tubeq"]
        asyncio.run(_lockstep(server.port, mode, WARMUP_ROUNDS, batch))
        _callgrind(pid, "-i", "on")
        started = time.monotonic()
        time.sleep(IDLE_S)
        _callgrind(pid, "-d")  # part 1: the idle server (a dump zeroes the counts)
        idle_s = time.monotonic() - started
        started = time.monotonic()
        jobs = asyncio.run(_lockstep(server.port, mode, rounds, batch))
        _callgrind(pid, "-i", "off")
        load_s = time.monotonic() - started
        _callgrind(pid, "-d")  # part 2: the load
    finally:
        server.stop()
    if not jobs:
        raise RuntimeError("no job completed")
    idle_rate = _totals(out.parent / f"{out.name}.1") / idle_s
    load = _totals(out.parent / f"{out.name}.2")
    return {"per_job": (load - idle_rate * load_s) / jobs, "raw": load / jobs,
            "idle_per_s": idle_rate}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.metrics_instructions",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--base", default=None, help="also measure this git revision's tubeq")
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--mode", choices=("cycle", "put"), default="cycle")
    p.add_argument("--repetitions", type=int, default=1, help="runs of each, medians taken")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (callgrind) is not installed: apt-get install valgrind", file=sys.stderr)
        return 1
    work = OUT_DIR / "metrics-instructions"
    shutil.rmtree(work, ignore_errors=True)
    trees = {"new": snapshot_tubeq(work / "new")}
    if args.base:
        trees["base"] = snapshot_revision(args.base, work / "base")
    figures: dict[tuple[str, str], float] = {}
    runs: dict[tuple[str, str], list[float]] = {}
    for rep in range(args.repetitions):  # interleaved: base and new, on and off, in turn
        for tree, code_dir in trees.items():
            for kind, flags in KINDS.items():
                run = one_run(code_dir, flags, args.mode, args.rounds, args.batch,
                              work / f"callgrind-{tree}-{kind}.out")
                runs.setdefault((tree, kind), []).append(run["per_job"])
                print(f"rep {rep} {tree:<4} metrics {kind:<3}: {run['per_job']:10,.0f} "
                      f"instructions/job (raw {run['raw']:,.0f}, idle "
                      f"{run['idle_per_s'] / 1e6:.2f} M/s)", flush=True)
    for key, values in runs.items():
        figures[key] = statistics.median(values)
    print(f"cpu: {cpu_model()}; {args.mode}, lockstep batches of {args.batch}, "
          f"{args.rounds} rounds")
    for tree in trees:
        on, off = figures[tree, "on"], figures[tree, "off"]
        print(f"{tree}: on {on:,.0f}, off {off:,.0f} (medians): on - off {on - off:+,.0f} "
              f"instructions/job ({on / off:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
