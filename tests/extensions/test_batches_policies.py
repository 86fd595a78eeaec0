"""Batches and job policies together: a job deleted by delete-many frees its dedupe key and its
TTL entry, as one deleted by delete does (real tubeq, real Redis)."""

from __future__ import annotations

import redis

from tests.support.servers import ServerProcess
from tests.support.wire import Wire
from tubeq.store.keys import Keys


def test_delete_many_frees_dedupe_keys_and_ttl_entries(server: ServerProcess) -> None:
    client = redis.Redis.from_url(server.extra["redis_url"])
    ttl_key = Keys(server.extra["prefix"]).ttl
    try:
        with Wire(server.host, server.port) as w:
            assert w.ask("use bp") == b"USING bp\r\n"
            first = w.ask(b"put-with 0 0 60 1 key=order:1 ttl-ms=60000\r\na\r\n")
            assert first.startswith(b"INSERTED ")
            assert client.zcard(ttl_key) == 1
            assert w.ask(f"delete-many {first.split()[1].decode()}") == b"BATCH 1\r\n"
            assert w.reply() == b"DELETED\r\n"
            assert client.zcard(ttl_key) == 0
            assert w.ask("peek-key order:1") == b"NOT_FOUND\r\n"
            again = w.ask(b"put-with 0 0 60 1 key=order:1\r\nb\r\n")
            assert again.startswith(b"INSERTED ") and again != first
    finally:
        client.close()
