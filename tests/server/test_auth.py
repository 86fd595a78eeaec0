"""Authentication and namespaces (tubeq.server.access, ``--auth FILE``) through real tubeq
processes.

Before ``auth`` every command answers AUTH_REQUIRED and stores nothing; a token enters its
namespace; namespaces isolate tubes; a listener bound to a namespace serves a client that cannot
send ``auth`` (greenstalk); a TLS client certificate can enter a namespace; a bad access file is
one clear line. Each test uses the session's private Redis under prefixes of its own.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import greenstalk
import pytest
import trustme

from tests.support.servers import unique_prefix
from tests.support.wire import Wire
from tubeq.protocol.batch_framing import PUT_MANY_PART
from tubeq.redisio.process import RedisProcess, free_port
from tubeq.server.access import AccessFileError, load

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 15.0
BILLING = "billing-token-0123456789"
EMAILS = "emails-token-0123456789a"
DEFAULT = "default-token-012345678"


def _access_file(directory: Path, extra: str = "") -> Path:
    path = directory / "access.toml"
    path.write_text(f"""
[tokens]
"{BILLING}" = "billing"
"{EMAILS}" = "emails"
"{DEFAULT}" = "default"
{extra}
""")
    return path


def _wait(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Tubeq:
    def __init__(self, redis: RedisProcess, *flags: str, wait_port: int | None = None) -> None:
        self.port = free_port()
        self.prefix = unique_prefix()
        argv = [sys.executable, "-m", "tubeq", "--redis", redis.url, "--prefix", self.prefix,
                "-p", str(self.port), *flags]
        self.proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(REPO)},
                                     stderr=subprocess.PIPE)
        _wait(self.port, self.proc)
        if wait_port is not None:
            _wait(wait_port, self.proc)

    def wire(self) -> Wire:
        return Wire("127.0.0.1", self.port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def guarded(redis_process: RedisProcess, tmp_path: Path) -> Iterator[Tubeq]:
    server = Tubeq(redis_process, "--auth", str(_access_file(tmp_path)))
    try:
        yield server
    finally:
        server.stop()


def test_before_auth_every_command_is_refused_and_nothing_is_stored(guarded: Tubeq) -> None:
    with guarded.wire() as w:
        for line in ("use emails", "watch emails", "stats", "list-tubes", "reserve-with-timeout 0",
                     "peek-ready", "stats-tube default", "delete 1", "tube-set emails rate=1"):
            assert w.ask(line) == b"AUTH_REQUIRED\r\n", line
        assert w.ask(b"put 0 0 60 5\r\nhello\r\n") == b"AUTH_REQUIRED\r\n"  # body read, dropped
        # A put-many long enough to come in parts still gets one reply, and stores nothing.
        entries = b"0 0 60 1\r\nx\r\n" * (2 * PUT_MANY_PART + 1)
        assert w.ask(b"put-many %d\r\n%s" % (2 * PUT_MANY_PART + 1, entries)) == \
            b"AUTH_REQUIRED\r\n"
        assert w.ask("bogus") == b"UNKNOWN_COMMAND\r\n"
        assert w.ask("extensions").startswith(b"OK ")  # a probe stores nothing
        assert w.ask(f"auth {DEFAULT}") == b"AUTHENTICATED\r\n"
        assert w.ask("peek-ready") == b"NOT_FOUND\r\n"  # the refused put stored nothing
        stats = w.yaml("stats")
        assert (stats["cmd-put"], stats["total-jobs"], stats["cmd-use"]) == ("0", "0", "0")


def test_bad_tokens_are_refused_and_the_third_closes_the_connection(guarded: Tubeq) -> None:
    with guarded.wire() as w:
        assert w.ask("auth not-a-token-at-all-xx") == b"UNAUTHORIZED\r\n"
        assert w.ask("auth") == b"UNKNOWN_COMMAND\r\n"  # 'auth' needs its space and a token
        assert w.ask("auth a b") == b"BAD_FORMAT\r\n"
        assert w.ask("auth also-wrong-but-long-xx") == b"UNAUTHORIZED\r\n"
        assert w.ask("use emails") == b"AUTH_REQUIRED\r\n"
        assert w.ask("auth third-wrong-token-xxxx") == b"UNAUTHORIZED\r\n"
        with pytest.raises(ConnectionError):
            w.ask("use emails")


def test_namespaces_isolate_tubes_of_the_same_name(guarded: Tubeq) -> None:
    with guarded.wire() as billing, guarded.wire() as emails:
        assert billing.ask(f"auth {BILLING}") == b"AUTHENTICATED\r\n"
        assert emails.ask(f"auth {EMAILS}") == b"AUTHENTICATED\r\n"
        for w in (billing, emails):
            assert w.ask("use jobs") == b"USING jobs\r\n"
            assert w.ask("watch jobs") == b"WATCHING 2\r\n"
        assert billing.ask(b"put 0 0 60 7\r\ninvoice\r\n") == b"INSERTED 1\r\n"
        assert emails.ask(b"put 0 0 60 7\r\nwelcome\r\n") == b"INSERTED 1\r\n"  # its own ids
        assert billing.ask("reserve-with-timeout 0") == b"RESERVED 1 7\r\ninvoice\r\n"
        assert emails.ask("reserve-with-timeout 0") == b"RESERVED 1 7\r\nwelcome\r\n"
        assert billing.yaml("stats-tube jobs")["total-jobs"] == "1"
        # Once in, a connection stays in its namespace.
        assert billing.ask(f"auth {EMAILS}") == b"UNAUTHORIZED\r\n"
        assert billing.ask(f"auth {BILLING}") == b"AUTHENTICATED\r\n"


def test_the_default_namespace_is_the_prefix_itself(redis_process: RedisProcess,
                                                    tmp_path: Path) -> None:
    """Turning auth on keeps a deployment's tubes: the token of `default` reaches them."""
    plain = Tubeq(redis_process)
    try:
        with plain.wire() as w:
            assert w.ask(b"put 0 0 60 3\r\nold\r\n") == b"INSERTED 1\r\n"
    finally:
        plain.stop()
    port = free_port()
    argv = [sys.executable, "-m", "tubeq", "--redis", redis_process.url, "--prefix",
            plain.prefix, "-p", str(port), "--auth", str(_access_file(tmp_path))]
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stderr=subprocess.PIPE)
    try:
        _wait(port, proc)
        with Wire("127.0.0.1", port) as w:
            assert w.ask(f"auth {BILLING}") == b"AUTHENTICATED\r\n"
            assert w.ask("peek-ready") == b"NOT_FOUND\r\n"
        with Wire("127.0.0.1", port) as w:
            assert w.ask(f"auth {DEFAULT}") == b"AUTHENTICATED\r\n"
            assert w.ask("peek-ready") == b"FOUND 1 3\r\nold\r\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)


def test_a_bound_listener_serves_a_library_that_cannot_auth(redis_process: RedisProcess,
                                                            tmp_path: Path) -> None:
    bound_port = free_port()
    access = _access_file(tmp_path, f"""
[[listeners]]
port = {bound_port}
namespace = "billing"
""")
    server = Tubeq(redis_process, "--auth", str(access), wait_port=bound_port)
    try:
        with greenstalk.Client(("127.0.0.1", bound_port), use="jobs") as client:
            job_id = client.put("from an old library")
        with server.wire() as w:
            assert w.ask(f"auth {BILLING}") == b"AUTHENTICATED\r\n"
            assert w.ask("use jobs") == b"USING jobs\r\n"
            assert w.ask("peek-ready") == b"FOUND %d 19\r\nfrom an old library\r\n" % job_id
        with server.wire() as w:
            assert w.ask(f"auth {EMAILS}") == b"AUTHENTICATED\r\n"
            assert w.ask("use jobs") == b"USING jobs\r\n"
            assert w.ask("peek-ready") == b"NOT_FOUND\r\n"
    finally:
        server.stop()


def test_a_client_certificate_enters_its_namespace(redis_process: RedisProcess,
                                                   tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    access = _access_file(tmp_path, '[certificates]\n"worker-1.billing" = "billing"\n')
    server = Tubeq(redis_process, "--auth", str(access), "--tls-cert", str(tmp_path / "cert.pem"),
                   "--tls-key", str(tmp_path / "key.pem"), "--tls-client-ca",
                   str(tmp_path / "ca.pem"))

    def talk(common_name: str, *lines: bytes) -> list[bytes]:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        ca.issue_cert(common_name, common_name=common_name).configure_cert(context)
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            out = []
            for line in lines:
                sock.sendall(line)
                out.append(sock.recv(4096))
            return out

    try:
        assert talk("worker-1.billing", b"use jobs\r\n", b"put 0 0 60 1\r\nx\r\n") == [
            b"USING jobs\r\n", b"INSERTED 1\r\n"]
        assert talk("someone-else", b"use jobs\r\n") == [b"AUTH_REQUIRED\r\n"]
    finally:
        server.stop()


def test_auth_without_an_access_file_is_refused_and_changes_nothing(
        redis_process: RedisProcess) -> None:
    server = Tubeq(redis_process)
    try:
        with server.wire() as w:
            assert w.ask(f"auth {BILLING}") == b"UNAUTHORIZED\r\n"
            assert w.ask("use t") == b"USING t\r\n"  # no auth required: still serving
    finally:
        server.stop()


@pytest.mark.parametrize(("text", "error"), [
    ("[tokens]\n'short' = 'billing'\n", "at least 16 characters"),
    ("[tokens]\n'long-enough-token-x' = 'bad name!'\n", "bad namespace"),
    ("[tokns]\n", "unknown section(s) tokns"),
    ("", "nobody could connect"),
    ("[[listeners]]\nnamespace = 'a'\n", "needs one of port or unix"),
    ("[[listeners]]\nnamespace = 'a'\nport = 70000\n", "bad port"),
    ("[tokens\n", "not valid TOML"),
    ("[tokens]\n'long-enough-token-x' = 'a'\n[scrapers]\n'short' = 'prom'\n",
     "at least 16 characters"),
    ("[tokens]\n'long-enough-token-x' = 'a'\n[scrapers]\n'long-enough-token-x' = 'prom'\n",
     "both in [tokens] and in [scrapers]"),
    ("scrapers = ['long-enough-token-y']\n[tokens]\n'long-enough-token-x' = 'a'\n",
     "[scrapers] must be a table"),
])
def test_a_bad_access_file_is_one_clear_error(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "access.toml"
    path.write_text(text)
    with pytest.raises(AccessFileError, match=re.escape(error)):
        load(path)


def test_scraper_tokens_are_read_apart_from_the_namespaces(tmp_path: Path) -> None:
    path = tmp_path / "access.toml"
    path.write_text("[tokens]\n'long-enough-token-x' = 'a'\n"
                    "[scrapers]\n'scraper-token-0123456' = 'prometheus'\n")
    access = load(path)
    assert access.is_scraper("scraper-token-0123456")
    assert not access.is_scraper("long-enough-token-x")
    assert access.namespace_of_token("scraper-token-0123456") is None
    assert access.namespaces == {"a"}


def test_a_bad_access_file_stops_tubeq_with_one_line(redis_process: RedisProcess,
                                                     tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    proc = subprocess.run([sys.executable, "-m", "tubeq", "--redis", redis_process.url,
                           "-p", str(free_port()), "--auth", str(missing)],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          timeout=60, check=False)
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("tubeq: cannot read")
