"""Private beanstalkd and tubeq servers for the wire tests, started and stopped by the tests.

Every server here is a child process of the test run listening on a free loopback port. It is
stopped by its own PID (SIGTERM, then SIGKILL after a bound), never by name. Each tubeq gets its
own private redis-server (or shares one the suite started), and a unique ``--prefix``, so nothing
here ever touches a Redis the suite did not start (in particular not the one on port 6379).

``beanstalkd`` is the reference (1.12, from PATH); ``tubeq`` is launched exactly as a user would:
``python -m tubeq -l 127.0.0.1 -p PORT --redis URL --prefix PREFIX``.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tests.support.job_counts import count_mismatches
from tubeq.redisio.process import RedisProcess, free_port

LOOPBACK = "127.0.0.1"
ServerKind = Literal["beanstalkd", "tubeq"]

# How long a freshly spawned server may take to accept connections. tubeq imports its package and
# connects to Redis first; two cores shared with a busy test run need a generous bound.
STARTUP_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
# A spawned server may lose the race for a port that free_port() reported free; we retry.
PORT_RACE_ATTEMPTS = 3

BEANSTALKD_INSTALL_HINT = (
    "no beanstalkd binary on PATH: the differential suite needs the reference server "
    "(Debian/Ubuntu: `apt-get install -y beanstalkd`, or `make system-deps`)"
)


class ServerStartError(RuntimeError):
    """A server process exited or never accepted a connection; the message carries its log."""


@dataclass
class ServerProcess:
    """One server child process: where it listens, its PID and where its stderr goes."""

    kind: ServerKind
    host: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    label: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send_signal(self, signum: signal.Signals) -> None:
        """Deliver ``signum`` to this server's PID (used for SIGUSR1, drain mode)."""
        if self.alive():
            os.kill(self.proc.pid, signum)

    def log_tail(self, max_chars: int = 4000) -> str:
        """The end of the server's captured stderr/stdout ("" if it wrote nothing)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-max_chars:]

    def stop(self) -> None:
        """Stop the child by its PID: SIGTERM, then SIGKILL after a bound. Idempotent."""
        stop_child(self.proc, STOP_TIMEOUT_S)

    def describe(self) -> str:
        return f"{self.label or self.kind} (pid {self.pid}, {self.host}:{self.port})"


def stop_child(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Stop a child process by its PID: SIGTERM, then SIGKILL if it still runs after
    ``timeout`` seconds. Idempotent."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def port_accepts(host: str, port: int, timeout: float = 0.25) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_http(server: ServerProcess, port: int) -> None:
    """Until ``server``'s HTTP listener (``--metrics``) accepts: it opens during the start,
    after the protocol port, which tubeq binds first (and start_tubeq waits for)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not port_accepts("127.0.0.1", port):
        assert server.alive() and time.monotonic() < deadline, server.log_tail()
        time.sleep(0.02)


def port_serves(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether the beanstalkd-protocol server on ``port`` serves: it closes a connection that
    sent ``quit`` (which no stat counts). A port that accepts is not enough: tubeq listens
    before it starts (tubeq.__main__), and its --metrics listener opens during the start."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"quit\r\n")
            return sock.recv(1) == b""
    except OSError:  # refused, reset, or no answer yet
        return False


def _spawn_and_wait(kind: ServerKind, argv: list[str], port: int, log_path: Path,
                    label: str) -> ServerProcess:
    """Start ``argv`` with its output in ``log_path`` and wait until it serves on ``port``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    server = ServerProcess(kind, LOOPBACK, port, proc, log_path, label)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(
                f"{label or kind} exited with status {proc.returncode} before accepting "
                f"connections; command: {' '.join(argv)}\n--- its output ---\n{server.log_tail()}"
            )
        if port_serves(LOOPBACK, port):
            return server
        time.sleep(0.02)
    server.stop()
    raise ServerStartError(
        f"{label or kind} did not accept connections on {LOOPBACK}:{port} within "
        f"{STARTUP_TIMEOUT_S:.0f} s; command: {' '.join(argv)}\n--- its output ---\n"
        f"{server.log_tail()}"
    )


def _start_with_port_retries(kind: ServerKind, make_argv: functools.partial[list[str]],
                             log_dir: Path, label: str) -> ServerProcess:
    last_error: ServerStartError | None = None
    for attempt in range(PORT_RACE_ATTEMPTS):
        port = free_port(LOOPBACK)
        log_path = log_dir / f"{label or kind}-{port}-{attempt}.log"
        try:
            return _spawn_and_wait(kind, make_argv(port=port), port, log_path, label)
        except ServerStartError as error:
            last_error = error
            if "in use" not in str(error).lower():
                raise
    assert last_error is not None
    raise last_error


def beanstalkd_binary() -> str:
    binary = shutil.which("beanstalkd")
    if binary is None:
        raise ServerStartError(BEANSTALKD_INSTALL_HINT)
    return binary


def _beanstalkd_argv(*, port: int) -> list[str]:
    return [beanstalkd_binary(), "-l", LOOPBACK, "-p", str(port)]


def start_beanstalkd(log_dir: Path, label: str = "beanstalkd") -> ServerProcess:
    """A private beanstalkd on a free loopback port (no binlog, default max job size)."""
    return _start_with_port_retries("beanstalkd", functools.partial(_beanstalkd_argv), log_dir,
                                    label)


# TUBEQ_TEST_SHARDS=N starts every tubeq of the suite with --shards N (tubeq.store.shards): how the
# differential suite runs against a split namespace (tests/store/test_shards.py does so).
TEST_SHARDS_ENV = "TUBEQ_TEST_SHARDS"
# TUBEQ_TEST_REDIS=URL points the suite's tubeq processes (TubeqCluster.start) at that Redis
# instead of their private one: how the differential suite runs against a Redis Cluster
# (tests/redisio/test_cluster.py starts the cluster and runs it nested).
TEST_REDIS_ENV = "TUBEQ_TEST_REDIS"


def _tubeq_argv(redis_url: str, prefix: str, flags: tuple[str, ...], *, port: int) -> list[str]:
    shards = os.environ.get(TEST_SHARDS_ENV)
    split = ("--shards", shards) if shards and "--shards" not in flags else ()
    return [sys.executable, "-m", "tubeq", "-l", LOOPBACK, "-p", str(port),
            "--redis", redis_url, "--prefix", prefix, *split, *flags]


def start_tubeq(redis_url: str, prefix: str, log_dir: Path, label: str = "tubeq",
                flags: tuple[str, ...] = ()) -> ServerProcess:
    """A tubeq process on a free loopback port, storing its state under ``prefix`` in Redis;
    ``flags`` are added to its command line."""
    server = _start_with_port_retries(
        "tubeq", functools.partial(_tubeq_argv, redis_url, prefix, flags), log_dir, label
    )
    server.extra.update(redis_url=redis_url, prefix=prefix)
    argv = _tubeq_argv(redis_url, prefix, flags, port=0)
    if "--shards" in argv:
        server.extra["shards"] = argv[argv.index("--shards") + 1]
    return server


def unique_prefix(stem: str = "tq") -> str:
    """A Redis key prefix no other server of this run uses."""
    return f"{stem}-{secrets.token_hex(4)}"


@functools.cache
def tubeq_launchable() -> tuple[bool, str]:
    """Whether ``python -m tubeq --help`` works yet, and its output when it does not."""
    try:
        done = subprocess.run([sys.executable, "-m", "tubeq", "--help"], capture_output=True,
                              timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return False, "`python -m tubeq --help` did not finish within 30 s"
    output = (done.stdout + done.stderr).decode(errors="replace")
    return done.returncode == 0, output[-2000:]


class TubeqCluster:
    """One private redis-server and the tubeq processes started on it, all stopped together.

    The session's main tubeq is one of them; the factory methods add more processes on the same
    Redis, either sharing a prefix (several processes serving one queue) or with a fresh prefix
    (a pristine server whose ids and global counters start from zero).
    """

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.redis = RedisProcess(work_dir / "redis")
        self.servers: list[ServerProcess] = []

    def start_redis(self) -> None:
        self.redis.start()

    def start(self, prefix: str | None = None, label: str = "tubeq",
              flags: tuple[str, ...] = ()) -> ServerProcess:
        launchable, output = tubeq_launchable()
        if not launchable:
            raise ServerStartError(f"`python -m tubeq --help` fails, tubeq is not runnable yet:\n"
                                   f"{output}")
        server = start_tubeq(os.environ.get(TEST_REDIS_ENV) or self.redis.url,
                             prefix or unique_prefix(), self.work_dir / "logs", label, flags)
        self.servers.append(server)
        return server

    def stop_all(self) -> None:
        """Stop every process; then the namespaces' jobs by state must match their tubes
        (tests/support/job_counts.py), after every test that ran on this Redis."""
        for server in self.servers:
            server.stop()
        self.servers.clear()
        wrong = count_mismatches(self.redis.url) if self.redis.alive() else []
        self.redis.stop()
        if wrong:
            raise AssertionError("job counts drifted from the tubes:\n" + "\n".join(wrong))


def run_differential_suite(env: dict[str, str], timeout_s: float = 580.0) -> str:
    """Run the differential beanstalkd suite in a pytest of its own with ``env`` added (e.g.
    TEST_SHARDS_ENV, TEST_REDIS_ENV); assert that every scenario passed; return its summary."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "tests/differential/test_differential.py"],
        cwd=Path(__file__).resolve().parents[2], env={**os.environ, **env},
        capture_output=True, text=True, timeout=timeout_s, check=False)
    tail = "\n".join(line for line in done.stdout.splitlines() if "[info" not in line)[-4000:]
    assert done.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail, tail
    return tail.splitlines()[-1]
