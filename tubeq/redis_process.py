"""A private redis-server owned by this process: started on a free loopback port, stopped by PID.

Used by ``tubeq`` when no ``--redis`` URL is given (the embedded default) and by the test suite,
which must never touch a Redis it did not start. The binary is ``redis-server`` from PATH; without
one, :class:`RedisNotInstalled` says exactly what to install.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

INSTALL_HINT = (
    "no redis-server binary found on PATH: install it (Debian/Ubuntu: "
    "`apt-get install -y redis-server`, macOS: `brew install redis`), "
    "or point tubeq at an existing Redis with --redis redis://HOST:PORT/DB"
)

# Job records stay compact listpacks up to this value size (Redis's default, 64, turns a job
# hash with a 100-byte body into a hashtable at ~2x the memory; see research/perf-baseline.md).
LISTPACK_VALUE_LIMIT = 8192


class RedisNotInstalled(RuntimeError):
    """No redis-server binary could be found."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RedisProcess:
    """One redis-server child process with its data under ``data_dir``.

    ``persistent`` turns on the append-only file (fsync every second), so a restart of tubeq and
    its private Redis keeps every job; tests run without persistence.
    """

    def __init__(self, data_dir: Path, *, port: int | None = None, persistent: bool = False,
                 host: str = "127.0.0.1") -> None:
        # Absolute: redis-server changes into --dir before it opens --logfile.
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port or free_port(host)
        self.persistent = persistent
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
            "--appendfsync", "everysec",
            "--hash-max-listpack-value", str(LISTPACK_VALUE_LIMIT),
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "redis.log"),
        ]

    def start(self, timeout: float = 10.0) -> None:
        """Start redis-server and wait until it answers PING."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.command_line(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
