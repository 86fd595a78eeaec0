"""Feeding a tubeq event stream by hand, for the source, archive and tail tests.

Entries are written exactly as the Lua scripts write them: ``XADD key [MAXLEN ~ N] * field value
...`` with every field of ``tubeq.model.events.FIELDS`` in order. Each test gets its own stream key
on the session's private Redis, so no test flushes anything.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import redis

from tubeq.model.events import FIELDS
from tubeq.store.keys import Keys

TUBES = ("orders", "mail", "007")
NAMES = ("put", "reserved", "released", "deleted", "buried", "kicked", "timed-out")
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class Written:
    """One entry the test wrote: its stream id and its fields."""

    stream_id: str
    fields: Mapping[str, str | int]


def fresh_prefix() -> str:
    return f"src-{secrets.token_hex(4)}"


def key_of(prefix: str) -> str:
    return Keys(prefix).events


def event_fields(i: int, *, time_ms: int | None = None, tube: str | None = None,
                 event: str | None = None) -> dict[str, str | int]:
    """A well-formed event, varied by ``i`` (tube, name, times), in FIELDS order."""
    return {
        "event": event or NAMES[i % len(NAMES)],
        "id": i // 3 + 1,
        "tube": tube or TUBES[i % len(TUBES)],
        "pri": i % 1024,
        "delay_ms": 0,
        "ttr_ms": 60_000,
        "due_ms": 0,
        "tries": i % 4,
        "time_ms": time_ms if time_ms is not None else BASE_MS + i * 997,
        "by": "test",
        "reason": "",
        "size": 0,
        "error": "",
        "failures": 0,
    }


def write(client: redis.Redis, key: str, rows: Iterable[Mapping[str, str | int]],
          maxlen: int | None = None, batch: int = 2000) -> list[Written]:
    """XADD every row (pipelined), optionally capped like ``--events-maxlen``."""
    written: list[Written] = []
    pending: list[Mapping[str, str | int]] = []

    def flush() -> None:
        pipe = client.pipeline(transaction=False)
        for row in pending:
            pipe.xadd(key, dict(row), maxlen=maxlen, approximate=maxlen is not None)
        for row, sid in zip(pending, pipe.execute(), strict=True):
            written.append(Written(sid.decode(), row))
        pending.clear()

    for row in rows:
        pending.append(row)
        if len(pending) >= batch:
            flush()
    if pending:
        flush()
    return written


def write_rows(client: redis.Redis, key: str, rows: Iterable[Sequence[str | int]]) -> int:
    """XADD rows of ``(stream_id, *FIELDS values)`` (``workload.events``) with their own ids, in
    id order (the order Redis requires); returns how many."""
    ordered = sorted(rows, key=lambda row: tuple(int(part) for part in str(row[0]).split("-")))
    pipe = client.pipeline(transaction=False)
    for stream_id, *values in ordered:
        pipe.xadd(key, dict(zip(FIELDS, values, strict=True)), id=stream_id)
    pipe.execute()
    return len(ordered)


def write_events(client: redis.Redis, key: str, count: int, start: int = 0,
                 maxlen: int | None = None) -> list[Written]:
    return write(client, key, (event_fields(i) for i in range(start, start + count)), maxlen)
