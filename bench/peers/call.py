"""Request/reply among the peers: how fast a call comes back, one caller and 32 at once.

    .venv/bin/python -m bench.peers.call                    full: ~5 min (bench/out/)
    .venv/bin/python -m bench.peers.call --quick            small counts, ~1 min
    .venv/bin/python -m bench.peers.call --revision HEAD    tubeq (server and client) of HEAD
    .venv/bin/python -m bench.peers.call --systems tubeq,BullMQ --base REV
                                                            and tubeq of REV, a row of its own

Owns: the request/reply systems and their order, the sizes and bounds of a call run, and the
CPU accounting of its servers and worker. A call is a request put into a queue, run by a worker
whose function answers it upper-cased (an echo), and the answer back in the caller's hand, each
system through its own request/reply API (tubeq ``client.call``; beanstalkd's reply tubes;
BullMQ ``waitUntilFinished``; saq ``apply``; arq ``job.result()``; RQ ``latest_result``; Celery
``AsyncResult.get()`` with a Redis result backend: bench/peers/drivers/, and
bench/peers/node/bullmq_driver.js). A run of one system: its servers fresh (as bench.peers:
a private redis-server on a free loopback port, tubeq on its own, beanstalkd alone), one worker
process (concurrency 32; RQ one job at a time), then one caller process: a warm-up, the
``single`` phase (one caller, each call awaited before the next) and the ``parallel`` phase (32
callers at once, each with the connection or client its system needs), each phase bounded in
calls and in time (bench/peers/call_common.py). The worker, then the servers, are stopped by
PID. Repetitions are interleaved (each walks every system, the order reversed every other one).

Server and worker CPU come from /proc (bench.peers.run's Sampler) over each phase; the caller's
is its own. The report goes to bench/out/ and is printed: a results file that relies on it
copies its tables by hand, with this command (bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness import hops, machine
from bench.harness.bench import QUIET_CORES, Bench, Scale, alternate
from bench.harness.machine import machine_and_versions
from bench.harness.paths import OUT_DIR, REPO_ROOT
from bench.harness.procstat import wait_until_quiet
from bench.harness.servers import snapshot_commit
from bench.peers import call_report, envs
from bench.peers.call_common import CALL_TIMEOUT_S
from bench.peers.run import QUIET_WAIT_S, Sampler, Servers, uptime

# Round trips of the hop measured before the run (bench.harness.hops: ~0.3 s each way).
HOP_MESSAGES = 3000
CALLERS = 32
CONCURRENCY = 32
# A worker asked to stop (SIGTERM) is killed this long after.
STOP_GRACE_S = 5.0
# The caller process is killed this long after its own time limit.
KILL_SLACK_S = 15.0


@dataclass(frozen=True)
class CallSystem:
    """One request/reply system: where its clients come from, its driver, its server side."""

    name: str
    env: str  # "main" (this venv: tubeq's client), "node", or a bench-peer-<env> extra
    module: str  # the driver module (bench/peers/drivers/<module>.py); unused for node
    server: str  # "redis", "tubeq" or "beanstalkd"
    how: str  # the call, as the report names it
    worker: str = f"concurrency {CONCURRENCY}"
    caller_role: str = "call"  # the driver's function the callers run


CALL_SYSTEMS = (
    CallSystem("tubeq", "main", "bundled", "tubeq",
               "client.call (put-with notify-ms), one Client shared by the callers; consume() "
               "handler returning the answer (finish)"),
    CallSystem("tubeq (a client per caller)", "main", "bundled", "tubeq",
               "tubeq's row, but a Client of its own per caller", caller_role="call_apart"),
    CallSystem("beanstalkd", "main", "reply_tube", "beanstalkd",
               "reply tubes: put, reserve-with-timeout on the caller's tube, delete; a Client "
               "per caller; consume(), the answer put by a connection per reply tube"),
    CallSystem("tubeq (reply tubes)", "main", "reply_tube", "tubeq",
               "beanstalkd's row, same code, against tubeq"),
    CallSystem("BullMQ", "node", "", "redis",
               "Queue.add + job.waitUntilFinished(queueEvents); one Queue and one QueueEvents "
               "shared by the callers"),
    CallSystem("saq", "saq", "saq_", "redis",
               "queue.apply (polls every 0.5 s, saq's default); one Queue shared"),
    CallSystem("arq", "arq", "arq_", "redis",
               "enqueue_job + job.result() (polls every 0.5 s, arq's default; the worker "
               "polls its queue every 0.5 s too); one pool shared"),
    CallSystem("RQ", "rq", "rq_", "redis",
               "enqueue + job.latest_result(timeout) (blocking XREAD); a thread and a Redis "
               "client per caller", "SimpleWorker: one job at a time"),
    CallSystem("Celery", "celery", "celery_", "redis",
               "delay + AsyncResult.get() (Redis result backend, pub/sub); a thread and an "
               "app per caller", f"threads pool, concurrency {CONCURRENCY}"),
)
# Redis-backed peers: the targets compare tubeq with the best of these.
REDIS_PEERS = tuple(s.name for s in CALL_SYSTEMS if s.server == "redis")


@dataclass(frozen=True)
class CallScale(Scale):
    single: int  # calls of one caller, per repetition
    parallel: int  # calls of CALLERS callers at once, per repetition
    warmup: int  # calls before them, not measured
    phase_limit_s: float  # a phase starts no call after this long


# Two repetitions: 2,000 one-caller and 10,000 parallel calls per system in all, pooled for the
# latency quantiles; the time bound cuts the polling peers (arq, saq: ~2 calls/s per caller).
FULL = CallScale("full", repetitions=2, single=1_000, parallel=5_000, warmup=64,
                 phase_limit_s=20.0)
QUICK = CallScale("quick", repetitions=1, single=200, parallel=600, warmup=32,
                  phase_limit_s=8.0)


def _file_name(system: CallSystem) -> str:
    return "".join(c if c.isalnum() else "-" for c in system.name)


class CallBench(Bench):
    """Each system's worker and callers, on fresh servers, repetitions interleaved."""

    def __init__(self, scale: CallScale, log: Callable[[str], None], code_dir: Path,
                 tubeq_version: str | None,
                 other_code: dict[str, tuple[Path, str]] | None = None) -> None:
        """``other_code``: systems (by name) that run another tubeq than ``code_dir``'s, each
        with its directory and version (``--base``)."""
        super().__init__(scale, log, log_name="peers-call-logs", quiet_wait_s=QUIET_WAIT_S)
        self.scale: CallScale = scale
        self.code_dir = code_dir
        self.tubeq_version = tubeq_version
        self.other_code = other_code or {}
        self.setup: dict[str, dict[str, Any]] = {}

    def prepare(self, system: CallSystem) -> list[str]:
        """The command prefix of the system's driver (installed once); raises envs.EnvError."""
        if system.env == "main":
            self.setup.setdefault(system.name, {"versions": self._main_versions(system)})
            return [sys.executable, "-m", "bench.peers.driver", system.module]
        if system.env == "node":
            command = envs.node_env()
            self.setup.setdefault(system.name, {"versions": envs.node_versions()})
            return command
        python = envs.python_env(system.env)
        self.setup.setdefault(system.name,
                              {"versions": envs.python_versions(python, system.env)})
        return [str(python), "-m", "bench.peers.driver", system.module]

    def _main_versions(self, system: CallSystem) -> dict[str, str]:
        versions = machine_and_versions()
        other = self.other_code.get(system.name)
        tubeq = other[1] if other else self.tubeq_version or versions["tubeq"]
        if system.server == "beanstalkd":
            return {"server": versions["beanstalkd"], "tubeq client": tubeq,
                    "uvloop": versions["uvloop"]}
        return {"tubeq": tubeq, "uvloop": versions["uvloop"], "hiredis": versions["hiredis"]}

    def _args(self, role: str, url: str, time_limit: float, out: Path) -> list[str]:
        s = self.scale
        return [role, "--url", url, "--single", str(s.single), "--parallel", str(s.parallel),
                "--callers", str(CALLERS), "--concurrency", str(CONCURRENCY),
                "--warmup", str(s.warmup), "--phase-limit", str(s.phase_limit_s),
                "--time-limit", str(time_limit), "--out", str(out)]

    def caller_limit_s(self) -> float:
        """The caller process's own bound: three phases, each up to its limit plus a call's
        timeout, and its start."""
        return 3 * (self.scale.phase_limit_s + CALL_TIMEOUT_S) + 30.0

    def code_of(self, system: CallSystem) -> Path:
        """Where the system's tubeq (server and client) comes from."""
        other = self.other_code.get(system.name)
        return other[0] if other else self.code_dir

    def _spawn(self, command: list[str], log: Path, code_dir: Path) -> subprocess.Popen[bytes]:
        """A driver process, its tubeq taken from ``code_dir``: ``python -m`` puts its working
        directory first on sys.path, ahead of PYTHONPATH and of the editable install; bench/
        comes from PYTHONPATH."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(code_dir), str(REPO_ROOT)]))
        with open(log, "ab") as sink:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink,
                                    stderr=sink, cwd=code_dir, env=env)

    def run_system(self, system: CallSystem, rep: int) -> None:
        entry: dict[str, Any] = {"system": system.name, "rep": rep}
        try:
            prefix = self.prepare(system)
        except envs.EnvError as exc:
            self.setup[system.name] = {"error": f"install failed: {exc}"}
            entry["error"] = f"install failed: {exc}"
            self._record(entry)
            return
        entry["quiet_before"] = round(wait_until_quiet(QUIET_CORES, QUIET_WAIT_S), 3)
        code_dir = self.code_of(system)
        servers = Servers(system.server, self.log_dir, code_dir)
        name = f"{_file_name(system)}-{rep}"
        log = self.log_dir / f"{name}.log"
        out = self.log_dir / f"{name}.json"
        out.unlink(missing_ok=True)
        caller_limit = self.caller_limit_s()
        worker: subprocess.Popen[bytes] | None = None
        try:
            url = servers.start()
            # The worker outlives the caller by its own bound only if this process dies.
            worker = self._spawn([*prefix, *self._args("serve", url, caller_limit + 60.0,
                                                      self.log_dir / f"{name}-worker.json")],
                                 self.log_dir / f"{name}-worker.log", code_dir)
            with Sampler({**servers.pids, "worker": worker.pid}) as sampler:
                role = system.caller_role
                caller = self._spawn([*prefix, *self._args(role, url, caller_limit, out)],
                                     log, code_dir)
                try:
                    caller.wait(caller_limit + KILL_SLACK_S)
                except subprocess.TimeoutExpired:
                    caller.kill()
                    caller.wait()
                    entry["error"] = f"caller killed after {caller_limit + KILL_SLACK_S:.0f} s"
            entry.update(self._read(out, log, worker, name))
            entry["cpu"] = {phase: sampler.cpu_s(entry[phase]["t0"], entry[phase]["t1"])
                            for phase in ("single", "parallel") if entry.get(phase)}
        except Exception as exc:  # a broken run is reported, the others go on
            entry.setdefault("error", f"{type(exc).__name__}: {exc}")
        finally:
            if worker is not None:
                _stop(worker)
            servers.stop()
        self._record(entry)

    def _read(self, out: Path, log: Path, worker: subprocess.Popen[bytes],
              name: str) -> dict[str, Any]:
        """The caller's result, or why there is none (the worker's log when it died)."""
        if not out.exists():
            return {"error": "caller wrote no result: "
                    + log.read_text(errors="replace")[-600:]}
        result: dict[str, Any] = json.loads(out.read_text())
        if worker.poll() is not None:
            tail = (self.log_dir / f"{name}-worker.log").read_text(errors="replace")[-600:]
            result.setdefault("error", f"worker exited {worker.returncode} early: {tail}")
        for phase in ("warmup", "single", "parallel"):
            p = result.get(phase) or {}
            if p.get("first_error") and not p.get("calls"):
                result.setdefault("error", f"{phase}: {p['first_error']}")
        return result

    def _record(self, entry: dict[str, Any]) -> None:
        self.runs.append(entry)
        self.log(f"[{self.elapsed():6.0f}s] {entry['system']:<20} rep {entry['rep']}: "
                 f"{call_report.run_line(entry)}")

    def run(self, systems: tuple[CallSystem, ...]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for rep in range(self.scale.repetitions):
            for system in alternate(systems, rep):
                self.run_system(system, rep)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to this PID, SIGKILL after STOP_GRACE_S."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _code(revision: str | None, stamp: str) -> tuple[Path, str | None]:
    """Where tubeq runs from, and its version when not the working tree's."""
    if revision is None:
        return REPO_ROOT, None
    code_dir, commit = snapshot_commit(revision, OUT_DIR / f"peers-call-code-{stamp}")
    return code_dir, f"commit {commit} (git archive: the working tree's edits not included)"


def base_system(commit: str) -> CallSystem:
    """``--base``: the tubeq row again, server and client of ``commit``, as a row of its own."""
    return CallSystem(f"tubeq@{commit}", "main", "bundled", "tubeq",
                      f"as the tubeq row, tubeq (server and client) of {commit}")


def run(scale: CallScale, systems: tuple[CallSystem, ...], revision: str | None,
        output: Path | None, base: str | None = None) -> Path:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    code_dir, tubeq_version = _code(revision, stamp)
    other: dict[str, tuple[Path, str]] = {}
    if base is not None:  # right after the tubeq row, so each repetition runs them in turn
        base_dir, base_version = _code(base, stamp + "-base")
        assert base_version is not None
        extra = base_system(base_version.split()[1])
        other[extra.name] = (base_dir, base_version)
        at = next((i + 1 for i, s in enumerate(systems) if s.name == "tubeq"), 0)
        systems = (*systems[:at], extra, *systems[at:])
    bench = CallBench(scale, log, code_dir, tubeq_version, other)
    meta: dict[str, Any] = {
        "scale": asdict(scale), "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_model": machine.cpu_model(), "machine": machine_and_versions(),
        "uptime_before": uptime(), "callers": CALLERS, "concurrency": CONCURRENCY,
        "tubeq_version": tubeq_version}
    # What a hop costs on this host (bench.harness.hops): one caller's calls cross eight
    meta["hop_rtt_us"] = {"free": round(hops.measure("python", False, HOP_MESSAGES)[0], 1),
                          "one_cpu": round(hops.measure("python", True, HOP_MESSAGES)[0], 1)}
    log(f"peers call: {scale.name} run on {meta['cpu_model']}; {meta['uptime_before']}; "
        f"hop round trip {meta['hop_rtt_us']}")
    try:
        bench.run(systems)
    finally:  # the snapshots (git archive) of --revision and --base
        for snapshot in [code_dir, *(where for where, _ in other.values())]:
            if snapshot != REPO_ROOT:
                shutil.rmtree(snapshot, ignore_errors=True)
    meta["uptime_after"] = uptime()
    meta["elapsed_s"] = round(time.monotonic() - bench.started, 1)
    results = {"meta": meta, "setup": bench.setup, "runs": bench.runs,
               "systems": [asdict(s) for s in systems]}
    raw = OUT_DIR / f"peers-call-{bench.stamp}.json"
    raw.write_text(json.dumps(results))
    report = output or OUT_DIR / f"peers-call-{bench.stamp}.md"
    text = call_report.render(results)
    report.write_text(text)
    print(text)
    log(f"peers call: done in {meta['elapsed_s'] / 60:.1f} min; raw "
        f"{raw.relative_to(REPO_ROOT)}, report {report}")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers.call",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--quick", action="store_true",
                   help="1 repetition, small counts (development)")
    p.add_argument("--repetitions", type=int, default=None, help="override the scale's")
    p.add_argument("--systems", default=None,
                   help="comma-separated subset, e.g. tubeq,BullMQ (default: all)")
    p.add_argument("--revision", default=None, metavar="REV",
                   help="run tubeq (server and bundled client) as of REV, from `git archive` "
                        "(default: the working tree's tubeq/)")
    p.add_argument("--base", default=None, metavar="REV",
                   help="also run tubeq (server and bundled client) as of REV, from `git "
                        "archive`, as a row of its own, interleaved with the others: an A/B "
                        "of two revisions in one run")
    p.add_argument("--output", type=Path, default=None,
                   help="report path (default bench/out/peers-call-<stamp>.md)")
    p.add_argument("--render", type=Path, default=None, metavar="RESULTS_JSON",
                   help="only re-render a saved results file (printed)")
    args = p.parse_args(argv)
    if args.render is not None:
        print(call_report.render(json.loads(args.render.read_text())))
        return 0
    scale = QUICK if args.quick else FULL
    if args.repetitions:
        scale = CallScale(scale.name, args.repetitions, scale.single, scale.parallel,
                          scale.warmup, scale.phase_limit_s)
    systems: tuple[CallSystem, ...] = CALL_SYSTEMS
    if args.systems:
        wanted = {name.strip().lower() for name in args.systems.split(",")}
        systems = tuple(s for s in CALL_SYSTEMS if s.name.lower() in wanted)
        if not systems:
            p.error(f"no system among {[s.name for s in CALL_SYSTEMS]} matches "
                    f"{args.systems!r}")
    run(scale, systems, args.revision, args.output, args.base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
