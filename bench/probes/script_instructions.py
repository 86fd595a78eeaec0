"""Instructions Redis executes per job, counted by valgrind (callgrind), for a deterministic A/B of
hot-path changes on a host whose timings drift by 2x within minutes.

    .venv/bin/python -m bench.probes.script_instructions [--base REV] [--jobs 2000] [--tubeq]

Per version (the working tree, and ``--base``'s tubeq when given), one private redis-server runs
under ``valgrind --tool=callgrind`` and one tubeq process (events on) on it; three phases, each
counted on its own (``callgrind_control --dump`` before and after): ``jobs / 4`` puts each
awaited alone through the bundled client, ``jobs`` puts by ``put_many`` of 500, then a push
consumer (``consume(concurrency=32)``) that deletes ``jobs + jobs / 4`` jobs. Printed: Redis's
instructions (callgrind's Ir) per job of each phase; with ``--tubeq`` the tubeq process runs
under callgrind too and its own figures follow. The counts leave out the kernel (syscalls),
cache misses and waiting, so they measure the code's own work, not time: a change that cuts
instructions may save less time, and one that cuts syscalls shows here not at all. Needs
valgrind (``apt-get install -y valgrind``). Loopback only; every process is started here and
stopped by its PID; each phase is bounded by ``PHASE_TIMEOUT_S``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench.harness.machine import cpu_model
from bench.harness.servers import LOOPBACK, snapshot_revision, snapshot_tubeq
from tubeq.client import Client, Job
from tubeq.redisio.process import RedisProcess, free_port

PHASE_TIMEOUT_S = 600.0
START_TIMEOUT_S = 180.0  # a Python process under callgrind starts ~50x slower
_TOTALS = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process on port {port} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on port {port} after {START_TIMEOUT_S:.0f} s")


class Counted:
    """A process under callgrind whose instructions are read phase by phase."""

    def __init__(self, command: list[str], out_dir: Path, name: str, **popen: object) -> None:
        self.out_dir, self.name = out_dir, name
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/{name}.out",
             *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)  # type: ignore[call-overload]

    def dump(self) -> int:
        """Instructions since the last dump (callgrind zeroes its counters at each one)."""
        before = set(self.out_dir.glob(f"{self.name}.out*"))
        subprocess.run(["callgrind_control", "--dump", str(self.proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for path in set(self.out_dir.glob(f"{self.name}.out*")) - before:
                found = _TOTALS.search(path.read_bytes())
                if found is not None:
                    return int(found[1])
            time.sleep(0.1)
        raise RuntimeError(f"callgrind wrote no dump for {self.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _lone_puts(port: int, n: int) -> None:
    client = Client(LOOPBACK, port)
    await client.connect()
    await client.use("probe")
    for _ in range(n):
        await client.put(b"{}")
    await client.aclose()


async def _batched_puts(port: int, n: int) -> None:
    client = Client(LOOPBACK, port)
    await client.connect()
    await client.use("probe")
    for start in range(0, n, 500):
        await client.put_many([b"{}"] * min(500, n - start))
    await client.aclose()


async def _consume(port: int, n: int) -> None:
    consumer = Client(LOOPBACK, port).consume("probe", concurrency=32)
    done, finished = 0, asyncio.Event()

    async def handler(job: Job) -> None:
        nonlocal done
        done += 1
        if done >= n:
            finished.set()

    runner = asyncio.create_task(consumer.run(handler))
    try:
        await asyncio.wait_for(finished.wait(), PHASE_TIMEOUT_S)
        await asyncio.sleep(1.0)  # the last deletes reach Redis
    finally:
        consumer.stop()
        await consumer.aclose()
        runner.cancel()


def measure(code_dir: Path, jobs: int, with_tubeq: bool) -> dict[str, dict[str, float]]:
    """Instructions per job of each phase: {"redis": {phase: Ir/job}, "tubeq": {...}}."""
    with tempfile.TemporaryDirectory(prefix="tubeq-ir-") as tmp:
        out = Path(tmp)
        redis = RedisProcess(out / "redis")
        redis.data_dir.mkdir()
        server = Counted(redis.command_line(), out, "redis")
        tubeq: Counted | subprocess.Popen[bytes] | None = None
        try:
            _wait_listening(redis.port, server.proc)
            port = free_port(LOOPBACK)
            command = [sys.executable, "-m", "tubeq", "-l", LOOPBACK, "-p", str(port),
                       "--redis", redis.url, "--events", "on", "--log-level", "warning"]
            env = {**os.environ, "PYTHONPATH": str(code_dir)}
            if with_tubeq:
                tubeq = Counted(command, out, "tubeq", cwd=code_dir, env=env)
                _wait_listening(port, tubeq.proc)
            else:
                tubeq = subprocess.Popen(command, cwd=code_dir, env=env,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                _wait_listening(port, tubeq)
            counted = {"redis": server, **({"tubeq": tubeq} if isinstance(tubeq, Counted) else {})}
            for c in counted.values():
                c.dump()  # start clean: what start-up cost is not a phase's
            phases = (("lone put", _lone_puts(port, jobs // 4), jobs // 4),
                      ("put_many", _batched_puts(port, jobs), jobs),
                      ("processing", _consume(port, jobs + jobs // 4), jobs + jobs // 4))
            result: dict[str, dict[str, float]] = {name: {} for name in counted}
            for phase, work, count in phases:
                uvloop.run(asyncio.wait_for(work, PHASE_TIMEOUT_S))
                for name, c in counted.items():
                    result[name][phase] = c.dump() / count
            return result
        finally:
            if isinstance(tubeq, Counted):
                tubeq.stop()
            elif tubeq is not None:
                tubeq.send_signal(signal.SIGTERM)
                tubeq.wait(30)
            server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.script_instructions",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--base", help="git revision of a base tubeq to count too")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--tubeq", action="store_true", help="count the tubeq process too")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        p.error("needs valgrind: apt-get install -y valgrind")
    with tempfile.TemporaryDirectory(prefix="tubeq-ir-code-") as tmp:
        versions = {"working tree": snapshot_tubeq(Path(tmp) / "head")}
        if args.base:
            versions["base " + args.base] = snapshot_revision(args.base, Path(tmp) / "base")
        print(f"{cpu_model()}; instructions per job (callgrind Ir), {args.jobs:,} jobs")
        for label, code in versions.items():
            for process, phases in measure(code, args.jobs, args.tubeq).items():
                figures = ", ".join(f"{phase} {ir:,.0f}" for phase, ir in phases.items())
                print(f"{label:>24} {process:>6}: {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
