"""The peers benchmark: every system, fresh servers, one producer then one worker -> results.

    make bench-peers                        full: 3 repetitions (bench/RESULTS-peers.md)
    .venv/bin/python -m bench.peers --quick 1 repetition, small counts (bench/out/)
    .venv/bin/python -m bench.peers --render bench/out/peers-<stamp>.json   re-render only

Owns: the systems and their order, the sizes, the per-run bounds, and the CPU accounting of the
server side. A run of one system: start its servers fresh (a private redis-server on a free
loopback port, no persistence; tubeq on its own private Redis; beanstalkd alone), run the
producer process (``single`` jobs one at a time, each awaited, then ``batched`` jobs through the
system's batch API), then the worker process (concurrency 32, a handler that does nothing)
until every job was handled and the queue reads empty; stop the servers by PID. Repetitions are
interleaved (each walks every system, the order reversed every other one).

Server CPU comes from /proc/PID/stat of redis-server, tubeq and beanstalkd, sampled every
SAMPLE_S by a thread here and interpolated at the instants the drivers report (CLOCK_MONOTONIC
is one clock for every process of the machine); the client side is each driver's own CPU. A
system that fails to install or to run is recorded as failed with its error, never dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness import machine
from bench.harness.bench import QUIET_CORES, Bench, Scale, alternate
from bench.harness.machine import machine_and_versions
from bench.harness.paths import BENCH_DIR, OUT_DIR, REPO_ROOT
from bench.harness.procstat import (
    CLOCK_TICKS_PER_S,
    machine_busy_ticks,
    process_cpu_ticks,
    wait_until_quiet,
)
from bench.harness.servers import EVENTS_ON, Beanstalkd, Tubeq, snapshot_commit
from bench.peers import envs, report
from tubeq.redisio.process import RedisProcess

RESULTS_PATH = BENCH_DIR / "RESULTS-peers.md"
QUICK_RESULTS_PATH = OUT_DIR / "RESULTS-peers-quick.md"
CONCURRENCY = 32
CHUNK = 1000
SAMPLE_S = 0.02
# Before each system, wait this long at most for the machine to use < QUIET_CORES.
QUIET_WAIT_S = 2.0
# A driver process is killed this long after its own time limit.
KILL_SLACK_S = 15.0


@dataclass(frozen=True)
class System:
    """One peer: how its clients run and what its server side is."""

    name: str
    env: str  # "main" (this venv: tubeq's client), "node", or a bench-peer-<env> extra
    module: str  # the driver module (bench/peers/drivers/<module>.py); unused for node
    server: str  # "redis", "tubeq" or "beanstalkd"
    batch_api: bool  # False: every job is enqueued one at a time and "batched" is n/a
    concurrency_note: str = ""
    # A tubeq server of another revision (``--base``): the directory its package runs from,
    # and the commit; "": the working tree's.
    code_dir: str = ""
    commit: str = ""


SYSTEMS = (
    System("tubeq", "main", "bundled", "tubeq", True),
    System("beanstalkd", "main", "bundled", "beanstalkd", True),
    System("BullMQ", "node", "", "redis", True),
    System("saq", "saq", "saq_", "redis", True),
    System("arq", "arq", "arq_", "redis", True),
    System("RQ", "rq", "rq_", "redis", True,
           "SimpleWorker: one job at a time (RQ has no concurrency within a worker)"),
    System("Celery", "celery", "celery_", "redis", False),
    System("Dramatiq", "dramatiq", "dramatiq_", "redis", False),
)
# Redis-backed peers: the target compares tubeq with the fastest of these.
REDIS_PEERS = tuple(s.name for s in SYSTEMS if s.server == "redis")


@dataclass(frozen=True)
class PeersScale(Scale):
    single: int  # jobs enqueued one at a time (systems with a batch API)
    batched: int  # jobs enqueued through the batch API
    time_limit_s: float  # per driver process


FULL = PeersScale("full", repetitions=3, single=2_000, batched=20_000, time_limit_s=420.0)
QUICK = PeersScale("quick", repetitions=1, single=300, batched=2_000, time_limit_s=60.0)


# -- CPU sampling -------------------------------------------------------------------------------

class Sampler:
    """A thread that records (instant, machine busy ticks, ticks per server label)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.samples: list[tuple[float, int, dict[str, int | None]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._take()

    def _take(self) -> None:
        ticks = {label: process_cpu_ticks(pid) for label, pid in self.pids.items()}
        self.samples.append((time.monotonic(), machine_busy_ticks(), ticks))

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._take()

    def _at(self, t: float, index: int) -> float | None:
        """Ticks of series ``index`` (-1: machine, else a label position) at instant ``t``."""
        labels = list(self.pids)

        def value(sample: tuple[float, int, dict[str, int | None]]) -> int | None:
            return sample[1] if index < 0 else sample[2][labels[index]]

        before = [s for s in self.samples if s[0] <= t]
        after = [s for s in self.samples if s[0] >= t]
        if not before or not after:
            return None
        a, b = before[-1], after[0]
        va, vb = value(a), value(b)
        if va is None or vb is None:
            return None
        if b[0] == a[0]:
            return float(va)
        return va + (vb - va) * (t - a[0]) / (b[0] - a[0])

    def cpu_s(self, t0: float, t1: float) -> dict[str, float | None]:
        """CPU seconds per label between t0 and t1, and "machine" (all busy time)."""
        out: dict[str, float | None] = {}
        for index, label in [(-1, "machine"), *enumerate(self.pids)]:
            a, b = self._at(t0, index), self._at(t1, index)
            out[label] = None if a is None or b is None else (b - a) / CLOCK_TICKS_PER_S
        return out


# -- one system ---------------------------------------------------------------------------------

class Servers:
    """The server side of one system's run, started fresh and stopped by PID."""

    def __init__(self, kind: str, log_dir: Path, code_dir: Path = REPO_ROOT) -> None:
        self.kind = kind
        self.redis: RedisProcess | None = None
        self.other: Tubeq | Beanstalkd | None = None
        if kind == "redis":
            self.redis = RedisProcess(Path(tempfile.mkdtemp(prefix="tubeq-peers-redis-")))
        elif kind == "tubeq":
            # tubeq as RESULTS.md runs it: lifecycle events on, as with its private Redis;
            # ``code_dir`` holds the tubeq package that runs (bench.peers.call --revision).
            self.other = Tubeq(log_dir, code_dir=code_dir, flags=EVENTS_ON)
        else:
            self.other = Beanstalkd(log_dir)

    def start(self) -> str:
        """Start; returns the URL the drivers connect to."""
        if self.redis is not None:
            self.redis.start()
            return self.redis.url
        assert self.other is not None
        self.other.start()
        return f"beanstalk://127.0.0.1:{self.other.port}"

    @property
    def pids(self) -> dict[str, int]:
        if self.redis is not None:
            assert self.redis.proc is not None
            return {"redis": self.redis.proc.pid}
        assert self.other is not None
        return self.other.pids

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.stop()
            shutil.rmtree(self.redis.data_dir, ignore_errors=True)
        if self.other is not None:
            self.other.stop()


def _driver_command(system: System, python: Path | None, node: list[str] | None, role: str,
                    url: str, single: int, batched: int, time_limit: float,
                    out: Path) -> list[str]:
    args = [role, "--url", url, "--single", str(single), "--batched", str(batched),
            "--chunk", str(CHUNK), "--concurrency", str(CONCURRENCY),
            "--time-limit", str(time_limit), "--out", str(out)]
    if system.env == "node":
        assert node is not None
        return [*node, *args]
    assert python is not None
    return [str(python), "-m", "bench.peers.driver", system.module, *args]


def _run_driver(command: list[str], log: Path, out: Path, time_limit: float) -> dict[str, Any]:
    """Run one driver process to its end (killed by PID after its limit plus slack)."""
    out.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    with open(log, "ab") as sink:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                cwd=REPO_ROOT, env=env)
        try:
            proc.wait(time_limit + KILL_SLACK_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return {"error": f"killed after {time_limit + KILL_SLACK_S:.0f} s"}
    if not out.exists():
        tail = log.read_text(errors="replace")[-600:]
        return {"error": f"exited {proc.returncode} without a result: {tail}"}
    result: dict[str, Any] = json.loads(out.read_text())
    return result


class PeersBench(Bench):
    """Each system's producer then worker, on fresh servers, repetitions interleaved."""

    def __init__(self, scale: PeersScale, log: Callable[[str], None]) -> None:
        super().__init__(scale, log, log_name="peers-logs", quiet_wait_s=QUIET_WAIT_S)
        self.scale: PeersScale = scale
        self.setup: dict[str, dict[str, Any]] = {}

    def prepare(self, system: System) -> tuple[Path | None, list[str] | None]:
        """Install the system's client (once); raises envs.EnvError."""
        if system.env == "main":
            versions = _main_versions(system)
            if system.commit:  # (the client is the working tree's: its version is the tubeq one)
                versions = {"tubeq server": f"commit {system.commit} (git archive)",
                            "tubeq client": versions["tubeq"],
                            **{k: versions[k] for k in ("uvloop", "hiredis")}}
            self.setup.setdefault(system.name, {"versions": versions})
            return Path(sys.executable), None
        if system.env == "node":
            command = envs.node_env()
            self.setup.setdefault(system.name, {"versions": envs.node_versions()})
            return None, command
        python = envs.python_env(system.env)
        self.setup.setdefault(system.name,
                              {"versions": envs.python_versions(python, system.env)})
        return python, None

    def run_system(self, system: System, rep: int) -> None:
        entry: dict[str, Any] = {"system": system.name, "rep": rep}
        try:
            python, node = self.prepare(system)
        except envs.EnvError as exc:
            self.setup[system.name] = {"error": f"install failed: {exc}"}
            entry["error"] = f"install failed: {exc}"
            self._record(entry)
            return
        single, batched = self.scale.single, self.scale.batched
        if not system.batch_api:
            single, batched = single + batched, 0
        entry["sizes"] = {"single": single, "batched": batched}
        entry["quiet_before"] = round(wait_until_quiet(QUIET_CORES, QUIET_WAIT_S), 3)
        servers = Servers(system.server, self.log_dir,
                          Path(system.code_dir) if system.code_dir else REPO_ROOT)
        log = self.log_dir / f"{system.name}-{rep}.log"
        out = self.log_dir / f"{system.name}-{rep}.json"
        try:
            url = servers.start()
            with Sampler(servers.pids) as sampler:
                for role in ("produce", "consume"):
                    command = _driver_command(system, python, node, role, url, single, batched,
                                              self.scale.time_limit_s, out)
                    entry[role] = _run_driver(command, log, out, self.scale.time_limit_s)
                    if "error" in entry[role]:
                        entry["error"] = f"{role}: {entry[role]['error']}"
                        break
            entry["server_cpu"] = self._server_cpu(sampler, entry)
        except Exception as exc:  # a broken run is reported, the others go on
            entry["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            servers.stop()
        self._record(entry)

    def _server_cpu(self, sampler: Sampler, entry: dict[str, Any]) -> dict[str, Any]:
        """Server CPU seconds (per label, and the machine's) over each measured window."""
        windows: dict[str, tuple[float, float]] = {}
        produced = entry.get("produce") or {}
        for phase in ("single", "batched"):
            if produced.get(phase):
                windows[phase] = (produced[phase]["t0"], produced[phase]["t1"])
        consumed = entry.get("consume") or {}
        if consumed.get("first_start") and consumed.get("last_done"):
            windows["processing"] = (consumed["first_start"], consumed["last_done"])
        return {name: sampler.cpu_s(t0, t1) for name, (t0, t1) in windows.items()}

    def _record(self, entry: dict[str, Any]) -> None:
        self.runs.append(entry)
        summary = report.run_line(entry)
        self.log(f"[{self.elapsed():6.0f}s] {entry['system']:<10} rep "
                 f"{entry['rep']}: {summary}")

    def run(self, systems: tuple[System, ...]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for rep in range(self.scale.repetitions):
            for system in alternate(systems, rep):
                self.run_system(system, rep)


def _main_versions(system: System) -> dict[str, str]:
    versions = machine_and_versions()
    if system.name == "beanstalkd":
        return {"server": versions["beanstalkd"], "tubeq client": versions["tubeq"],
                "uvloop": versions["uvloop"]}
    return {k: versions[k] for k in ("tubeq", "uvloop", "hiredis")}


def uptime() -> str:
    """``uptime``'s line: the machine's load averages when the run started or ended."""
    done = subprocess.run(["uptime"], capture_output=True, text=True, timeout=10, check=False)
    return done.stdout.strip() or "unknown"


def base_system(revision: str) -> System:
    """``--base``: the tubeq row again with the tubeq server of ``revision`` (from ``git
    archive``; the client is the working tree's), so one run is an A/B of the server."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    code_dir, commit = snapshot_commit(revision, OUT_DIR / f"peers-code-{stamp}-base")
    return System(f"tubeq@{commit}", "main", "bundled", "tubeq", True,
                  f"as the tubeq row, on the tubeq server of {commit}",
                  code_dir=str(code_dir), commit=commit)


def run(scale: PeersScale, output: Path, systems: tuple[System, ...]) -> Path:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bench = PeersBench(scale, log)
    started_at = datetime.now(UTC)
    meta = {"scale": asdict(scale), "started": started_at.isoformat(timespec="seconds"),
            "cpu_model": machine.cpu_model(), "machine": machine_and_versions(),
            "uptime_before": uptime(), "concurrency": CONCURRENCY, "chunk": CHUNK,
            "committed": machine.committed_summary(RESULTS_PATH)}
    log(f"peers: {scale.name} run on {meta['cpu_model']}; {meta['uptime_before']}")
    bench.run(systems)
    meta["uptime_after"] = uptime()
    meta["elapsed_s"] = round(time.monotonic() - bench.started, 1)
    results = {"meta": meta, "setup": bench.setup, "runs": bench.runs,
               "systems": [asdict(s) for s in systems]}
    raw = OUT_DIR / f"peers-{bench.stamp}.json"
    raw.write_text(json.dumps(results, indent=1))
    report.write(results, output)
    log(f"peers: done in {meta['elapsed_s'] / 60:.1f} min; raw {raw.relative_to(REPO_ROOT)}, "
        f"report {output}")
    return output


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--quick", action="store_true",
                   help="1 repetition, small counts (development); writes bench/out/")
    p.add_argument("--repetitions", type=int, default=None, help="override the scale's")
    p.add_argument("--systems", default=None,
                   help="comma-separated subset, e.g. tubeq,BullMQ (default: all)")
    p.add_argument("--output", type=Path, default=None,
                   help="report path (default bench/RESULTS-peers.md; quick: bench/out/)")
    p.add_argument("--base", default=None, metavar="REV",
                   help="also run tubeq's server as of REV (git archive; the client stays this "
                        "tree's), as a row of its own, interleaved: an A/B of the server")
    p.add_argument("--render", type=Path, default=None, metavar="RESULTS_JSON",
                   help="only re-render a saved results file")
    args = p.parse_args(argv)
    output = args.output or (QUICK_RESULTS_PATH if args.quick else RESULTS_PATH)
    if args.render is not None:
        report.write(json.loads(args.render.read_text()), output)
        return 0
    scale = QUICK if args.quick else FULL
    if args.repetitions:
        scale = PeersScale(scale.name, args.repetitions, scale.single, scale.batched,
                           scale.time_limit_s)
    systems = SYSTEMS
    if args.systems:
        wanted = {name.strip().lower() for name in args.systems.split(",")}
        systems = tuple(s for s in SYSTEMS if s.name.lower() in wanted)
        if not systems:
            p.error(f"no system among {[s.name for s in SYSTEMS]} matches {args.systems!r}")
    base = None
    if args.base is not None:  # right after the tubeq row: each repetition runs them in turn
        base = base_system(args.base)
        at = next((i + 1 for i, s in enumerate(systems) if s.name == "tubeq"), 0)
        systems = (*systems[:at], base, *systems[at:])
    try:
        run(scale, output, systems)
    finally:
        if base is not None and base.code_dir:  # the snapshot (git archive) of the revision
            shutil.rmtree(base.code_dir, ignore_errors=True)
    return 0
