"""The protocol listener's kinds (tubeq.server.listeners): a Unix socket, a socket handed over by
systemd's protocol, TLS with and without client certificates, and their errors.

Each test starts a real tubeq process on the session's private Redis (its own key prefix) and
talks to it with real clients: raw sockets, greenstalk, Python's ssl module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import greenstalk
import pytest
import trustme

from tests.support.servers import unique_prefix
from tubeq.redisio.process import RedisProcess, free_port
from tubeq.server.listeners import ListenError, unix_path, unix_socket

START_TIMEOUT_S = 15.0
REPO = Path(__file__).resolve().parents[2]


def _tubeq(redis: RedisProcess, *flags: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "tubeq", "--redis", redis.url, "--prefix", unique_prefix(),
            *flags]
    return subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _until(connect: Callable[[], socket.socket], proc: subprocess.Popen[bytes]) -> socket.socket:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"tubeq exited: {err}")
        try:
            return connect()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _exchange(sock: socket.socket, data: bytes, expect: int) -> bytes:
    sock.sendall(data)
    out = b""
    while len(out) < expect:
        chunk = sock.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory for socket files (a Unix socket path is limited to 107 bytes)."""
    base = Path("/tmp") if Path("/tmp").is_dir() else Path.cwd()
    path = base / f"tq-{os.getpid()}-{unique_prefix('s')}"
    path.mkdir()
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


def test_a_unix_socket_listener_serves_a_real_client(redis_process: RedisProcess,
                                                      short_tmp: Path) -> None:
    path = short_tmp / "tubeq.sock"
    proc = _tubeq(redis_process, "-l", f"unix:{path}")
    try:
        def connect() -> socket.socket:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            try:
                sock.connect(str(path))
            except OSError:
                sock.close()
                raise
            return sock

        _until(connect, proc).close()
        with greenstalk.Client(str(path), use="unix-tube", watch="unix-tube") as client:
            job_id = client.put(b"over a unix socket")
            job = client.reserve(timeout=5)
            assert (job.id, job.body) == (job_id, "over a unix socket")
            client.delete(job)
    finally:
        _stop(proc)
    assert not path.exists()  # removed on a clean stop


def test_a_stale_socket_file_is_replaced_and_a_live_one_refused(short_tmp: Path) -> None:
    path = short_tmp / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: stale
    live = unix_socket(path)
    try:
        with pytest.raises(ListenError, match="another server is listening"):
            unix_socket(path)
    finally:
        live.close()
    path.unlink()
    path.write_text("not a socket")
    with pytest.raises(ListenError, match="not a socket"):
        unix_socket(path)
    with pytest.raises(ListenError, match="needs a path"):
        unix_path("unix:")
    assert unix_path("127.0.0.1") is None


def test_a_socket_passed_as_systemd_does_is_the_listener(redis_process: RedisProcess) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    fd = listener.fileno()
    # What systemd arranges: the socket as fd 3, LISTEN_FDS=1 and LISTEN_PID = the server's
    # own PID (a shim that execs keeps it). -p names a port nobody listens on: the socket wins.
    argv = [sys.executable, "-m", "tubeq", "--redis", redis_process.url, "--prefix",
            unique_prefix(), "-p", str(free_port())]
    shim = (f"import os, sys; os.dup2({fd}, 3); os.environ['LISTEN_PID'] = str(os.getpid()); "
            "os.environ['LISTEN_FDS'] = '1'; os.execv(sys.argv[1], sys.argv[1:])")
    proc = subprocess.Popen([sys.executable, "-c", shim, *argv], pass_fds=(fd,),
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE)
    listener.close()  # the child holds its own copy
    try:
        sock = _until(lambda: socket.create_connection(("127.0.0.1", port), timeout=5), proc)
        with sock:
            assert _exchange(sock, b"put 0 0 60 2\r\nhi\r\n", 11) == b"INSERTED 1\r\n"
    finally:
        _stop(proc)


def test_a_passed_descriptor_that_is_no_listening_socket_is_one_clear_line(
        redis_process: RedisProcess, tmp_path: Path) -> None:
    plain = tmp_path / "not-a-socket"
    plain.write_bytes(b"")
    unbound = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # a socket, not listening
    plain_fd = os.open(plain, os.O_RDONLY)
    argv = [sys.executable, "-m", "tubeq", "--redis", redis_process.url, "--prefix",
            unique_prefix(), "-p", str(free_port())]
    try:
        for fd, told in ((plain_fd, "fd 3 is not a socket"),
                         (unbound.fileno(), "fd 3 is a socket that is not listening")):
            shim = (f"import os, sys; os.dup2({fd}, 3); "
                    "os.environ['LISTEN_PID'] = str(os.getpid()); "
                    "os.environ['LISTEN_FDS'] = '1'; os.execv(sys.argv[1], sys.argv[1:])")
            done = subprocess.run([sys.executable, "-c", shim, *argv], pass_fds=(fd,),
                                  env={**os.environ, "PYTHONPATH": str(REPO)},
                                  capture_output=True, text=True, timeout=30, check=False)
            assert done.returncode == 1, done
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
            assert lines[0] == f"tubeq: socket activation (LISTEN_FDS=1): {told}", lines[0]
    finally:
        unbound.close()
        os.close(plain_fd)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _tls_files(ca: trustme.CA, directory: Path) -> tuple[Path, Path, Path]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    ca_path = directory / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    ca.cert_pem.write_to_path(str(ca_path))
    return cert_path, key_path, ca_path


def test_tls_serves_the_protocol_and_a_failed_handshake_hurts_no_one(
        redis_process: RedisProcess, ca: trustme.CA, tmp_path: Path) -> None:
    cert, key, _ = _tls_files(ca, tmp_path)
    port = free_port()
    proc = _tubeq(redis_process, "-p", str(port), "--tls-cert", str(cert), "--tls-key", str(key))
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    try:
        raw = _until(lambda: socket.create_connection(("127.0.0.1", port), timeout=5), proc)
        with raw:
            raw.sendall(b"put 0 0 60 2\r\nhi\r\n")  # plain text at a TLS port
            assert b"INSERTED" not in _read_until_closed(raw)  # closed, nothing answered
        with client_tls.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                                    server_hostname="127.0.0.1") as sock:
            assert _exchange(sock, b"put 0 0 60 2\r\nhi\r\n", 11) == b"INSERTED 1\r\n"
            reply = _exchange(sock, b"reserve-with-timeout 0\r\n", 17)
            assert reply == b"RESERVED 1 2\r\nhi\r\n"  # id 1: the plain-text put stored nothing
    finally:
        _stop(proc)


def test_a_client_that_never_finishes_its_handshake_is_dropped_after_the_timeout(
        redis_process: RedisProcess, ca: trustme.CA, tmp_path: Path) -> None:
    cert, key, _ = _tls_files(ca, tmp_path)
    port = free_port()
    proc = _tubeq(redis_process, "-p", str(port), "--tls-cert", str(cert), "--tls-key", str(key),
                  "--tls-handshake-timeout", "0.5")
    try:
        # Connected, then silent: no ClientHello ever comes. asyncio's own bound is 60 s, past
        # this read's 20 s: only the flag closes it in time.
        idle = _until(lambda: socket.create_connection(("127.0.0.1", port), timeout=20), proc)
        with idle:
            idle.settimeout(20)
            with contextlib.suppress(ConnectionResetError):  # a reset is closed all the same
                assert idle.recv(1) == b""
    finally:
        _stop(proc)


def _read_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def test_client_certificates_when_required(redis_process: RedisProcess, ca: trustme.CA,
                                           tmp_path: Path) -> None:
    cert, key, ca_path = _tls_files(ca, tmp_path)
    port = free_port()
    proc = _tubeq(redis_process, "-p", str(port), "--tls-cert", str(cert), "--tls-key", str(key),
                  "--tls-client-ca", str(ca_path))
    try:
        _until(lambda: socket.create_connection(("127.0.0.1", port), timeout=5), proc).close()
        anonymous = ssl.create_default_context()
        ca.configure_trust(anonymous)
        try:  # TLS 1.3 reports the missing certificate at the client's first read
            with anonymous.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                                       server_hostname="127.0.0.1") as sock:
                sock.sendall(b"put 0 0 60 2\r\nhi\r\n")
                refused = _read_until_closed(sock)
        except (ssl.SSLError, ConnectionError):
            refused = b""
        assert refused == b""
        known = ssl.create_default_context()
        ca.configure_trust(known)
        ca.issue_cert("worker-1").configure_cert(known)
        with known.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                               server_hostname="127.0.0.1") as sock:
            assert _exchange(sock, b"put 0 0 60 2\r\nhi\r\n", 11) == b"INSERTED 1\r\n"
    finally:
        _stop(proc)


def test_bad_tls_files_are_one_clear_line_and_a_nonzero_exit(redis_process: RedisProcess,
                                                            tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    proc = _tubeq(redis_process, "-p", str(free_port()), "--tls-cert", str(missing),
                  "--tls-key", str(missing))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    lines = err.decode().strip().splitlines()
    assert lines[-1].startswith("tubeq: cannot load TLS files")
    assert "Traceback" not in err.decode()
    half = _tubeq(redis_process, "--tls-cert", str(missing))
    _, err = half.communicate(timeout=30)
    assert half.returncode == 2 and b"--tls-cert and --tls-key go together" in err
