"""A blocking client for code without an event loop (a Flask or Django view, a script, a cron
job): put, call and wait over one plain socket, with the bundled client's parser, argument
checks and errors, and no event loop in a thread.

    with BlockingClient("127.0.0.1", 11300) as client:
        result = client.call("resize", b"img-42", timeout=5)

Rules: one command at a time on the one connection (a call blocks it, as on the server); a
connection is opened on first use and again after it was lost. A reply that does not come
within its bound (a call's or wait's timeout plus REPLY_GRACE_S; ``io_timeout`` for the rest)
closes the connection, since a late reply would be taken for the next command's: the caller
gets CallTimedOut / TimedOut (a call then does not know whether its job was stored), or
ClientConnectionError. Not thread-safe: one client per thread, as a socket is.
"""

from __future__ import annotations

import socket
from collections import deque
from types import TracebackType

from tubeq.client.args import _expect, _tube, _uint
from tubeq.client.ends import REPLY_GRACE_S, Ended, ended_of, result_of, wait_line, wait_ms
from tubeq.client.errors import CallTimedOut, ClientConnectionError, ProtocolError, TimedOut
from tubeq.client.parser import Reply, ReplyParser
from tubeq.client.policies import put_with_line
from tubeq.client.wire import (
    CRLF,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_PRIORITY,
    DEFAULT_TTR,
    DEFAULT_TUBE,
    DUPLICATE,
    ENDED,
    INSERTED,
    USING,
)

IO_TIMEOUT_S = 30.0  # bound on a command that does not wait for a job (put, use)
READ_SIZE = 1 << 16


class BlockingClient:
    """One connection to a tubeq (or beanstalkd, for ``put``) server, used synchronously."""

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                 connect_timeout: float = 5.0, io_timeout: float = IO_TIMEOUT_S) -> None:
        self.host, self.port = host, port
        self.connect_timeout = connect_timeout
        self.io_timeout = io_timeout
        self._sock: socket.socket | None = None
        self._parser = ReplyParser()
        self._replies: deque[Reply] = deque()
        self._used = DEFAULT_TUBE

    # -- connection ---------------------------------------------------------------------------

    def connect(self) -> None:
        if self._sock is not None:
            return
        try:
            self._sock = socket.create_connection((self.host, self.port), self.connect_timeout)
        except OSError as error:
            raise ClientConnectionError(f"{self.host}:{self.port}: {error}") from error
        self._parser, self._replies, self._used = ReplyParser(), deque(), DEFAULT_TUBE

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> BlockingClient:
        self.connect()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _exchange(self, data: bytes, count: int, timeout: float) -> list[Reply]:
        """Send ``data`` (``count`` commands) and read their ``count`` replies within
        ``timeout`` s; socket.timeout (the connection closed) when they do not come."""
        self.connect()
        sock = self._sock
        assert sock is not None
        try:
            sock.settimeout(timeout)
            sock.sendall(data)
            while len(self._replies) < count:
                chunk = sock.recv(READ_SIZE)
                if not chunk:
                    raise ClientConnectionError(f"{self.host}:{self.port}: the server closed "
                                                "the connection")
                self._replies.extend(self._parser.feed(chunk))
                if self._parser.error is not None:
                    raise self._parser.error
        except TimeoutError:
            self.close()  # a late reply would be read as the next command's
            raise
        except (OSError, ClientConnectionError, ProtocolError) as error:
            self.close()
            if isinstance(error, OSError):
                raise ClientConnectionError(f"{self.host}:{self.port}: {error}") from error
            raise
        return [self._replies.popleft() for _ in range(count)]

    # -- commands -----------------------------------------------------------------------------

    def use(self, tube: str) -> str:
        """Make ``tube`` the tube ``put`` acts on; returns it."""
        reply, = self._exchange(b"use %s\r\n" % _tube(tube), 1, self.io_timeout)
        _expect(reply, "use", USING)
        self._used = tube
        return tube

    def put(self, body: bytes | str, *, tube: str | None = None, pri: int = DEFAULT_PRIORITY,
            delay: int = 0, ttr: int = DEFAULT_TTR) -> int:
        """Put a job (into ``tube``, else the used one); returns its id."""
        if tube is not None and tube != self._used:
            self.use(tube)
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        line = b"put %d %d %d %d\r\n" % (_uint(pri, "pri"), _uint(delay, "delay"),
                                         _uint(ttr, "ttr"), len(data))
        reply, = self._exchange(line + data + CRLF, 1, self.io_timeout)
        _expect(reply, "put", INSERTED)
        return reply.int_arg(0)

    def call(self, tube: str, body: bytes | str, *, timeout: float,
             pri: int = DEFAULT_PRIORITY, ttr: int = DEFAULT_TTR, key: str | None = None) -> bytes:
        """Request/reply: put a job into ``tube`` and wait up to ``timeout`` s for a worker to
        finish it; its result (as ``Client.call``: CallTimedOut, JobNotFinished, put-with's
        errors)."""
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        line = put_with_line(pri, 0, ttr, len(data), delay_ms=None, max_tries=None,
                             backoff_ms=None, backoff_max_ms=None, ttl_ms=None, on_expire=None,
                             key=key)
        line = line[:-2] + b" tube=%s wait-ms=%d\r\n" % (_tube(tube), wait_ms(timeout))
        try:
            reply, = self._exchange(line + data + CRLF, 1, timeout + REPLY_GRACE_S)
        except TimeoutError:
            raise CallTimedOut("call", None) from None
        _expect(reply, "call", ENDED, INSERTED, DUPLICATE)
        if reply.word != ENDED:
            raise CallTimedOut("call", reply.int_arg(0))
        return result_of(ended_of(reply))

    def wait_end(self, job_id: int, timeout: float) -> Ended:
        """How job ``job_id`` ended, waiting up to ``timeout`` s (TimedOut, NotFound)."""
        try:
            reply, = self._exchange(wait_line(job_id, timeout), 1, timeout + REPLY_GRACE_S)
        except TimeoutError:
            raise TimedOut("wait", " (no answer from the server)") from None
        _expect(reply, "wait", ENDED)
        return ended_of(reply)

    def wait(self, job_id: int, timeout: float) -> bytes:
        """The result of job ``job_id`` once finished (JobNotFinished for any other end)."""
        return result_of(self.wait_end(job_id, timeout))
