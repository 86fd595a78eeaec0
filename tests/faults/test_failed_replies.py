"""A command that failed on Redis's side says whether it ran, where tubeq can know, to a
connection that has used an extension command; a beanstalkd client gets the bare INTERNAL_ERROR
(protocol.md, "Redis stalls"): ``not-run`` when Redis refused it (here: over maxmemory),
``unknown`` when Redis stalled with it out (it may run later: here it does), ``ran`` when it ran
and only --min-replicas could not confirm it. The bundled client reads the word into
``InternalError.ran``. Each against a private Redis and a real tubeq.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests.server.test_multiprocess import LineClient
from tests.support.servers import ServerProcess, start_tubeq, unique_prefix, wait_for_http
from tubeq.client import Client
from tubeq.client.errors import InternalError
from tubeq.redisio.process import RedisProcess, free_port


def extended(server: ServerProcess) -> LineClient:
    """A connection that has used an extension command (``extensions``)."""
    conn = LineClient(server)
    assert conn.call("extensions").head.startswith(b"OK ")
    return conn


def ready_jobs(conn: LineClient) -> int:
    """current-jobs-ready of 'default', once tubeq has its Redis link back (it reconnects after
    a stall: until then its commands answer INTERNAL_ERROR at once)."""
    for _ in range(200):
        stats = conn.call("stats-tube default")
        if stats.data is not None:
            return int(stats.data.split(b"current-jobs-ready: ")[1].split(b"\n")[0])
        time.sleep(0.05)
    raise AssertionError(f"no stats-tube answer: {stats.head!r}")


@contextmanager
def tubeq_on_own_redis(tmp_path: Path, *flags: str) -> Iterator[tuple[ServerProcess, RedisProcess]]:
    """A tubeq with ``flags`` on a private Redis of its own (the test may freeze or starve it),
    both stopped after."""
    store = RedisProcess(tmp_path / "redis")
    store.start()
    try:
        server = start_tubeq(store.url, unique_prefix(), tmp_path / "logs", flags=flags)
        try:
            yield server, store
        finally:
            server.stop()
    finally:
        store.stop()


@contextmanager
def starved(store: RedisProcess) -> Iterator[Callable[[bool], None]]:
    """A switch that makes ``store`` refuse every write (maxmemory 1: OOM) or not; off after."""
    raw = redis.Redis.from_url(store.url)

    def starve(on: bool) -> None:
        raw.config_set("maxmemory", 1 if on else 0)

    try:
        yield starve
    finally:
        starve(False)
        raw.close()


def test_a_command_redis_refused_did_not_run(tmp_path: Path) -> None:
    with tubeq_on_own_redis(tmp_path) as (server, store), starved(store) as starve:
        plain, ext = LineClient(server), extended(server)
        starve(True)
        assert plain.call("put 0 0 60 1\r\nx").head == b"INTERNAL_ERROR"
        assert ext.call("put 0 0 60 1\r\nx").head == b"INTERNAL_ERROR not-run"
        assert ext.call("put-many 2\r\n0 0 60 1\r\na\r\n0 0 60 1\r\nb").head == (
            b"BATCH 2")
        assert [ext.reply().head for _ in range(2)] == [b"INTERNAL_ERROR not-run"] * 2
        starve(False)
        assert ready_jobs(plain) == 0  # nothing stored, as the reply said

        async def bundled() -> InternalError:
            client = Client(*server.address)
            await client.connect()
            try:
                assert isinstance((await client.put_many([b"w"]))[0], int)  # an extension
                starve(True)
                with pytest.raises(InternalError) as caught:
                    await client.put(b"x")
                return caught.value
            finally:
                starve(False)
                await client.aclose()

        assert asyncio.run(bundled()).ran is False


def test_a_command_out_when_redis_stalled_may_have_run(tmp_path: Path) -> None:
    with tubeq_on_own_redis(tmp_path, "--redis-timeout", "0.3") as (server, store):
        plain, ext = LineClient(server), extended(server)
        assert store.proc is not None
        store.proc.send_signal(signal.SIGSTOP)
        try:
            ext.send(b"put 0 0 60 1\r\nx\r\n")
            plain.send(b"put 0 0 60 1\r\ny\r\n")
            assert ext.reply().head == b"INTERNAL_ERROR unknown"
            assert plain.reply().head == b"INTERNAL_ERROR"
        finally:
            store.proc.send_signal(signal.SIGCONT)
        # Redis ran both after all, when it woke: "unknown" was the honest answer.
        assert ready_jobs(LineClient(server)) == 2


def test_a_command_whose_replicas_are_behind_ran(tmp_path: Path) -> None:
    with tubeq_on_own_redis(tmp_path, "--min-replicas", "1",
                            "--min-replicas-timeout", "50") as (server, _):
        plain, ext = LineClient(server), extended(server)
        assert ext.call("put 0 0 60 1\r\nx").head == b"INTERNAL_ERROR ran"  # no replica at all
        assert plain.call("put 0 0 60 1\r\ny").head == b"INTERNAL_ERROR"
        assert ready_jobs(plain) == 2  # both stored on the master


def test_the_http_api_says_whether_a_failed_request_ran(tmp_path: Path) -> None:
    http_port = free_port()
    with tubeq_on_own_redis(tmp_path, "--metrics", f"127.0.0.1:{http_port}") as (
            server, store), starved(store) as starve:
        wait_for_http(server, http_port)
        starve(True)
        request = urllib.request.Request(
            f"http://127.0.0.1:{http_port}/api/tubes/default/jobs", data=b'{"body": "x"}',
            headers={"Content-Type": "application/json"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 503
        body = json.loads(refused.value.read())
        assert body["ran"] is False and body["error"].startswith("redis unavailable: ")
