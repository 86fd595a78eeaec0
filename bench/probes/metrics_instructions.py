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
delete_many, one write of replies), whatever the machine does meanwhile. Timers (heartbeat,
the scheduler) add a little that is not per job; runs of the same tubeq differ by well under
1 %. ``--mode put`` does the puts alone (the put rows).

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
import subprocess
import sys
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


def one_run(code_dir: Path, flags: tuple[str, ...], mode: str, rounds: int, batch: int,
            out: Path) -> float:
    """Instructions per job of a fresh tubeq from ``code_dir`` with ``flags``."""
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
        jobs = asyncio.run(_lockstep(server.port, mode, rounds, batch))
        _callgrind(pid, "-i", "off")
        _callgrind(pid, "-d")
    finally:
        server.stop()
    totals = 0
    for dump in out.parent.glob(out.name + "*"):
        found = re.search(r"^totals: (\d+)", dump.read_text(errors="replace"), re.MULTILINE)
        totals += int(found[1]) if found else 0
    if not jobs:
        raise RuntimeError("no job completed")
    return totals / jobs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.metrics_instructions",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--base", default=None, help="also measure this git revision's tubeq")
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--mode", choices=("cycle", "put"), default="cycle")
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
    for tree, code_dir in trees.items():
        for kind, flags in KINDS.items():
            figures[tree, kind] = one_run(code_dir, flags, args.mode, args.rounds, args.batch,
                                          work / f"callgrind-{tree}-{kind}.out")
            print(f"{tree:<4} metrics {kind:<3}: {figures[tree, kind]:10,.0f} instructions/job",
                  flush=True)
    print(f"cpu: {cpu_model()}; {args.mode}, lockstep batches of {args.batch}, "
          f"{args.rounds} rounds")
    for tree in trees:
        on, off = figures[tree, "on"], figures[tree, "off"]
        print(f"{tree}: on - off {on - off:+,.0f} instructions/job ({on / off:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
