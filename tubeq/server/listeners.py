"""Where the protocol listener listens: TCP, a Unix socket, or a socket systemd hands over; TLS.

Owns turning the command line's listen settings into a bound, listening socket and an optional
TLS context. The connection code never sees the difference: every kind gives it a stream
transport. Rules:

* ``-l unix:/path`` listens on a Unix socket, as beanstalkd 1.12 accepts (``-p`` is ignored).
  A socket file left by a process that is gone is replaced; one a live server answers on is not.
* Socket activation (systemd's protocol, ``sd_listen_fds``): when ``LISTEN_PID`` is this
  process and ``LISTEN_FDS`` is at least 1, the first passed descriptor (3) is the listener and
  ``-l``/``-p`` are ignored, as in beanstalkd built with systemd support. A descriptor 3 that
  is not a listening stream socket is a :class:`ListenError` saying so.
* TLS (``--tls-cert``/``--tls-key``, optional ``--tls-client-ca`` to require client
  certificates signed by that CA) wraps whichever listener it is. A handshake that fails, or
  does not finish within ``--tls-handshake-timeout``, closes that connection only (asyncio logs
  it at debug level); the server goes on.
* Listen first (:func:`listen_before_start`): ``python -m tubeq`` binds the protocol socket
  before it imports the rest of tubeq (tubeq.__main__), as beanstalkd listens within a
  millisecond of exec; the kernel queues the connections that arrive while the server starts,
  and the server answers them once it is up. So this module imports the standard library only,
  and ``ssl`` only when TLS is asked for.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import ssl

# The listen queue: connections the kernel completes before tubeq accepts them. asyncio's
# default (100) overflowed when thousands of clients connected at once (a SYN dropped is retried
# by the client after 1 s); 1024 is beanstalkd's.
LISTEN_BACKLOG = 1024
# How long a TLS client may take from connect to a finished handshake before it is dropped
# (--tls-handshake-timeout). 60 s is asyncio's own default: generous for a slow link, and each
# connection waiting costs a socket and a few KB until then. Lower it where idle connects come
# in numbers (scanners, a load balancer's health checks that never speak TLS).
DEFAULT_TLS_HANDSHAKE_TIMEOUT_S = 60.0
# sd_listen_fds: the first descriptor systemd passes.
SD_LISTEN_FDS_START = 3
UNIX_PREFIX = "unix:"


class ListenError(Exception):
    """The listener cannot be opened; the message says why, for one line on stderr."""


# A NamedTuple, not a dataclass: importing dataclasses (and inspect) before the socket listens
# costs ~20 ms of the start (see the module header).
class TlsFiles(NamedTuple):
    cert: Path
    key: Path
    client_ca: Path | None = None  # require client certificates signed by this CA


class Prebound(NamedTuple):
    """The protocol socket, listening since before the server was built, and the listen
    settings it was bound for (the server takes it only if its own settings are the same)."""
    sock: socket.socket
    host: str  # -l as given (unix:/path for a Unix socket)
    port: int
    reuse_port: bool

    def matches(self, host: str, port: int, reuse_port: bool) -> bool:
        """Whether this socket is what ``-l host -p port [--reuse-port]`` asks for."""
        if unix_path(self.host) is not None:
            return host == self.host  # -p means nothing to a Unix socket
        return (self.host, self.port, self.reuse_port) == (host, port, reuse_port)

    def close(self) -> None:
        """Close the socket (and remove the socket file it created): not taken, or the start
        failed."""
        path = unix_path(self.host)
        if path is not None and self.sock.fileno() != -1:
            with contextlib.suppress(OSError):
                path.unlink()
        self.sock.close()


def listen_before_start(host: str, port: int, reuse_port: bool) -> Prebound | None:
    """The protocol socket, bound and listening before the server's imports (tubeq.__main__):
    a Unix socket for ``-l unix:/path``, a TCP socket for an IP address. None where the server
    is to bind it itself: a socket systemd passed (it listens already), a host name (it may
    take a slow lookup, or name several addresses), or a bind that fails (the server's own
    attempt says why, in its one line)."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS"):
        return None
    try:
        path = unix_path(host)
        if path is not None:
            return Prebound(unix_socket(path), host, port, reuse_port)
        return Prebound(_tcp_socket(host, port, reuse_port), host, port, reuse_port)
    except (OSError, ListenError, ValueError):
        return None


def _tcp_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A listening TCP socket on the IP address ``host``, set up as asyncio's create_server
    sets up its own (SO_REUSEADDR, IPV6_V6ONLY, SO_REUSEPORT when asked)."""
    (family, kind, proto, _, address), = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def tls_context(files: TlsFiles) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) for ``files``."""
    import ssl  # here, not at the top: see the module header

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
        if files.client_ca is not None:
            context.load_verify_locations(files.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ListenError(f"cannot load TLS files: {exc}") from exc
    return context


def activated_socket(environ: dict[str, str] | None = None) -> socket.socket | None:
    """The listening socket systemd passed to this process, if it passed one."""
    env = os.environ if environ is None else environ
    if env.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    if count < 1:
        return None
    where = f"socket activation (LISTEN_FDS={count}): fd {SD_LISTEN_FDS_START}"
    try:
        sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as exc:
        if exc.errno == errno.ENOTSOCK:
            raise ListenError(f"{where} is not a socket") from None
        if exc.errno == errno.EBADF:
            raise ListenError(f"{where} is not open") from None
        raise ListenError(f"{where}: {exc.strerror or exc}") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET,
                                                              socket.SO_ACCEPTCONN):
        sock.detach()  # not ours to close: the message says what it is
        raise ListenError(f"{where} is a socket that is not listening"
                          + ("" if sock.type == socket.SOCK_STREAM else " (not a stream)"))
    sock.setblocking(False)
    return sock


def unix_socket(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, replacing a stale socket file left there."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ListenError(f"{path} exists and is not a socket")
        if _answers(path):
            raise ListenError(f"{path}: another server is listening there")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on unix:{path}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def unix_path(host: str) -> Path | None:
    """The socket path of ``-l unix:/path``, or None for a TCP address."""
    if not host.startswith(UNIX_PREFIX):
        return None
    path = host[len(UNIX_PREFIX):]
    if not path:
        raise ListenError("-l unix: needs a path, e.g. -l unix:/run/tubeq.sock")
    return Path(path)


def describe(sock: socket.socket) -> str:
    """Where ``sock`` listens, for the log."""
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return f"unix:{name}"
    return f"{name[0]}:{name[1]}"
