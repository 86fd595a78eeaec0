"""A blocking line client for the extension tests: send raw protocol lines, read whole replies.

Each reply is returned whole: its line, and for a reply that announces data (``OK``,
``RESERVED``, ``FOUND``) the data too, so a test compares exact bytes. Every read is bounded
by ``TIMEOUT_S``; none is asserted as a duration.
"""

from __future__ import annotations

import socket
from types import TracebackType

TIMEOUT_S = 10.0
_WITH_DATA = (b"OK", b"RESERVED", b"FOUND", b"ENDED")  # ENDED: tubeq's wait and call


class Wire:
    """One connection to a server at ``(host, port)``."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT_S)
        self.buffer = b""

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.sock.close()

    def send(self, data: bytes | str) -> None:
        """Send ``data`` as is (bytes) or as a line (str, CRLF added)."""
        raw = data if isinstance(data, bytes) else data.encode() + b"\r\n"
        self.sock.sendall(raw)

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed with {self.buffer!r} buffered")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def reply(self) -> bytes:
        """The next whole reply, CRLFs included."""
        while b"\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed with {self.buffer!r} buffered")
            self.buffer += chunk
        end = self.buffer.index(b"\r\n") + 2
        line, self.buffer = self.buffer[:end], self.buffer[end:]
        words = line.split()
        if words and words[0] in _WITH_DATA and len(words) >= 2:
            line += self._read(int(words[-1]) + 2)
        return line

    def ask(self, data: bytes | str) -> bytes:
        """Send, then read one reply."""
        self.send(data)
        return self.reply()

    def yaml(self, data: bytes | str) -> dict[str, str]:
        """Send a stats-like command and parse its flat YAML document."""
        reply = self.ask(data)
        assert reply.startswith(b"OK "), reply
        body = reply.split(b"\r\n", 1)[1][:-2].decode()
        pairs = (line.partition(": ") for line in body.split("\n")[1:] if line)
        return {key: value for key, _, value in pairs}
