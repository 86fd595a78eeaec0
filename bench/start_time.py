"""Start time against beanstalkd: exec to a listening port, exec to the first reply.

    .venv/bin/python -m bench.start_time [--runs 20] [--write]     (make bench-start)

Each run spawns the server on a free loopback port and, from the instant before the exec,
tries to connect every 0.5 ms; the connect that succeeds is "listening" (the kernel accepts
once the socket listens, served or not), and that connection at once sends ``list-tubes`` (a
Redis round trip for tubeq) and waits for the first byte of the answer: "first reply". Then
SIGTERM, and the next run. Rows:

* beanstalkd;
* tubeq --redis on a redis-server that already holds its Lua library (a restart: what a
  systemd restart, a container health check or a test that spawns a server pays);
* tubeq on its own private redis-server (``make run``'s shape; a fresh --data-dir each run, so
  each run starts the redis-server and loads the library into it);
* tubeq --redis with an empty Lua build cache (the first start after an install or after a .lua
  file changed: the scripts are assembled, then kept).

The figures are medians (and min-max) of ``--runs`` runs after one untimed run of each row
(Python's bytecode caches and the Lua build cache are written then, as on any machine after the
first start), with PYTHONDONTWRITEBYTECODE dropped from the servers' environment. The server's
CPU time for the whole run (start, one reply, stop; from wait4) is beside them: the one figure a
busy host does not inflate. ``--write`` renders bench/RESULTS-start.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.harness.machine import cpu_model
from bench.harness.paths import REPO_ROOT
from tubeq.redisio.process import RedisProcess, free_port

RESULTS = REPO_ROOT / "bench" / "RESULTS-start.md"
POLL_S = 0.0005
GIVE_UP_S = 30.0


@dataclass
class Run:
    listening_ms: float
    reply_ms: float
    cpu_ms: float  # the server's user + system time, start to exit


def measure(argv: list[str], port: int, env: dict[str, str] | None = None) -> Run:
    """One start of ``argv`` (which listens on 127.0.0.1:``port``), timed from the exec."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            sock = socket.socket()
            try:
                sock.connect(("127.0.0.1", port))
                break
            except OSError:
                sock.close()
                if proc.poll() is not None or time.perf_counter() - t0 > GIVE_UP_S:
                    raise RuntimeError(
                        f"{argv[0]} never listened (exit {proc.returncode})") from None
                time.sleep(POLL_S)
        listening = time.perf_counter()
        with sock:
            sock.settimeout(GIVE_UP_S)
            sock.sendall(b"list-tubes\r\n")
            if not sock.recv(1):
                raise RuntimeError(f"{argv[0]} closed the connection without a reply")
            replied = time.perf_counter()
    finally:
        if proc.returncode is None:  # not reaped by poll(): wait4 gives its CPU time
            proc.send_signal(signal.SIGTERM)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(1000 * (listening - t0), 1000 * (replied - t0),
               1000 * (usage.ru_utime + usage.ru_stime))


@dataclass
class Row:
    label: str
    runs: list[Run]

    def cells(self) -> list[str]:
        def spread(values: list[float]) -> str:
            return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"

        return [self.label, spread([r.listening_ms for r in self.runs]),
                spread([r.reply_ms for r in self.runs]),
                f"{statistics.median([r.cpu_ms for r in self.runs]):.0f}"]


def server_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return {**env, **extra}


def rows(runs: int, work: Path, redis_url: str) -> list[Row]:
    tubeq = [sys.executable, "-m", "tubeq", "-l", "127.0.0.1"]
    counter = iter(range(1_000_000))

    def beanstalkd(port: int) -> Run:
        return measure(["beanstalkd", "-l", "127.0.0.1", "-p", str(port)], port)

    def on_redis(port: int) -> Run:
        return measure([*tubeq, "-p", str(port), "--redis", redis_url, "--prefix", "bench-start"],
                       port, server_env())

    def private_redis(port: int) -> Run:
        data = work / f"data-{next(counter)}"
        return measure([*tubeq, "-p", str(port), "--data-dir", str(data)], port, server_env())

    def cold_cache(port: int) -> Run:
        cache = work / f"cache-{next(counter)}"
        return measure([*tubeq, "-p", str(port), "--redis", redis_url, "--prefix", "bench-start"],
                       port, server_env(XDG_CACHE_HOME=str(cache)))

    cases: list[tuple[str, Callable[[int], Run]]] = [
        ("beanstalkd", beanstalkd),
        ("tubeq --redis (Redis has the library)", on_redis),
        ("tubeq, private redis-server (fresh data dir)", private_redis),
        ("tubeq --redis, empty Lua build cache", cold_cache),
    ]
    result = []
    for label, run in cases:
        run(free_port())  # untimed: bytecode and Lua caches written, the library loaded
        result.append(Row(label, [run(free_port()) for _ in range(runs)]))
        print(" | ".join(result[-1].cells()), flush=True)
    return result


def render(table: list[Row], runs: int, cpu: str, load: tuple[float, float]) -> str:
    head = ["server", "exec to listening, ms", "exec to first reply, ms",
            "server CPU per run, ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in table]
    return "\n".join([
        "# Start time: tubeq against beanstalkd (issue 31)", "",
        "Written by `make bench-start` (bench/start_time.py: how each figure is taken). "
        f"Median (min-max) of {runs} runs each, after one untimed run.", "",
        f"- CPU: {cpu}, {os.cpu_count()} cores; load average {load[0]:.2f} before, "
        f"{load[1]:.2f} after (other work on the host inflates the wall times, not the CPU "
        "column)",
        f"- Python {sys.version.split()[0]}", "",
        *lines, "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--write", action="store_true", help=f"write {RESULTS.name}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tubeq-start-") as tmp:
        work = Path(tmp)
        redis = RedisProcess(work / "redis")
        redis.start()
        try:
            before = os.getloadavg()[0]
            table = rows(args.runs, work, redis.url)
            after = os.getloadavg()[0]
        finally:
            redis.stop()
    text = render(table, args.runs, cpu_model(), (before, after))
    if args.write:
        RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
