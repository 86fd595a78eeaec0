"""Random input against a live server: it must keep answering well-formed replies and stay up.

Hypothesis sends random byte strings and random sequences of valid and invalid commands over one
connection. After each example: every reply that came back parses by the reply grammar with a
known reply word; the server closed the connection only if a ``quit`` was sent; the server process
is alive; and a fresh connection's ``list-tube-used`` still answers ``USING default``.

The server is a tubeq process of its own (fresh prefix), so the fuzzer's puts, pauses and deletes
cannot disturb any other test; with ``--wire-target=beanstalkd`` it is a private beanstalkd (the
test's self-check).
"""

from __future__ import annotations

import re
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.differential.grammar import Malformed, split_reply, well_formed
from tests.support.servers import ServerKind, ServerProcess, start_beanstalkd, unique_prefix
from tubeq.protocol.grammar import EXTENSION_NAMES

# Bounds: the whole test stays well under 30 s.
EXAMPLES = 60
QUIET_S = 0.15  # no more replies are coming once the connection is this quiet
READ_BOUND_S = 3.0  # longest we read the replies of one example
CONNECT_TIMEOUT_S = 5.0

TUBES = ("default", f"fz-{secrets.token_hex(3)}", f"fz-{secrets.token_hex(3)}")
# Numbers around every boundary the grammar has: u32, u64, signed, garbage.
NUMBERS = st.one_of(
    st.integers(min_value=0, max_value=20),
    st.sampled_from([4294967295, 4294967296, 18446744073709551615, 18446744073709551616]),
).map(str) | st.sampled_from(["-1", "+1", "", "x", "1x", " 1", "007"])
TUBE_NAMES = st.sampled_from(TUBES) | st.sampled_from(["-bad", "a b", "", "x" * 201, "ok$_()"])
BODIES = st.binary(max_size=40)


@st.composite
def put_commands(draw: st.DrawFn) -> bytes:
    """A put whose declared size may or may not match its body and terminator."""
    body = draw(BODIES)
    declared = draw(st.sampled_from([len(body), len(body) + 1, max(len(body) - 1, 0)]))
    terminator = draw(st.sampled_from([b"\r\n", b"\r\n", b"XY", b""]))
    pri, delay, ttr = draw(st.tuples(NUMBERS, st.sampled_from(["0", "1"]), NUMBERS))
    return f"put {pri} {delay} {ttr} {declared}\r\n".encode() + body + terminator


def _command_lines() -> st.SearchStrategy[bytes]:
    """One command line: every verb with well-formed or malformed arguments.

    Plain ``reserve`` and positive reserve timeouts are left out: they would block the connection
    and the example would only observe silence.
    """
    n = NUMBERS
    lines = st.one_of(
        st.builds("peek {}".format, n), st.builds("delete {}".format, n),
        st.builds("release {} {} {}".format, n, n, st.sampled_from(["0", "1"])),
        st.builds("bury {} {}".format, n, n), st.builds("touch {}".format, n),
        st.builds("kick {}".format, n), st.builds("kick-job {}".format, n),
        st.builds("stats-job {}".format, n), st.builds("reserve-job {}".format, n),
        st.builds("use {}".format, TUBE_NAMES), st.builds("watch {}".format, TUBE_NAMES),
        st.builds("ignore {}".format, TUBE_NAMES), st.builds("stats-tube {}".format, TUBE_NAMES),
        st.builds("pause-tube {} {}".format, TUBE_NAMES, st.sampled_from(["0", "1", "x"])),
        st.sampled_from(["reserve-with-timeout 0", "reserve-with-timeout -0", "peek-ready",
                         "peek-delayed", "peek-buried", "stats", "list-tubes", "list-tube-used",
                         "list-tubes-watched", "quit", "reservex", "bogus", "", "PUT 1 2 3 4",
                         "stats-jobx", "list-tubesx", "x" * 230]),
    )
    return lines.map(lambda line: line.encode() + b"\r\n")


COMMAND_SEQUENCES = st.lists(st.one_of(_command_lines(), put_commands()), max_size=10).map(b"".join)
RANDOM_BYTES = st.binary(max_size=300) | st.lists(
    st.sampled_from([b"\r\n", b"\r", b"\n", b"\x00", b" ", b"put ", b"stats", b"0", b"x" * 60]),
    max_size=30).map(b"".join)


@pytest.fixture
def fuzz_server(wire_target_kind: ServerKind, tmp_path: Path,
                tubeq_factory: Callable[[str], ServerProcess]) -> Iterator[ServerProcess]:
    if wire_target_kind == "tubeq":
        yield tubeq_factory(unique_prefix("tq-fuzz"))
        return
    server = start_beanstalkd(tmp_path, "beanstalkd-fuzz")
    yield server
    server.stop()


def _send_and_collect(server: ServerProcess, payload: bytes) -> tuple[bytes, bool]:
    """Send ``payload``; return every byte that came back and whether the server closed."""
    received = b""
    with socket.create_connection(server.address, timeout=CONNECT_TIMEOUT_S) as sock:
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            return received, True
        deadline = time.monotonic() + READ_BOUND_S
        sock.settimeout(QUIET_S)
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if _complete(received):
                    return received, False
                continue
            except ConnectionResetError:
                return received, True
            if not chunk:
                return received, True
            received += chunk
    return received, False


def _complete(data: bytes) -> bool:
    """Whether ``data`` is a whole number of replies (a reply may still be on its way)."""
    while data:
        parsed = split_reply(data)
        if parsed is None:
            return False
        data = data[parsed[1]:]
    return True


def _problems_with_replies(data: bytes) -> list[str]:
    problems = []
    while data:
        parsed = split_reply(data)
        if parsed is None:
            problems.append(f"an incomplete reply at the end: {data[:120]!r}")
            break
        outcome, used = parsed
        data = data[used:]
        why = outcome.why if isinstance(outcome, Malformed) else well_formed(outcome)
        if why is not None:
            problems.append(f"{why}: {outcome.raw[:120]!r}")
    return problems


def _assert_still_serving(server: ServerProcess) -> None:
    assert server.alive(), f"{server.describe()} died:\n{server.log_tail()}"
    with socket.create_connection(server.address, timeout=CONNECT_TIMEOUT_S) as sock:
        sock.sendall(b"list-tube-used\r\n")
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = sock.recv(256)
            assert chunk, "a fresh connection was closed before answering list-tube-used"
            reply += chunk
    assert reply == b"USING default\r\n", reply


# A line that starts with a tubeq extension's word (protocol.md, "Extensions"): the payload
# used an extension, so its replies are tubeq's own (QUIETING, FINISHED ...), not beanstalkd's.
_EXTENSION_LINE = re.compile(
    rb"(?:^|\n)(?:" + b"|".join(re.escape(name.encode()) for name in EXTENSION_NAMES)
    + rb")(?: |\r\n)")


def _check_example(server: ServerProcess, payload: bytes) -> None:
    received, closed = _send_and_collect(server, payload)
    if _EXTENSION_LINE.search(payload) is None:  # beanstalkd's replies only, byte-shaped
        problems = _problems_with_replies(received)
        assert not problems, f"payload {payload!r} got malformed replies: {problems}"
    if closed:
        assert b"quit" in payload, f"the server closed the connection without a quit: {payload!r}"
    _assert_still_serving(server)


FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                         suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                HealthCheck.too_slow])


@FUZZ_SETTINGS
@given(payload=RANDOM_BYTES)
def test_random_bytes_keep_the_server_serving(fuzz_server: ServerProcess, payload: bytes) -> None:
    _check_example(fuzz_server, payload)


@FUZZ_SETTINGS
@given(payload=COMMAND_SEQUENCES)
def test_random_command_sequences_keep_the_server_serving(fuzz_server: ServerProcess,
                                                          payload: bytes) -> None:
    _check_example(fuzz_server, payload)
