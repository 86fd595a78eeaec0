"""The put-with session shown in README.md ("Beyond beanstalkd"), replayed against a fresh tubeq:
each typed line (and a put-with's body line) is sent as ``nc -C`` would, and the terminal must
show the next lines of the file. README.md must include the file verbatim."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from tests.differential.test_readme_session import PROMPT, REPLY_TIMEOUT_S, ReplyReader
from tests.support.servers import ServerProcess, unique_prefix

SESSION_FILE = Path(__file__).parent / "readme_policies.txt"
README = Path(__file__).parents[2] / "README.md"


def test_the_readme_shows_the_session_verbatim() -> None:
    text = SESSION_FILE.read_text()
    assert text.splitlines()[0] == PROMPT
    assert "```\n" + text + "```\n" in README.read_text()


def test_readme_policies_session(tubeq_factory: Callable[[str], ServerProcess]) -> None:
    server = tubeq_factory(unique_prefix("readme-policies"))
    lines = SESSION_FILE.read_text().splitlines()[1:]
    with socket.create_connection(server.address, timeout=REPLY_TIMEOUT_S) as sock:
        reader = ReplyReader(sock)
        index = 0
        while index < len(lines):
            command = lines[index]
            typed = [command] + ([lines[index + 1]] if command.startswith("put") else [])
            index += len(typed)
            for line in typed:
                sock.sendall(line.encode() + b"\r\n")
            if command == "quit":
                assert index == len(lines), f"lines after quit: {lines[index:]}"
                reader.expect_closed()
                return
            shown = reader.reply().decode().replace("\r\n", "\n").split("\n")[:-1]
            assert shown == lines[index:index + len(shown)], (typed, shown)
            index += len(shown)
    raise AssertionError("the session file does not end with quit")
