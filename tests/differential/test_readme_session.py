"""The terminal session shown in the README, replayed byte for byte against tubeq and beanstalkd.

``tests/differential/readme_session.txt`` is exactly what a terminal shows for
``nc -C 127.0.0.1 11300`` (``-C`` sends each typed line with CRLF, as the protocol requires): the
prompt line, then the lines typed and the server's replies, in order. The README includes the file
verbatim; this test is what keeps it true. It types each command line (and a ``put``'s body line)
as nc would, reads one complete reply, and checks that the terminal would show the next lines of
the file, the reply's CRLFs rendered as line ends. After ``quit`` the server must close the
connection.

Each run gets a fresh server, so job ids start at 1 and the tube's counters at 0.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.servers import ServerKind, ServerProcess, start_beanstalkd, unique_prefix

SESSION_FILE = Path(__file__).parent / "readme_session.txt"
PROMPT = "$ nc -C 127.0.0.1 11300"
# Replies on loopback take milliseconds; the bound only stops a server that never answers.
REPLY_TIMEOUT_S = 5.0
# Reply words followed by a "<bytes>"-long body and CRLF (the last field of the reply line).
REPLIES_WITH_BODY = ("RESERVED", "FOUND", "OK")


@pytest.fixture(params=["tubeq", "beanstalkd"])
def fresh_server(request: pytest.FixtureRequest,
                 tmp_path: Path) -> Iterator[ServerProcess]:
    """A server no other test has talked to: the session's ids and counters start at zero."""
    kind: ServerKind = request.param
    if kind == "tubeq":
        start_tubeq: Callable[[str], ServerProcess] = request.getfixturevalue("tubeq_factory")
        yield start_tubeq(unique_prefix("readme"))
        return
    server = start_beanstalkd(tmp_path, "beanstalkd-readme")
    try:
        yield server
    finally:
        server.stop()


class ReplyReader:
    """Reads whole replies from a socket: a line, plus the body that its last field announces."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self, what: str) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise AssertionError(f"server closed the connection while sending {what}; "
                                 f"received so far: {self.buffer!r}")
        self.buffer += chunk

    def reply(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill("a reply line")
        line, _, rest = self.buffer.partition(b"\r\n")
        size = 0
        fields = line.split(b" ")
        if fields[0].decode(errors="replace") in REPLIES_WITH_BODY and fields[-1].isdigit():
            size = int(fields[-1]) + 2
        while len(rest) < size:
            self._fill(f"the body of {line!r}")
            line, _, rest = self.buffer.partition(b"\r\n")
        self.buffer = rest[size:]
        return line + b"\r\n" + rest[:size]

    def expect_closed(self) -> None:
        chunk = self.sock.recv(65536)
        assert self.buffer + chunk == b"", (
            f"after quit: expected the server to close the connection, got "
            f"{self.buffer + chunk!r}")


def test_session_file_starts_with_the_prompt() -> None:
    first = SESSION_FILE.read_text().splitlines()[0]
    assert first == PROMPT


def test_readme_session(fresh_server: ServerProcess) -> None:
    lines = SESSION_FILE.read_text().splitlines()[1:]
    with socket.create_connection(fresh_server.address, timeout=REPLY_TIMEOUT_S) as sock:
        reader = ReplyReader(sock)
        index = 0
        while index < len(lines):
            command = lines[index]
            typed = [command]
            if command.startswith("put "):
                typed.append(lines[index + 1])
            index += len(typed)
            for line in typed:
                sock.sendall(line.encode() + b"\r\n")
            if command == "quit":
                assert index == len(lines), f"lines after quit: {lines[index:]}"
                reader.expect_closed()
                break
            reply = reader.reply()
            shown = reply.decode().replace("\r\n", "\n").split("\n")[:-1]
            expected = lines[index:index + len(shown)]
            assert shown == expected, (
                f"{fresh_server.describe()}: after typing {typed}, the terminal shows {shown} "
                f"but the session file has {expected}; exact reply bytes: {reply!r}")
            index += len(shown)
        else:
            pytest.fail("the session file does not end with quit")
