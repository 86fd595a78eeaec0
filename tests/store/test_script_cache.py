"""The Lua library is built once and loaded once (issue 31, "Start like beanstalkd").

The scripts and the library are kept in the user's cache directory under a hash of their sources
(tubeq.store.scripts, "built once: the cache"): a start reads them instead of assembling them.
Redis is sent the library (FUNCTION LOAD) only when it lacks that exact library, whose name is
a hash of its code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from tubeq.redisio.client import RedisClient
from tubeq.store import scripts
from tubeq.store.keys import Keys
from tubeq.store.store import Store


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache directory of this test's own, and no build kept in the process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    scripts._built.cache_clear()
    yield tmp_path / "tubeq"
    scripts._built.cache_clear()  # the next test builds (or reads) its own


def _same(a: tuple[dict[str, scripts.Script], scripts.Library],
          b: tuple[dict[str, scripts.Script], scripts.Library]) -> bool:
    return a[0] == b[0] and a[1] == b[1]


def test_the_build_is_kept_under_its_sources_hash_and_read_back_the_same(
        cache_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = (scripts.load_all(), scripts.library())
    kept = cache_home / f"lua-{scripts.sources_hash()}.json"
    assert [p.name for p in cache_home.iterdir()] == [kept.name]

    def no_assembly(name: str) -> scripts.Script:
        raise AssertionError(f"{name} assembled again")

    monkeypatch.setattr(scripts, "load_script", no_assembly)
    scripts._built.cache_clear()  # as a new process
    assert _same((scripts.load_all(), scripts.library()), built)


def test_a_damaged_cache_file_is_built_again_and_replaced(cache_home: Path) -> None:
    built = (scripts.load_all(), scripts.library())
    kept = cache_home / f"lua-{scripts.sources_hash()}.json"
    for damage in (b"", b"{\"scripts\": {", b"[1, 2]", b'{"scripts": {}, "library": 3}'):
        kept.write_bytes(damage)
        scripts._built.cache_clear()
        assert _same((scripts.load_all(), scripts.library()), built)
        json.loads(kept.read_bytes())  # whole again


def test_without_a_writable_cache_the_scripts_are_built_each_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_home: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert "put" in scripts.load_all()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME")
    scripts._built.cache_clear()
    assert scripts.cache_dir() is None
    assert scripts.library().name.startswith("tubeq_")


class _Spy:
    """Records the commands a RedisClient's call() is given."""

    def __init__(self, client: RedisClient) -> None:
        self.commands: list[tuple[str, ...]] = []
        real = client.call

        def call(*args: Any, **kwargs: Any) -> Any:
            self.commands.append(tuple(str(a) for a in args[:2]))
            return real(*args, **kwargs)

        client.call = call  # type: ignore[method-assign]


async def test_the_library_is_loaded_only_when_redis_lacks_it(redis_url: str) -> None:
    raw = redis.asyncio.Redis.from_url(redis_url)
    await raw.function_flush()
    client = await RedisClient.connect(redis_url)
    try:
        spy = _Spy(client)
        first = Store(client, Keys("lib"), "inst")
        assert await first.load_scripts()
        assert ("FUNCTION", "LOAD") in spy.commands
        spy.commands.clear()
        second = Store(client, Keys("lib"), "inst")  # the next start: Redis has it
        assert await second.load_scripts()
        assert spy.commands == [("FUNCTION", "LIST")]
        assert await second.put("default", 0, 0, 60, b"by FCALL") == 1
        await raw.function_delete(scripts.library().name)  # a Redis that lost it
        spy.commands.clear()
        assert await Store(client, Keys("lib"), "inst").load_scripts()
        assert spy.commands == [("FUNCTION", "LIST"), ("FUNCTION", "LOAD")]
    finally:
        await client.close()
        await raw.aclose()
