"""The bundled client's put_with / peek_key and tubeq-cli's put options and peek-key, against a
real tubeq (and the client's argument checks, which need no server)."""

from __future__ import annotations

import pytest

from tests.client.test_cli import Cli
from tests.support.servers import ServerProcess
from tests.support.wire import Wire
from tubeq.client import BadOption, Client, NotFound, PutResult
from tubeq.client.args import _expect
from tubeq.client.parser import parse_yaml_mapping
from tubeq.client.policies import put_with_line
from tubeq.client.wire import INSERTED


async def test_put_with_tells_inserted_from_duplicate(server: ServerProcess) -> None:
    async with Client(server.host, server.port) as client:
        await client.use("pwc-client")
        first = await client.put_with("hello", key="invoice:7", max_tries=3, ttl_ms=60_000,
                                      backoff_ms=100, backoff_max_ms=1000, on_expire="delete")
        assert first.inserted
        again = await client.put_with("other", key="invoice:7")
        assert again == PutResult(first.id, inserted=False)
        job = await client.peek_key("invoice:7")
        assert (job.id, job.body) == (first.id, b"hello")
        stats = await client.stats_job(first.id)
        assert (stats["max-tries"], stats["key"], stats["reason"], stats["tries"]) == (
            3, "invoice:7", "", 0)
        tube = await client.stats_tube("pwc-client")
        assert tube["total-deduplicated"] == 1
        delayed = await client.put_with("later", delay_ms=60_000)
        assert (await client.stats_job(delayed.id))["state"] == "delayed"
        with pytest.raises(BadOption) as refused:  # an option this client would not send
            await client._call(b"put-with 0 0 1 1 rate=5\r\nx\r\n",
                               lambda reply, link: _expect(reply, "put-with", INSERTED))
        assert (refused.value.option, str(refused.value)) == (
            "rate", "put-with: BAD_OPTION rate")
        await client.delete(first.id)
        await client.delete(delayed.id)
        with pytest.raises(NotFound):
            await client.peek_key("invoice:7")


def test_put_with_checks_its_options_before_sending() -> None:
    def line(**options: object) -> bytes:
        base: dict[str, object] = dict(delay_ms=None, max_tries=None, backoff_ms=None,
                                       backoff_max_ms=None, ttl_ms=None, on_expire=None,
                                       key=None)
        return put_with_line(1, 0, 2, 3, **(base | options))  # type: ignore[arg-type]

    assert line() == b"put-with 1 0 2 3\r\n"
    assert line(key="k", ttl_ms=5, on_expire="bury") == (
        b"put-with 1 0 2 3 ttl-ms=5 on-expire=bury key=k\r\n")
    for bad in (dict(key="a b"), dict(key="a=b"), dict(key=""), dict(key="k" * 201),
                dict(on_expire="keep"), dict(max_tries=-1), dict(ttl_ms=2**32 * 1000)):
        with pytest.raises(ValueError):
            line(**bad)
    with pytest.raises(ValueError, match="not both"):
        put_with_line(0, 1, 1, 1, delay_ms=5, max_tries=None, backoff_ms=None,
                      backoff_max_ms=None, ttl_ms=None, on_expire=None, key=None)


def test_the_client_reads_a_quoted_key_back() -> None:
    doc = parse_yaml_mapping(b'---\nid: 1\nkey: "#a\\"b\\\\c"\nreason: ""\n',
                             ["key", "reason"])
    assert doc == {"id": 1, "key": '#a"b\\c', "reason": ""}


def test_cli_put_with_options_and_peek_key(server: ServerProcess) -> None:
    cli = Cli(server.host, server.port)
    out = cli.run("put", "hello", "-t", "pwc-cli", "--key", "cli:1", "--ttl-ms", "60000",
                  "--max-tries", "2").stdout
    assert out.startswith("inserted job ") and out.endswith(" into tube pwc-cli\n")
    job_id = int(out.split()[2])
    again = cli.json("put", "again", "-t", "pwc-cli", "--key", "cli:1")
    assert again == {"id": job_id, "tube": "pwc-cli", "bytes": 5, "inserted": False}
    assert cli.run("put", "x", "-t", "pwc-cli", "--key", "cli:1").stdout == (
        f"not inserted: job {job_id} already has key cli:1\n")
    shown = cli.json("peek-key", "cli:1")
    assert (shown["id"], shown["body"], shown["tube"]) == (job_id, "hello", "pwc-cli")
    assert "no living job has key cli:2" in cli.fails("peek-key", "cli:2")
    assert "--delay-ms" in cli.fails("put", "x", "--delay-ms", "soon", status=2)
    assert "on-expire" in cli.fails("put", "x", "--on-expire", "keep", status=2)
    with Wire(server.host, server.port) as w:
        assert w.ask(f"delete {job_id}") == b"DELETED\r\n"
