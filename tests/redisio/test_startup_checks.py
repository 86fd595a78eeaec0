"""What keeps tubeq from starting: one clear line on stderr and a non-zero exit, no traceback.

An unreachable Redis, a Redis that may evict keys (unless --allow-eviction), a Redis too old,
a bad --redis URL; the Sentinel cases (unreachable sentinels, an unknown master name) are in
tests/faults/test_sentinel.py, next to the topology they need.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.test_multiprocess import LineClient
from tests.support.servers import ServerProcess, start_tubeq, unique_prefix
from tubeq.redisio.checks import RedisFacts, StartupError, check_facts, parse_info, parse_version
from tubeq.redisio.process import RedisProcess, free_port

EXIT_TIMEOUT_S = 30.0


def run_tubeq(*flags: str) -> subprocess.CompletedProcess[str]:
    """``python -m tubeq -p <free> FLAGS`` expected to exit on its own."""
    return subprocess.run([sys.executable, "-m", "tubeq", "-l", "127.0.0.1", "-p",
                           str(free_port()), *flags], capture_output=True, text=True,
                          timeout=EXIT_TIMEOUT_S, check=False)


def assert_one_clear_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("tubeq:")]
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture
def evicting_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    redis = RedisProcess(tmp_path / "redis", extra=("--maxmemory-policy", "allkeys-lru"))
    redis.start()
    yield redis
    redis.stop()


def test_a_redis_that_may_evict_keys_is_refused(evicting_redis: RedisProcess) -> None:
    done = run_tubeq("--redis", evicting_redis.url)
    assert_one_clear_line(done, "maxmemory-policy allkeys-lru", "--allow-eviction")
    assert done.returncode == 1


def test_allow_eviction_starts_anyway(evicting_redis: RedisProcess, tmp_path: Path) -> None:
    server: ServerProcess = start_tubeq(evicting_redis.url, unique_prefix(), tmp_path / "logs",
                                        flags=("--allow-eviction",))
    try:
        client = LineClient(server)
        assert client.put(b"kept unless evicted") > 0
        client.close()
        assert "jobs can be lost" in server.log_tail()
    finally:
        server.stop()


def test_an_unreachable_redis_is_one_line() -> None:
    done = run_tubeq("--redis", f"redis://127.0.0.1:{free_port()}/0")
    assert_one_clear_line(done, "cannot connect to Redis")


def assert_one_json_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """With --log-format json the failure is one JSON object line, like every other line."""
    assert done.returncode == 1, done
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    failures = [line for line in lines if line["level"] == "error"]
    assert len(failures) == 1, done.stderr
    assert failures[0]["event"] == "cannot start", failures[0]
    for word in words:
        assert word in failures[0]["error"], failures[0]


def test_start_up_failures_follow_log_format_json(redis_url: str) -> None:
    done = run_tubeq("--redis", f"redis://127.0.0.1:{free_port()}/0", "--log-format", "json")
    assert_one_json_line(done, "cannot connect to Redis")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "tubeq", "-l", "127.0.0.1", "-p", str(port),
                               "--redis", redis_url, "--log-format", "json"],
                              capture_output=True, text=True, timeout=EXIT_TIMEOUT_S,
                              check=False)
    assert_one_json_line(done, "in use")


def test_a_bad_redis_url_is_refused_by_the_flag_parser() -> None:
    done = run_tubeq("--redis", "mongodb://127.0.0.1/0")
    assert done.returncode == 2, done
    assert "--redis: unsupported redis url" in done.stderr
    assert "Traceback" not in done.stderr


def _facts(version: str = "7.0.15", policy: str = "noeviction",
           role: str = "master") -> RedisFacts:
    return RedisFacts(parse_version(version), policy, role, replicas=0)


def test_a_redis_older_than_6_2_is_refused() -> None:
    with pytest.raises(StartupError, match=r"version 6\.0\.9; tubeq needs 6\.2 or later"):
        check_facts(_facts("6.0.9"), "r:1", allow_eviction=False)
    check_facts(_facts("6.2.0"), "r:1", allow_eviction=False)


def test_a_replica_is_refused() -> None:
    with pytest.raises(StartupError, match="is a slave, not a master"):
        check_facts(_facts(role="slave"), "r:1", allow_eviction=False)


def test_volatile_policies_are_refused_too() -> None:
    for policy in ("volatile-lru", "allkeys-random", "volatile-ttl"):
        with pytest.raises(StartupError, match=policy):
            check_facts(_facts(policy=policy), "r:1", allow_eviction=False)
        check_facts(_facts(policy=policy), "r:1", allow_eviction=True)


def test_info_parsing() -> None:
    info = b"# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n\r\n# x\r\n"
    assert parse_info(info) == {"redis_version": "7.0.15", "redis_mode": "standalone"}
    assert parse_version("7.2.4") == (7, 2, 4)
    assert parse_version("255.255.255-rc1") == (255, 255, 0)
