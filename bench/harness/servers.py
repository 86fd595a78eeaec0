"""The servers a benchmark run measures: fresh beanstalkd, and tubeq on a private redis-server.

Owns: starting each server on a free loopback port, knowing its PIDs (for CPU and memory), and
stopping it by those PIDs: SIGTERM, then SIGKILL after a bound. Never by name, and never a Redis
this module did not start (the private one comes from ``tubeq.redisio.process.RedisProcess``).

tubeq is launched as a user would launch it, ``python -m tubeq -l 127.0.0.1 -p PORT --redis URL
--prefix NAME``, from ``code_dir``: the repository root, or a snapshot of the package that a
scenario takes when it starts (:func:`snapshot_tubeq`; :func:`snapshot_revision` for a git
revision's), so a run measures one version of tubeq even while the working tree changes under it.
:func:`make_server` builds a server from its kind, the server label the RESULTS tables use ("tubeq
events off", "tubeq x2", ...). Several tubeq processes can share one Redis and prefix (the wake
scenario across processes). The private Redis runs without persistence, as beanstalkd runs without
its binlog: both keep jobs in memory only.

For the cluster section (bench/cluster_bench.py): :class:`BenchCluster` is a Redis Cluster of
N nodes on loopback (tubeq.redisio.process.RedisClusterNodes: started, joined with ``redis-cli
--cluster create``, stopped by PID); :class:`TubeqOn` is tubeq processes on a Redis (or
cluster) URL they do not own.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.paths import REPO_ROOT
from bench.harness.redisinfo import redis_command
from tubeq.redisio.process import RedisClusterNodes, RedisProcess, free_port

LOOPBACK = "127.0.0.1"
# tubeq imports its package and connects to Redis before it listens; on two busy cores that can
# take a few seconds.
STARTUP_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
# free_port() can lose a race with another process; a server that fails to bind is retried.
PORT_ATTEMPTS = 3


class ServerStartError(RuntimeError):
    """A server exited or never accepted a connection; the message has its log's tail."""


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=0.5):
        return True
    return False


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process this harness started, by its PID: SIGTERM, then SIGKILL after a bound."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _spawn(command: list[str], port: int, log_path: Path, env: dict[str, str] | None = None,
           cwd: Path | None = None,
           startup_timeout_s: float = STARTUP_TIMEOUT_S) -> subprocess.Popen[bytes]:
    """Start ``command`` and wait until ``port`` accepts; raises ServerStartError."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=env, cwd=cwd)
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if _accepts(port):
            return proc
        time.sleep(0.02)
    stop_process(proc)
    tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
    raise ServerStartError(f"{command[0]} on port {port} did not start: {tail}")


@dataclass
class Beanstalkd:
    """beanstalkd -l 127.0.0.1 -p PORT, no binlog."""

    log_dir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    name: str = "beanstalkd"

    def start(self) -> None:
        binary = shutil.which("beanstalkd")
        if binary is None:
            raise ServerStartError("no beanstalkd on PATH (make system-deps installs it)")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(PORT_ATTEMPTS):
            self.port = free_port(LOOPBACK)
            try:
                self.proc = _spawn([binary, "-l", LOOPBACK, "-p", str(self.port)], self.port,
                                   self.log_dir / "beanstalkd.log")
                return
            except ServerStartError:
                if attempt == PORT_ATTEMPTS - 1:
                    raise

    @property
    def pids(self) -> dict[str, int]:
        assert self.proc is not None
        return {"beanstalkd": self.proc.pid}

    @property
    def memory_pids(self) -> dict[str, int]:
        return self.pids

    @property
    def redis_url(self) -> str | None:
        return None

    @property
    def producer_port(self) -> int:
        return self.port

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@dataclass
class Tubeq:
    """A private redis-server and ``processes`` tubeq processes on it, one prefix.

    ``port`` is the first process's; ``producer_port`` the last one's (the same with one
    process), so a producer and its consumers are on different processes when there are two.
    ``code_dir`` holds the ``tubeq`` package that runs; ``flags`` are added to each process's
    command line (none: tubeq's defaults with ``--redis``, lifecycle events off).
    ``workers`` > 1 starts each process as ``tubeq --workers N`` (a supervisor and N workers on
    one port); ``start`` returns once all N listen, and ``pids`` names the workers too.
    ``wrapper`` goes before the interpreter (``valgrind --tool=callgrind ...``: the process
    keeps its PID), with ``startup_timeout_s`` to match.
    """

    log_dir: Path
    processes: int = 1
    code_dir: Path = REPO_ROOT
    port: int = 0
    producer_port: int = 0
    redis: RedisProcess | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    prefix: str = field(default_factory=lambda: "bench" + secrets.token_hex(3))
    name: str = "tubeq"
    flags: tuple[str, ...] = ()
    workers: int = 1
    worker_pids: list[int] = field(default_factory=list)
    wrapper: tuple[str, ...] = ()
    startup_timeout_s: float = STARTUP_TIMEOUT_S

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis = RedisProcess(self.log_dir / f"redis-{self.prefix}")
        self.redis.start()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.code_dir), env.get("PYTHONPATH", "")) if p)
        try:
            for index in range(self.processes):
                self.procs.append(self._start_one(index, env))
        except BaseException:
            self.stop()
            raise

    def _start_one(self, index: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
        assert self.redis is not None
        for attempt in range(PORT_ATTEMPTS):
            port = free_port(LOOPBACK)
            command = [*self.wrapper, sys.executable, "-m", "tubeq", "-l", LOOPBACK, "-p",
                       str(port), "--redis", self.redis.url, "--prefix", self.prefix,
                       "--log-level", "warning", *self.flags]
            if self.workers > 1:
                command += ["--workers", str(self.workers)]
            try:
                proc = _spawn(command, port, self.log_dir / f"tubeq-{self.prefix}-{index}.log",
                              env=env, cwd=self.code_dir,
                              startup_timeout_s=self.startup_timeout_s)
                if self.workers > 1:
                    self.worker_pids += _wait_for_workers(proc, port, self.workers)
            except ServerStartError:
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                continue
            if index == 0:
                self.port = port
            self.producer_port = port
            return proc
        raise AssertionError("unreachable")

    @property
    def pids(self) -> dict[str, int]:
        """CPU labels: ``tubeq`` (and ``tubeq2``...) and ``redis``."""
        assert self.redis is not None and self.redis.proc is not None
        labels = {("tubeq" if i == 0 else f"tubeq{i + 1}"): p.pid for i, p in enumerate(self.procs)}
        workers = {f"tubeq worker{i + 1}": pid for i, pid in enumerate(self.worker_pids)}
        return {**labels, **workers, "redis": self.redis.proc.pid}

    @property
    def memory_pids(self) -> dict[str, int]:
        return self.pids

    @property
    def redis_url(self) -> str | None:
        return self.redis.url if self.redis is not None else None

    def reset_redis_stats(self) -> None:
        assert self.redis is not None
        redis_command(self.redis.url, "CONFIG", "RESETSTAT")

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)  # a supervisor stops its workers (and they die with it)
        self.procs.clear()
        self.worker_pids.clear()
        if self.redis is not None:
            self.redis.stop()
            shutil.rmtree(self.redis.data_dir, ignore_errors=True)
            self.redis = None


Server = Beanstalkd | Tubeq


# -- the server kinds a scenario names ---------------------------------------------------------

# tubeq's lifecycle events, as its private redis-server would have them, and off (issue 9).
EVENTS_ON = ("--events", "on")
EVENTS_OFF = ("--events", "off")
# Issue 12: every metrics hook on (the HTTP listener on a free port), against none at all (no
# listener, no slow-command tracking either); both with events on, as the other tubeq rows.
METRICS_ON = ("--metrics", "127.0.0.1:0")
METRICS_OFF = ("--slow-ms", "0")
# Issue 13 part 3: the EVENTS_COMPARED rows on one Redis, one tubeq process against
# `tubeq --workers 2` (two processes on one port, SO_REUSEPORT), both with events on.
WORKERS_1 = "tubeq --workers 1"
WORKERS_2 = "tubeq --workers 2"


def make_server(kind: str, log_dir: Path, code_dir: Path = REPO_ROOT,
                flags: tuple[str, ...] = ()) -> Server:
    """A server of ``kind`` (a server label of the RESULTS tables); ``flags`` go to tubeq
    ("tubeq events off" and the metrics pair set their own)."""
    if kind == "beanstalkd":
        return Beanstalkd(log_dir)
    if kind == "tubeq":
        return Tubeq(log_dir, code_dir=code_dir, flags=flags)
    if kind == "tubeq x2":
        return Tubeq(log_dir, processes=2, code_dir=code_dir, flags=flags)
    if kind == "tubeq events off":
        return Tubeq(log_dir, code_dir=code_dir, flags=EVENTS_OFF)
    if kind == "tubeq metrics on":
        return Tubeq(log_dir, code_dir=code_dir, flags=EVENTS_ON + METRICS_ON)
    if kind == "tubeq metrics off":
        return Tubeq(log_dir, code_dir=code_dir, flags=EVENTS_ON + METRICS_OFF)
    if kind == WORKERS_1:
        return Tubeq(log_dir, code_dir=code_dir, flags=(*flags, "--workers", "1"))
    if kind == WORKERS_2:
        return Tubeq(log_dir, code_dir=code_dir, flags=flags, workers=2)
    raise ValueError(kind)


def _listening_sockets(port: int) -> int:
    """How many IPv4 sockets listen on ``port`` (SO_REUSEPORT: one per worker)."""
    with open("/proc/net/tcp") as f:
        next(f)
        fields = (line.split() for line in f)
        return sum(1 for row in fields
                   if int(row[1].rsplit(":", 1)[1], 16) == port and row[3] == "0A")


def _children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_bytes()
        except OSError:
            continue
        if int(raw[raw.rindex(b")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def _wait_for_workers(proc: subprocess.Popen[bytes], port: int, count: int) -> list[int]:
    """Wait until ``count`` workers of the supervisor ``proc`` listen on ``port``; their PIDs."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        children = _children(proc.pid)
        if len(children) >= count and _listening_sockets(port) >= count:
            return children
        time.sleep(0.05)
    stop_process(proc)
    raise ServerStartError(f"tubeq --workers {count} on port {port}: the workers did not all "
                           "listen in time")


def snapshot_tubeq(destination: Path) -> Path:
    """Copy the working tree's ``tubeq`` package under ``destination``; returns the directory
    to run it from (``Tubeq.code_dir``)."""
    shutil.copytree(REPO_ROOT / "tubeq", destination / "tubeq",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def snapshot_commit(revision: str, destination: Path) -> tuple[Path, str]:
    """:func:`snapshot_revision` of ``revision`` resolved to its short commit: the directory,
    and the commit (what a report names)."""
    commit = subprocess.run(["git", "rev-parse", "--short", revision], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True).stdout.strip()
    return snapshot_revision(commit, destination), commit


def snapshot_revision(revision: str, destination: Path) -> Path:
    """``tubeq/`` as of ``revision``, extracted under ``destination`` (a Tubeq.code_dir)."""
    archive = subprocess.run(["git", "archive", "--format=tar", revision, "tubeq"],
                             cwd=REPO_ROOT, check=True, capture_output=True).stdout
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(destination, filter="data")
    return destination


class BenchCluster(RedisClusterNodes):
    """The cluster section's Redis Cluster (tubeq.redisio.process.RedisClusterNodes: no
    persistence, as the private Redis), with what the bench reads of it."""

    @property
    def node_urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def pids(self) -> dict[str, int]:
        """CPU labels ``redis node1``... in node order."""
        return {f"redis node{i + 1}": n.proc.pid for i, n in enumerate(self.nodes)
                if n.proc is not None}

    def stop(self) -> None:
        super().stop()
        for node in self.nodes:
            shutil.rmtree(node.data_dir, ignore_errors=True)
        self.nodes.clear()


@dataclass
class TubeqOn:
    """``processes`` tubeq processes on ``redis_url`` (a Redis or a cluster this does not own),
    one prefix, each with ``flags``; stopped by PID. ``ports`` in process order."""

    log_dir: Path
    redis_url: str
    processes: int = 2
    flags: tuple[str, ...] = ()
    code_dir: Path = REPO_ROOT
    prefix: str = field(default_factory=lambda: "bench" + secrets.token_hex(3))
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.code_dir), env.get("PYTHONPATH", "")) if p)
        try:
            for index in range(self.processes):
                for attempt in range(PORT_ATTEMPTS):
                    port = free_port(LOOPBACK)
                    command = [sys.executable, "-m", "tubeq", "-l", LOOPBACK, "-p", str(port),
                               "--redis", self.redis_url, "--prefix", self.prefix,
                               "--log-level", "warning", *self.flags]
                    try:
                        self.procs.append(_spawn(
                            command, port, self.log_dir / f"tubeq-{self.prefix}-{index}.log",
                            env=env, cwd=self.code_dir))
                    except ServerStartError:
                        if attempt == PORT_ATTEMPTS - 1:
                            raise
                        continue
                    self.ports.append(port)
                    break
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> dict[str, int]:
        """CPU labels ``tubeq1``, ``tubeq2``..."""
        return {f"tubeq{i + 1}": p.pid for i, p in enumerate(self.procs)}

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)
        self.procs.clear()
        self.ports.clear()
