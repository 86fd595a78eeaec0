"""A private redis-server owned by this process: started on a free loopback port, stopped by PID.

Used by ``tubeq`` when no ``--redis`` URL is given (the embedded default) and by the test suite,
which must never touch a Redis it did not start. The binary is ``redis-server`` from PATH; without
one, :class:`RedisNotInstalled` says exactly what to install.

:class:`RedisClusterNodes` starts several cluster-enabled redis-servers joined into one Redis
Cluster, for the test suite and ``make bench`` (tubeq itself only connects to clusters).

The embedded Redis never outlives tubeq and never runs twice on one data directory:

* ``die_with_parent``: the child asks the kernel for SIGTERM when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``, Linux), so a tubeq killed with SIGKILL (an OOM kill, a crash)
  takes its redis-server with it; SIGTERM lets Redis write out its append-only file first. The
  signal comes when the *thread* that forked dies, so spawn from the main thread
  (:meth:`RedisProcess.spawn`) and wait for it to answer elsewhere.
* :class:`DataDirLock`: tubeq holds an exclusive ``flock`` on ``<data-dir>/tubeq.lock`` for its
  whole life. A second tubeq on the same directory is refused with the first one's PID. The
  kernel drops the lock when its holder dies however it dies, so there is no stale lock to clean.
* The Redis writes its PID to ``<data-dir>/redis.pid``. A start that got the lock and finds that
  PID alive as a redis-server of this directory (an orphan: the parent-death signal is Linux
  only) stops it with SIGTERM, waits for it to exit, and only then starts its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tubeq.redisio.checks import StartupError

INSTALL_HINT = (
    "no redis-server binary found on PATH: install it (Debian/Ubuntu: "
    "`apt-get install -y redis-server`, macOS: `brew install redis`), "
    "or point tubeq at an existing Redis with --redis redis://HOST:PORT/DB"
)

# Job records stay compact listpacks up to this value size (Redis's default, 64, turns a job
# hash with a 100-byte body into a hashtable at ~2x the memory; see research/perf-baseline.md).
LISTPACK_VALUE_LIMIT = 8192


# How long an orphaned redis-server of our data directory gets to exit after SIGTERM (it writes
# out its append-only file first) before tubeq gives up and says so.
ORPHAN_STOP_TIMEOUT_S = 15.0
LOCK_FILE = "tubeq.lock"
PID_FILE = "redis.pid"
_PR_SET_PDEATHSIG = 1


class RedisNotInstalled(RuntimeError):
    """No redis-server binary could be found."""


def _parent_death_hook() -> Callable[[], None] | None:
    """A preexec function that makes the child get SIGTERM when this thread dies (Linux), or
    None where the kernel has no such thing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not after the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent


class DataDirLock:
    """An exclusive lock on a data directory, held until :meth:`release` or process death."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock; raise StartupError naming the holder if another process has it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StartupError(
                f"the data directory {self.path.parent} is in use by another tubeq (pid "
                f"{holder}): stop it first, or give this one another --data-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _orphan_pid(data_dir: Path) -> int | None:
    """The PID in ``redis.pid`` if it is a live redis-server working in ``data_dir``.

    Redis rewrites its command line (its process title), so it is recognised by its name and
    its working directory, which is its ``--dir``.
    """
    try:
        pid = int((data_dir / PID_FILE).read_text().strip())
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        cwd = os.readlink(f"/proc/{pid}/cwd")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    if state == "Z" or not name.startswith("redis-server"):
        return None
    return pid if Path(cwd) == data_dir else None


def stop_orphan(data_dir: Path, timeout: float = ORPHAN_STOP_TIMEOUT_S) -> int | None:
    """Stop a redis-server left running on ``data_dir`` by an earlier tubeq (call with the
    data-dir lock held); returns its PID, or None if there was none."""
    pid = _orphan_pid(data_dir)
    if pid is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _orphan_pid(data_dir) == pid:
        if time.monotonic() > deadline:
            raise StartupError(f"a redis-server (pid {pid}) left by an earlier tubeq still runs "
                               f"on {data_dir} and did not exit on SIGTERM within "
                               f"{timeout:.0f} s: stop it, then start tubeq again")
        time.sleep(0.05)
    return pid


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RedisProcess:
    """One redis-server child process with its data under ``data_dir``.

    ``persistent`` turns on the append-only file (fsync every second, or as ``appendfsync``
    says), so a restart of tubeq and its private Redis keeps every job; tests run without
    persistence. ``die_with_parent``: see the module header. ``extra`` is appended to the
    command line (``--replicaof``...).
    """

    def __init__(self, data_dir: Path, *, port: int | None = None, persistent: bool = False,
                 host: str = "127.0.0.1", appendfsync: str = "everysec",
                 die_with_parent: bool = False, extra: tuple[str, ...] = ()) -> None:
        # Absolute: redis-server changes into --dir before it opens --logfile.
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port or free_port(host)
        self.persistent = persistent
        self.appendfsync = appendfsync
        self.die_with_parent = die_with_parent
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def command_line(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisNotInstalled(INSTALL_HINT)
        return [
            binary,
            "--bind", self.host,
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.persistent else "no",
            "--appendfsync", self.appendfsync,
            "--hash-max-listpack-value", str(LISTPACK_VALUE_LIMIT),
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "redis.log"),
            "--pidfile", str(self.data_dir / PID_FILE),
            *self.extra,
        ]

    def start(self, timeout: float = 10.0) -> None:
        """Start redis-server and wait until it answers PING."""
        self.spawn()
        self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start redis-server without waiting for it (call from the thread that should own it:
        with ``die_with_parent`` the child dies with that thread)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        hook = _parent_death_hook() if self.die_with_parent else None
        self.proc = subprocess.Popen(self.command_line(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=hook)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until the spawned redis-server answers PING; raise if it exits or never does."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.data_dir / "redis.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {tail}")
            if self.ping():
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on {self.host}:{self.port}")

    def ping(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(
            (self.host, self.port), timeout=0.5
        ) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
        return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the child by its PID: SIGTERM, then SIGKILL after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# A cluster node also listens on its port + this (the cluster bus).
CLUSTER_BUS_OFFSET = 10000
CLUSTER_CREATE_TIMEOUT_S = 60.0
CLUSTER_OK_TIMEOUT_S = 30.0


def cluster_port(host: str = "127.0.0.1") -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        port = free_port(host)
        if port + CLUSTER_BUS_OFFSET > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port + CLUSTER_BUS_OFFSET))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair (port, port + 10000) for a cluster node")


class RedisClusterNodes:
    """``count`` redis-server nodes with ``--cluster-enabled yes``, joined by ``redis-cli
    --cluster create --cluster-replicas 0`` (masters only, slots split evenly); each a
    :class:`RedisProcess` (``persistent``/``appendfsync`` as there), stopped by PID."""

    def __init__(self, work_dir: Path, count: int = 3, *, persistent: bool = False,
                 appendfsync: str = "everysec", host: str = "127.0.0.1") -> None:
        self.work_dir = Path(work_dir).resolve()
        self.count = count
        self.persistent = persistent
        self.appendfsync = appendfsync
        self.host = host
        self.nodes: list[RedisProcess] = []

    @property
    def url(self) -> str:
        """tubeq's ``--redis`` for this cluster: every node a seed."""
        return "redis+cluster://" + ",".join(f"{self.host}:{n.port}" for n in self.nodes)

    def node(self, index: int, port: int) -> RedisProcess:
        directory = self.work_dir / f"node{index}"
        return RedisProcess(directory, port=port, host=self.host, persistent=self.persistent,
                            appendfsync=self.appendfsync,
                            extra=("--cluster-enabled", "yes", "--cluster-config-file",
                                   str(directory / "nodes.conf"),
                                   "--cluster-node-timeout", "2000"))

    def start(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RedisNotInstalled(INSTALL_HINT)
        try:
            for index in range(self.count):
                node = self.node(index, cluster_port(self.host))
                self.nodes.append(node)
                node.start()
            done = subprocess.run(
                [cli, "--cluster", "create", *(f"{self.host}:{n.port}" for n in self.nodes),
                 "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, timeout=CLUSTER_CREATE_TIMEOUT_S, check=False)
            if done.returncode != 0:
                output = (done.stdout + done.stderr).decode(errors="replace")
                raise RuntimeError(f"redis-cli --cluster create failed: {output[-1500:]}")
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    def cli(self, index: int, *args: str) -> bytes:
        """One command to node ``index`` through redis-cli; its raw output."""
        done = subprocess.run(["redis-cli", "-h", self.host, "-p", str(self.nodes[index].port),
                               *args], capture_output=True, timeout=10, check=False)
        return done.stdout

    def wait_ok(self) -> None:
        """Wait until every node says ``cluster_state:ok``."""
        deadline = time.monotonic() + CLUSTER_OK_TIMEOUT_S
        while not all(b"cluster_state:ok" in self.cli(i, "CLUSTER", "INFO")
                      for i in range(len(self.nodes))):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not reach cluster_state:ok within "
                                   f"{CLUSTER_OK_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
