"""Existing beanstalkd clients in other languages, run for real against tubeq and beanstalkd.

Each client has a script under ``tests/clients/`` that drives the library through one scenario
(described in ``tests/clients/README.md``) and prints ``ok STEP: detail`` per checked step. Every
script runs against the session's tubeq and the session's beanstalkd 1.12: passing against
beanstalkd proves the script, passing against tubeq proves tubeq. Each run gets a fresh tube, so
runs on shared servers cannot see each other's jobs.

A client that is not installed fails its tests (it is never skipped): ``make client-deps``, which
``make test`` calls, installs all of them.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.support.servers import ServerKind, ServerProcess, TubeqCluster
from tests.support.wire import Wire

CLIENTS_DIR = Path(__file__).parent
NODE_DIR = CLIENTS_DIR / "node"
INSTALL_HINT = ("`make client-deps` installs it (make test runs that target first; after a damaged "
                "npm install, remove tests/clients/node/node_modules before)")

# Every script checks these steps, in this order (tests/clients/README.md says what each checks).
SCENARIO_STEPS = (
    "use", "watch", "ignore", "watched", "put", "peek", "peek-ready", "peek-delayed",
    "stats-tube", "stats-job-delayed", "reserve", "stats-job", "touch", "kick-job",
    "reserve-second", "bury", "peek-buried", "release", "reserve-after-delay",
    "stats-job-released", "delete", "kick", "pause-tube", "unpause", "list-tubes",
    "stats-tube-final", "timed-out",
)

# A script needs about 1 s (its one wait is a 1 s release delay) plus its interpreter's start.
# Each step has its own 10 s watchdog inside the script; this bounds the whole run.
SCRIPT_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ForeignClient:
    """One client library: how to run its script and how to tell that it is installed."""

    name: str
    interpreter: str
    script: Path
    # A command that exits 0 only when the interpreter can load the library.
    probe: tuple[str, ...]
    package: str

    def argv(self, server: ServerProcess, tube: str) -> list[str]:
        return [self.interpreter, str(self.script), server.host, str(server.port), tube]


def _node_probe(package: str) -> tuple[str, ...]:
    """Loads ``package`` from tests/clients/node and checks it is the version package.json pins."""
    check = (
        "const pinned = require('./package.json').dependencies[process.argv[1]];"
        "const found = require(process.argv[1] + '/package.json').version;"
        "if (found !== pinned) { console.error(`version ${found}, pinned ${pinned}`);"
        " process.exit(1); }"
        "require(process.argv[1]);"
    )
    return ("node", "-e", check, package)


CLIENTS = (
    ForeignClient("fivebeans", "node", NODE_DIR / "fivebeans.js", _node_probe("fivebeans"),
                  "npm fivebeans (tests/clients/node/package-lock.json)"),
    ForeignClient("jackd", "node", NODE_DIR / "jackd.js", _node_probe("jackd"),
                  "npm jackd (tests/clients/node/package-lock.json)"),
    ForeignClient("pheanstalk", "php", CLIENTS_DIR / "php" / "pheanstalk.php",
                  ("php", "-r", "require 'Pheanstalk/autoload.php';"
                   " exit(class_exists('Pheanstalk\\\\Pheanstalk') ? 0 : 1);"),
                  "Debian php-cli and php-pda-pheanstalk"),
    ForeignClient("beaneater", "ruby", CLIENTS_DIR / "ruby" / "beaneater.rb",
                  ("ruby", "-e", "require 'beaneater'"),
                  "Debian ruby and ruby-beaneater"),
)


@cache
def _missing(client: ForeignClient) -> str | None:
    """Why ``client`` cannot run here, or None when its interpreter loads its library."""
    if shutil.which(client.interpreter) is None:
        return f"no `{client.interpreter}` on PATH"
    try:
        done = subprocess.run(client.probe, cwd=NODE_DIR, capture_output=True,
                              timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"loading the library did not finish within {PROBE_TIMEOUT_S:.0f} s"
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace").strip()
        return f"the library does not load: {output[-1500:]}"
    return None


def _fresh_tube(client: ForeignClient) -> str:
    return f"{client.name}-{secrets.token_hex(4)}"


def _report(client: ForeignClient, server: ServerProcess, argv: list[str], status: str,
            stdout: str, stderr: str) -> str:
    lines = [
        f"{client.name} against {server.describe()}: {status}",
        f"command: {' '.join(argv)}",
        "--- script output ---",
        stdout.rstrip(),
        "--- script errors ---",
        stderr.rstrip(),
    ]
    if not server.alive():
        lines += [f"--- {server.describe()} has exited; its log ---", server.log_tail()]
    return "\n".join(lines)


def _server(request: pytest.FixtureRequest, kind: ServerKind) -> ServerProcess:
    server: ServerProcess = request.getfixturevalue(kind)
    return server


def test_node_lock_file_pins_exact_versions() -> None:
    """package.json pins exact versions, so `npm ci` installs what these tests were proven with."""
    manifest = json.loads((NODE_DIR / "package.json").read_text())
    lock = json.loads((NODE_DIR / "package-lock.json").read_text())
    for package, version in manifest["dependencies"].items():
        assert version[0].isdigit(), f"{package} is pinned loosely: {version!r}"
        assert lock["packages"][f"node_modules/{package}"]["version"] == version


@pytest.mark.parametrize("kind", ["tubeq", "beanstalkd"])
@pytest.mark.parametrize("client", CLIENTS, ids=lambda client: client.name)
def test_client_scenario(request: pytest.FixtureRequest, client: ForeignClient,
                         kind: ServerKind) -> None:
    server = _server(request, kind)
    _run_scenario(client, server, _fresh_tube(client))


# -- job policies: every stats-job and stats-tube of the scenario with tubeq's extra keys ------


@pytest.fixture(scope="module")
def tubeq_extra_keys(tubeq_cluster: TubeqCluster) -> Iterator[ServerProcess]:
    """A tubeq that shows its extra stats keys to every connection (--extra-keys always)."""
    server = tubeq_cluster.start(label="tubeq-extra-keys", flags=("--extra-keys", "always"))
    yield server
    server.stop()


@pytest.mark.parametrize("client", CLIENTS, ids=lambda client: client.name)
def test_client_scenario_with_extra_stats_keys(tubeq_extra_keys: ServerProcess,
                                               client: ForeignClient) -> None:
    """The scenario's jobs carry policies (its tube's max-tries and TTL), so every stats-job
    ends with reason, tries, max-tries, expires-at-ms, key, failures, error (quoted strings,
    "" when none), progress-reports and parents-pending, and every
    stats-tube with the tube's settings and policy counters: the libraries parse them all."""
    tube = _fresh_tube(client)
    with Wire(tubeq_extra_keys.host, tubeq_extra_keys.port) as wire:
        assert wire.ask(f"tube-set {tube} max-tries=5 ttl-ms=600000") == b"SET\r\n"
        wire.ask(f"use {tube}")
        probe = wire.ask(b"put-with 0 0 60 1 key=probe-" + tube.encode() + b"\r\nx\r\n")
        job_id = int(probe.split()[1])
        keys = list(wire.yaml(f"stats-job {job_id}"))
        assert keys[-9:] == ["reason", "tries", "max-tries", "expires-at-ms", "key",
                             "failures", "error", "progress-reports", "parents-pending"]
        assert wire.ask(f"delete {job_id}") == b"DELETED\r\n"
    with Wire(tubeq_extra_keys.host, tubeq_extra_keys.port) as plain:  # no extension sent
        assert "total-expired" in plain.yaml("stats-tube default")
    _run_scenario(client, tubeq_extra_keys, tube)


def _run_scenario(client: ForeignClient, server: ServerProcess, tube: str) -> None:
    missing = _missing(client)
    if missing is not None:
        pytest.fail(f"{client.name} is not installed ({client.package}): {missing}; "
                    f"{INSTALL_HINT}", pytrace=False)
    argv = client.argv(server, tube)
    try:
        done = subprocess.run(argv, capture_output=True, timeout=SCRIPT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(_report(client, server, argv, f"killed after {SCRIPT_TIMEOUT_S:.0f} s",
                            (expired.stdout or b"").decode(errors="replace"),
                            (expired.stderr or b"").decode(errors="replace")), pytrace=False)
    stdout = done.stdout.decode(errors="replace")
    stderr = done.stderr.decode(errors="replace")
    if done.returncode != 0:
        pytest.fail(_report(client, server, argv, f"exit status {done.returncode}", stdout,
                            stderr), pytrace=False)
    checked = tuple(line.split(":", 1)[0].removeprefix("ok ")
                    for line in stdout.splitlines() if line.startswith("ok "))
    assert checked == SCENARIO_STEPS, _report(client, server, argv, "wrong steps", stdout, stderr)
    assert stdout.splitlines()[-1].startswith(f"PASS {client.name} "), stdout
