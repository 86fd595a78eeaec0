"""tubeq-cli, run as a subprocess (``python -m tubeq.client.cli``) against beanstalkd 1.12 and
tubeq: every command in text and JSON, top --once, and each failure as one line on stderr.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import ServerProcess
from tests.support.wire import Wire
from tubeq.client import Client

pytestmark = pytest.mark.timeout(60)

# One command: the CLI connects, answers and exits; a bound against a hung process, not a
# measure.
RUN_TIMEOUT_S = 30


class Cli:
    def __init__(self, host: str, port: int, kind: str = "") -> None:
        self.host, self.port, self.kind = host, port, kind

    def run(self, *args: str, stdin: bytes = b"", status: int = 0,
            connect: bool = True) -> subprocess.CompletedProcess[str]:
        where = ["-H", self.host, "-p", str(self.port)] if connect else []
        done = subprocess.run([sys.executable, "-m", "tubeq.client.cli", *where, *args],
                              input=stdin, capture_output=True, timeout=RUN_TIMEOUT_S, check=False)
        result = subprocess.CompletedProcess(done.args, done.returncode,
                                             done.stdout.decode(), done.stderr.decode())
        assert done.returncode == status, (args, result.stdout, result.stderr)
        if status == 0:
            assert result.stderr == "", result.stderr
        return result

    def json(self, *args: str, stdin: bytes = b"") -> Any:
        return json.loads(self.run("--json", *args, stdin=stdin).stdout)

    def fails(self, *args: str, status: int = 1, connect: bool = True) -> str:
        """Run a failing command: exactly one line on stderr, nothing on stdout; return it."""
        result = self.run(*args, status=status, connect=connect)
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tubeq-cli: "), result.stderr
        return lines[0]


@pytest.fixture
def cli(any_server: ServerProcess) -> Cli:
    return Cli(any_server.host, any_server.port, any_server.kind)


def test_put_peek_delete(cli: Cli, tube_name: str, tmp_path: Path) -> None:
    out = cli.run("put", "hello", "-t", tube_name, "--pri", "5").stdout
    assert out.startswith("inserted job ") and out.endswith(f" into tube {tube_name}\n")
    first = int(out.split()[2])
    second = cli.json("put", "-t", tube_name, "--ttr", "30", stdin=b"from stdin\n")
    assert second["tube"] == tube_name and second["bytes"] == 11
    body = tmp_path / "body.bin"
    body.write_bytes(b"\xff\x00binary")
    third = cli.json("put", "--file", str(body), "-t", tube_name, "--delay", "100")

    out = cli.run("peek", "ready", "-t", tube_name).stdout
    header, text = out.split("\n", 1)
    assert header.startswith(f"job {first} (tube {tube_name}, state ready, pri 5,")
    assert text == "hello\n"
    shown = cli.json("peek", str(second["id"]))
    assert (shown["body"], shown["ttr"], shown["state"]) == ("from stdin\n", 30, "ready")
    delayed = cli.json("peek", "delayed", "-t", tube_name)
    assert delayed["id"] == third["id"] and delayed["body_base64"] == "/wBiaW5hcnk="

    out = cli.run("delete", str(first), str(second["id"]), str(third["id"])).stdout
    assert out == "".join(f"deleted job {i}\n" for i in (first, second["id"], third["id"]))
    assert cli.fails("peek", str(first)) == f"tubeq-cli: job {first} not found"
    assert cli.fails("peek", "ready", "-t", tube_name) == (
        f"tubeq-cli: no ready job in tube {tube_name}")


def test_bury_kick_and_kick_job(cli: Cli, tube_name: str) -> None:
    job = cli.json("put", "x", "-t", tube_name, "--pri", "9")["id"]
    assert cli.run("bury", str(job)).stdout == f"buried job {job}\n"
    buried = cli.json("peek", "buried", "-t", tube_name)
    assert (buried["id"], buried["state"], buried["pri"]) == (job, "buried", 9)
    assert cli.run("kick", "5", "-t", tube_name).stdout == f"kicked 1 job in tube {tube_name}\n"
    assert cli.json("bury", str(job), "--pri", "3") == {"id": job, "buried": True, "pri": 3}
    assert cli.json("kick-job", str(job)) == {"id": job, "kicked": True}
    stats = cli.json("stats", "-j", str(job))
    assert (stats["state"], stats["pri"], stats["buries"], stats["kicks"]) == ("ready", 3, 2, 2)
    assert cli.json("kick", "-t", tube_name) == {"kicked": 0, "tube": tube_name}
    cli.run("delete", str(job))


def test_pause_stats_and_list(cli: Cli, tube_name: str) -> None:
    job = cli.json("put", "x", "-t", tube_name)["id"]
    assert cli.run("pause", tube_name, "60").stdout == f"paused tube {tube_name} for 60 s\n"
    tube = cli.json("stats", "-t", tube_name)
    assert (tube["name"], tube["pause"], tube["current-jobs-ready"]) == (tube_name, 60, 1)
    assert cli.json("pause", tube_name, "0") == {"tube": tube_name, "paused": 0}
    server = cli.json("stats")
    assert isinstance(server["version"], str) and isinstance(server["uptime"], int)
    lines = dict(line.split(None, 1) for line in cli.run("stats").stdout.splitlines())
    assert int(lines["current-connections"]) >= 1  # "key  value" lines, beanstalkd's keys
    assert lines["version"] == server["version"]
    # options may also come after the subcommand
    after = ("stats", "--json", "-j", str(job), "-H", cli.host, "-p", str(cli.port))
    job_stats = cli.run(*after, connect=False).stdout
    assert json.loads(job_stats)["tube"] == tube_name
    assert tube_name in cli.run("list").stdout.splitlines()
    assert tube_name in cli.json("list-tubes")
    cli.run("delete", str(job))


def test_top_once(cli: Cli, tube_name: str) -> None:
    ids = [cli.json("put", body, "-t", tube_name)["id"] for body in ("a", "b", "c")]
    ids.append(cli.json("put", "d", "-t", tube_name, "--delay", "100")["id"])
    out = cli.run("top", "--once", "-n", "0.2").stdout
    lines = out.splitlines()
    assert lines[0].startswith(f"{cli.host}:{cli.port}  {cli.kind} ")
    assert lines[2].split() == ["TUBE", "READY", "DELAYED", "RESERVED", "BURIED", "WAITING",
                                "PUT/S", "DELETE/S", "PAUSED"]
    row = next(line.split() for line in lines if line.startswith(tube_name + " "))
    assert row == [tube_name, "3", "1", "0", "0", "0", "0.0", "0.0", "-"]
    assert "\x1b" not in out  # not a terminal: no screen control

    frame = cli.json("top", "--once", "-n", "0.2")
    assert frame["interval"] > 0 and isinstance(frame["put_rate"], float)
    tube = next(t for t in frame["tubes"] if t["tube"] == tube_name)
    assert (tube["ready"], tube["delayed"], tube["total_jobs"], tube["put_rate"]) == (
        3, 1, 4, 0.0)
    cli.run("delete", *map(str, ids))


def test_failures_are_one_line_and_non_zero(cli: Cli, tube_name: str) -> None:
    missing = str(2**63)
    assert cli.fails("peek", missing) == f"tubeq-cli: job {missing} not found"
    assert cli.fails("delete", missing) == (
        f"tubeq-cli: job {missing} not found (or reserved by a worker)")
    assert cli.fails("kick-job", missing).startswith(f"tubeq-cli: job {missing} not found")
    assert cli.fails("bury", missing).startswith(f"tubeq-cli: job {missing} not found")
    assert cli.fails("stats", "-j", missing) == f"tubeq-cli: job {missing} not found"
    assert cli.fails("stats", "-t", f"{tube_name}-none") == (
        f"tubeq-cli: tube {tube_name}-none not found")
    assert cli.fails("pause", f"{tube_name}-none", "5") == (
        f"tubeq-cli: tube {tube_name}-none not found")
    assert "BAD_FORMAT" in cli.fails("put", "x", "-t=-dash", status=2)


def test_bad_arguments_exit_2(client_beanstalkd: ServerProcess) -> None:
    """Argument errors do not depend on the server: checked once, against beanstalkd."""
    cli = Cli(client_beanstalkd.host, client_beanstalkd.port)
    assert "--pri" in cli.fails("put", "x", "--pri", "high", status=2)
    assert "peek what?" in cli.fails("peek", "soon", status=2)
    assert "tube name" in cli.fails("put", "x", "-t", "a b", status=2)
    assert "not both" in cli.fails("put", "x", "--file", "/dev/null", status=2)
    assert cli.fails("frobnicate", status=2).startswith("tubeq-cli: error: argument COMMAND")
    assert cli.fails(status=2).startswith("tubeq-cli: error:")
    assert cli.fails("put", "--file", "/nonexistent/body").startswith(
        "tubeq-cli: cannot read /nonexistent/body")


def test_a_count_option_says_it_wants_a_count(client_beanstalkd: ServerProcess) -> None:
    cli = Cli(client_beanstalkd.host, client_beanstalkd.port)
    refused = cli.fails("put", "x", "--max-tries", "abc", status=2)
    assert "--max-tries: not an integer from 0 to 4294967295: 'abc'" in refused, refused
    assert "milliseconds" not in refused
    refused = cli.fails("put", "x", "--ttl-ms", "soon", status=2)
    assert "--ttl-ms: not a number of milliseconds from 0 to 4294967295000: 'soon'" in refused


def test_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        port = sock.getsockname()[1]
        cli = Cli("127.0.0.1", port)
        for args in (["list"], ["top", "--once"], ["put", "x"]):
            assert cli.fails(*args) == (
                f"tubeq-cli: cannot connect to 127.0.0.1:{port}: Connection refused")


def test_call_and_wait_show_a_result_or_how_the_job_ended(client_tubeq: ServerProcess,
                                                          tube_name: str) -> None:
    """tubeq-cli call: the result of a worker's finish; wait: the same for a job by id, or
    one line saying how else it ended or that it has not."""
    cli = Cli(client_tubeq.host, client_tubeq.port, client_tubeq.kind)

    async def worker(count: int, answer: bytes) -> None:
        async with Client(*client_tubeq.address) as client:
            await client.watch(tube_name)
            await client.ignore("default")  # other tests' jobs are not this worker's
            for _ in range(count):
                job = await client.reserve_with_timeout(20)
                await job.finish(answer + job.body)

    def with_worker(count: int, answer: bytes) -> threading.Thread:
        thread = threading.Thread(target=asyncio.run, args=(worker(count, answer),))
        thread.start()
        return thread

    thread = with_worker(2, b"re: ")
    assert cli.run("call", "ping", "-t", tube_name, "--wait", "20").stdout == "re: ping\n"
    assert cli.json("call", "-t", tube_name, stdin=b"\xff") == {
        "ended": "finished", "body_base64": base64.b64encode(b"re: \xff").decode()}
    thread.join(RUN_TIMEOUT_S)
    line = cli.fails("call", "nobody", "-t", tube_name, "--wait", "0.5")
    assert line.startswith("tubeq-cli: no result within 0.5 s; tubeq-cli wait "), line
    job_id = int(line.rsplit("tubeq-cli wait ", 1)[1].split()[0])
    assert line == (f"tubeq-cli: no result within 0.5 s; tubeq-cli wait {job_id} goes on")
    assert cli.fails("wait", str(job_id), "--wait", "0") == (
        f"tubeq-cli: job {job_id} has not ended within 0 s")
    thread = with_worker(1, b"late ")
    assert cli.json("wait", str(job_id), "--wait", "20") == {
        "id": job_id, "ended": "finished", "body": "late nobody"}
    thread.join(RUN_TIMEOUT_S)
    assert cli.fails("wait", "987654321") == (
        "tubeq-cli: job 987654321 not found, and no end of it kept")
    buried = int(cli.run("put", "x", "-t", tube_name).stdout.split()[2])
    cli.run("bury", str(buried))
    assert cli.fails("wait", str(buried)) == f"tubeq-cli: job {buried} ended buried"


def test_put_after_holds_a_job_until_its_parent_finished(client_tubeq: ServerProcess,
                                                         tube_name: str) -> None:
    cli = Cli(client_tubeq.host, client_tubeq.port, client_tubeq.kind)
    parent = cli.json("put", "p", "-t", tube_name)["id"]
    child = cli.json("put", "c", "-t", tube_name, "--after", str(parent))
    assert child["inserted"]
    assert cli.json("stats", "-j", str(child["id"]))["state"] == "held"
    assert cli.fails("put", "x", "-t", tube_name, "--after", "987654321") == (
        f"tubeq-cli: {client_tubeq.host}:{client_tubeq.port} answered put-with"
        f": UNKNOWN_PARENT 987654321")
    assert "--after: 'x,1': job ids joined by commas" in cli.fails(
        "put", "x", "--after", "x,1", status=2, connect=False)


def test_put_group_puts_a_job_into_a_group_of_its_tube(client_tubeq: ServerProcess,
                                                         tube_name: str) -> None:
    """--group: the tube's groups take turns (protocol.md, "Groups"); a bad key is the
    server's BAD_OPTION, said plainly, and nothing is stored."""
    cli = Cli(client_tubeq.host, client_tubeq.port, client_tubeq.kind)
    first = cli.json("put", "a1", "-t", tube_name, "--group", "acme")["id"]
    cli.json("put", "a2", "-t", tube_name, "--group", "acme")
    third = cli.json("put", "b1", "-t", tube_name, "--group", "bolt")["id"]
    with Wire(client_tubeq.host, client_tubeq.port) as w:
        w.ask(f"watch {tube_name}")
        w.ask("ignore default")
        taken = [int(w.ask("reserve-with-timeout 0").split()[1]) for _ in range(2)]
    assert taken == [first, third]  # acme's turn, then bolt's, before acme's second
    assert cli.fails("put", "x", "-t", tube_name, "--group=-bad") == (
        f"tubeq-cli: {client_tubeq.host}:{client_tubeq.port} answered put-with"
        f": BAD_OPTION group")
    assert cli.json("stats", "-t", tube_name)["total-jobs"] == 3


def test_quiet_asks_push_consumers_to_stop(client_tubeq: ServerProcess) -> None:
    """tubeq-cli quiet: all, a tube's, one connection's; a push connection that asked hears
    QUIET; beanstalkd knows no quiet (a clear error)."""
    cli = Cli(client_tubeq.host, client_tubeq.port)
    with socket.create_connection(client_tubeq.address, timeout=RUN_TIMEOUT_S) as consumer:
        consumer.sendall(b"watch cli-quiet\r\nignore default\r\npush 1 quiet=1\r\n")
        got = b""
        while b"PUSHING 1\r\n" not in got:
            got += consumer.recv(100)
        assert got == b"WATCHING 2\r\nWATCHING 1\r\nPUSHING 1\r\n"
        assert cli.run("quiet", "--tube", "cli-quiet").stdout == (
            "asked push consumers (watching tube cli-quiet) to stop taking jobs\n")
        got = b""
        while len(got) < len(b"QUIET\r\n"):
            got += consumer.recv(100)
        assert got == b"QUIET\r\n"
    assert cli.json("quiet") == {"quieting": "all"}
    assert cli.json("quiet", "--conn", "abc:1") == {"quieting": "conn", "conn": "abc:1"}
    assert cli.fails("quiet", "--conn", "a b") == (
        "tubeq-cli: quiet: not a connection token: 'a b'")


def test_quiet_against_beanstalkd_says_it_is_not_there(client_beanstalkd: ServerProcess) -> None:
    cli = Cli(client_beanstalkd.host, client_beanstalkd.port)
    assert cli.fails("quiet").endswith(" answered quiet: UNKNOWN_COMMAND")
