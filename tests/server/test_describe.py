"""Where a process listens is stored in the background after its start
(tubeq.server.process.describe_until_stored): a Redis that is lost or refuses the write at that
moment gets it again until it takes it, with one warning, and the start does not fail."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from tubeq.redisio.client import RedisConnectionLost, RedisReplyError
from tubeq.server import process
from tubeq.server.process import describe_until_stored


class RefusingStore:
    """describe_instance fails with each of ``failures`` in turn, then succeeds."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls: list[dict[str, str]] = []

    def describe_instance(self, fields: dict[str, str]) -> asyncio.Future[Any]:
        self.calls.append(dict(fields))
        answer = asyncio.get_running_loop().create_future()
        if self.failures:
            answer.set_exception(self.failures.pop(0))
        else:
            answer.set_result(1)
        return answer


async def test_sent_again_until_redis_takes_it_with_one_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "DESCRIBE_RETRY_S", 0.0)
    store = RefusingStore(RedisConnectionLost("lost"), RedisReplyError("OOM no memory"),
                          RedisConnectionLost("lost again"))
    fields = {"addr": "127.0.0.1:11300"}
    with capture_logs() as logs:
        await asyncio.wait_for(describe_until_stored(store, fields), 5)  # type: ignore[arg-type]
    assert store.calls == [fields] * 4
    assert [entry["event"] for entry in logs] == [
        "where this process listens not stored; sending it again every 0 s",
        "where this process listens stored"]
    assert logs[1]["tries"] == 4


async def test_stored_at_once_says_nothing() -> None:
    store = RefusingStore()
    with capture_logs() as logs:
        await describe_until_stored(store, {"addr": "x"})  # type: ignore[arg-type]
    assert len(store.calls) == 1
    assert logs == []


async def test_an_error_that_is_not_redis_s_is_not_swallowed() -> None:
    store = RefusingStore(ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        await describe_until_stored(store, {"addr": "x"})  # type: ignore[arg-type]
