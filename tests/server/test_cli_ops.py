"""The command line of the operations features: --metrics, --metrics-max-tubes, --slow-ms,
--log-format; bad values are refused with exit 2, a taken HTTP port fails with one line."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tubeq.cli import parse_args
from tubeq.redisio.process import RedisProcess, free_port


def test_the_defaults_leave_the_listener_and_the_slow_log_off() -> None:
    args = parse_args([])
    assert (args.metrics, args.metrics_max_tubes, args.slow_ms, args.log_format) == (
        None, 100, 0, "console")


def test_the_slow_log_is_on_with_metrics_unless_told() -> None:
    assert parse_args(["--metrics", "127.0.0.1:0"]).slow_ms == 1000
    assert parse_args(["--metrics", "127.0.0.1:0", "--slow-ms", "0"]).slow_ms == 0
    assert parse_args(["--slow-ms", "250"]).slow_ms == 250


@pytest.mark.parametrize(("text", "address"), [
    ("127.0.0.1:11301", ("127.0.0.1", 11301)),
    ("localhost:0", ("localhost", 0)),
    ("[::1]:9000", ("::1", 9000)),
])
def test_metrics_takes_addr_port(text: str, address: tuple[str, int]) -> None:
    assert parse_args(["--metrics", text]).metrics == address


@pytest.mark.parametrize(("flags", "message"), [
    (["--metrics", "11301"], "is not ADDR:PORT"),
    (["--metrics", "127.0.0.1:"], "is not ADDR:PORT"),
    (["--metrics", "127.0.0.1:70000"], "is not ADDR:PORT"),
    (["--metrics", ":80"], "is not ADDR:PORT"),
    (["--metrics-max-tubes", "0"], "--metrics-max-tubes must be at least 1"),
    (["--slow-ms", "-1"], "--slow-ms must be 0 (off) or more"),
    (["--log-format", "xml"], "invalid choice"),
])
def test_bad_values_are_refused(flags: list[str], message: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(flags)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_taken_http_port_is_one_clear_line(redis_process: RedisProcess) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http_port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "tubeq", "-p", str(free_port()), "--redis",
             redis_process.url, "--prefix", "taken-port", "--metrics",
             f"127.0.0.1:{http_port}"], capture_output=True, timeout=60)
    assert proc.returncode == 1
    last = proc.stderr.splitlines()[-1]
    assert last.startswith(b"tubeq:") and b"address already in use" in last.lower()
