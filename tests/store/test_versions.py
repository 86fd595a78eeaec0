"""Versions: the release's (tubeq.__version__, the one source pyproject.toml reads; --version
of both commands and ``stats`` report it) and the namespace's data layout record
(``{prefix}:layout``, tubeq.store.keys.LAYOUT_VERSION), checked by every process at start
(tubeq.store.layout.claim_layout_version): written where missing, taken over where older and
readable as it is, left alone and refused where newer, too old or unreadable. A real process
refused by a newer layout says so in one line and touches nothing.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio

from tests.redisio.test_startup_checks import run_tubeq
from tests.server.test_multiprocess import LineClient
from tests.support.servers import start_tubeq, unique_prefix
from tubeq import __version__
from tubeq.redisio.checks import StartupError
from tubeq.redisio.client import RedisClient
from tubeq.store.keys import LAYOUT_VERSION, UPGRADES_IN_PLACE_FROM, Keys
from tubeq.store.layout import claim_layout_version
from tubeq.store.shards import shard_prefix

PROJECT = Path(__file__).resolve().parents[2]


def test_pyproject_takes_its_version_from_the_package() -> None:
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tubeq.__version__"}


@pytest.mark.parametrize(("module", "printed"), [
    ("tubeq", f"tubeq {__version__} (data layout {LAYOUT_VERSION})\n"),
    ("tubeq.client.cli", f"tubeq-cli {__version__}\n"),
])
def test_both_commands_print_their_version(module: str, printed: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                          text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, printed, "")


async def test_a_namespace_of_a_newer_layout_refuses_to_start_in_one_line(redis_url: str) -> None:
    prefix = unique_prefix("layout")
    keys = Keys(prefix)
    raw = redis.asyncio.Redis.from_url(redis_url)
    try:
        newer = LAYOUT_VERSION + 1
        await raw.set(keys.layout, newer)
        await raw.hset(keys.job(1), mapping={"s": "ready", "t": "default"})  # its data
        await raw.zadd(keys.ttl, {"A1": 1_700_000_060_000})  # no 'x:' timer: left so
        done = await asyncio.to_thread(run_tubeq, "--redis", redis_url, "--prefix", prefix)
        assert done.returncode == 1, done
        assert done.stdout == ""
        assert len(done.stderr.splitlines()) == 1, done.stderr
        line = done.stderr.splitlines()[0]
        assert line.startswith("tubeq: ") and "Traceback" not in line, line
        for words in (f"data layout {newer}", f"tubeq {__version__}", f"layout {LAYOUT_VERSION}",
                      f"run a tubeq that knows layout {newer}"):
            assert words in line, line
        # The refusing process touched nothing: the record and the data are as they were.
        assert await raw.get(keys.layout) == str(newer).encode()
        assert sorted(await raw.keys("{" + prefix + "}*")) == sorted(
            [keys.layout.encode(), keys.job(1).encode(), keys.ttl.encode()])
    finally:
        await raw.aclose()


async def test_a_new_namespace_gets_the_record_on_its_root_only(redis_url: str,
                                                                 tmp_path: Path) -> None:
    prefix = unique_prefix("layout")
    server = await asyncio.to_thread(start_tubeq, redis_url, prefix, tmp_path / "logs",
                                     flags=("--shards", "2"))
    raw = redis.asyncio.Redis.from_url(redis_url)
    try:
        assert await raw.get(Keys(prefix).layout) == str(LAYOUT_VERSION).encode()
        for k in range(2):  # a split namespace's one record is on its unsplit root
            assert await raw.exists(Keys(shard_prefix(prefix, k, 2)).layout) == 0
        client = LineClient(server)
        stats = client.call("stats")
        client.close()
        assert stats.data is not None
        assert f'\nversion: "{__version__}-tubeq"\n'.encode() in stats.data  # quoted, as 1.12
    finally:
        await raw.aclose()
        await asyncio.to_thread(server.stop)


@pytest.fixture
async def layout_client(redis_url: str) -> AsyncIterator[tuple[RedisClient, Keys]]:
    client = await RedisClient.connect(redis_url)
    try:
        yield client, Keys(unique_prefix("layout"))
    finally:
        await client.close()


async def test_a_missing_record_is_written(layout_client: tuple[RedisClient, Keys]) -> None:
    # An existing namespace without a record: layout 1 or 2, both read as they are by layout 2.
    client, keys = layout_client
    await client.call("SET", keys.job_ids, 41)
    await claim_layout_version(client, keys, "r:1")
    assert await client.call("GET", keys.layout) == str(LAYOUT_VERSION).encode()
    assert await client.call("GET", keys.job_ids) == b"41"


async def test_an_older_record_is_taken_over(layout_client: tuple[RedisClient, Keys]) -> None:
    client, keys = layout_client
    for older in range(UPGRADES_IN_PLACE_FROM, LAYOUT_VERSION):
        await client.call("SET", keys.layout, older)
        await claim_layout_version(client, keys, "r:1")
        assert await client.call("GET", keys.layout) == str(LAYOUT_VERSION).encode()


async def test_the_same_layout_passes_unchanged(layout_client: tuple[RedisClient, Keys]) -> None:
    client, keys = layout_client
    await client.call("SET", keys.layout, LAYOUT_VERSION)
    await claim_layout_version(client, keys, "r:1")
    await claim_layout_version(client, keys, "r:1")  # and again: a second process
    assert await client.call("GET", keys.layout) == str(LAYOUT_VERSION).encode()


@pytest.mark.parametrize(("recorded", "message"), [
    (str(LAYOUT_VERSION + 1), f"has data layout {LAYOUT_VERSION + 1}, newer than tubeq"),
    (str(UPGRADES_IN_PLACE_FROM - 1), f"has data layout {UPGRADES_IN_PLACE_FROM - 1}, older than"),
    ("2.5", "unreadable data layout record"),
    ("", "unreadable data layout record"),
])
async def test_a_record_this_build_cannot_read_is_refused_and_left_alone(
        layout_client: tuple[RedisClient, Keys], recorded: str, message: str) -> None:
    client, keys = layout_client
    await client.call("SET", keys.layout, recorded)
    with pytest.raises(StartupError, match=message):
        await claim_layout_version(client, keys, "r:1")
    assert await client.call("GET", keys.layout) == recorded.encode()


async def test_the_ttl_timer_a_layout_1_process_removed_is_armed_again(
        layout_client: tuple[RedisClient, Keys]) -> None:
    # A layout-1 process takes the timer 'x:' for a pause and removes it when it fires: the
    # jobs put with a TTL would never expire. The next process to start arms it again.
    client, keys = layout_client
    await client.call("ZADD", keys.ttl, 1_700_000_090_000, "B12", 1_700_000_060_000, "A7")
    await client.call("ZADD", keys.timers, 1_700_000_010_000, "d:default")
    await claim_layout_version(client, keys, "r:1")
    assert await client.call("ZRANGE", keys.timers, 0, -1, "WITHSCORES") == [
        b"d:default", b"1700000010000", b"x:", b"1700000060000"]
