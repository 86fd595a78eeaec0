"""Recurring jobs in the bundled client (Client.schedule_*) and in ``tubeq-cli schedule``,
against a real tubeq; a schedule's ticks reach a consumer."""

from __future__ import annotations

import pytest

from tests.client.test_cli import Cli
from tests.support.servers import ServerProcess
from tests.support.wire import Wire
from tubeq.client import BadOption, Client, NotFound, Schedule, UnknownCommand
from tubeq.client.errors import ProtocolError
from tubeq.client.schedules import cron_on_the_wire, parse_schedule_list


def test_cron_expressions_go_on_the_wire_joined_by_underscores() -> None:
    assert cron_on_the_wire(" */5  * * *\t*") == "*/5_*_*_*_*"
    for bad in ("", "  ", "*_* * * * *"):
        with pytest.raises(ValueError):
            cron_on_the_wire(bad)


def test_schedule_list_documents_are_read_strictly() -> None:
    assert parse_schedule_list(b"--- []\n") == []
    for bad in (b"", b"- name: a\n", b"---\nname: a\n", b"---\n- name: a\n",
                b"---\n- name: a\n  ticks: many\n"):
        with pytest.raises(ProtocolError):
            parse_schedule_list(bad)


async def test_client_adds_lists_and_removes_schedules(server: ServerProcess) -> None:
    async with Client(server.host, server.port) as client:
        first = await client.schedule_add("rc-tube", "nightly", "report",
                                          cron="0 3 * * *", pri=5, ttr=300)
        assert first % 60_000 == 0
        await client.schedule_add("rc-tube", "often", b"\x00\xff", every_ms=60_000,
                                  delay_ms=250)
        assert await client.schedule_list("rc-tube") == [
            Schedule("nightly", "0 3 * * *", None, 5, 300, 0, 6, first, 0, 0, 0),
            Schedule("often", None, 60_000, 2**31, 60, 250, 2,
                     (await client.schedule_list("rc-tube"))[1].next_ms, 0, 0, 0),
        ]
        await client.schedule_remove("rc-tube", "nightly")
        await client.schedule_remove("rc-tube", "often")
        assert await client.schedule_list("rc-tube") == []
        with pytest.raises(NotFound):
            await client.schedule_remove("rc-tube", "nightly")
        with pytest.raises(BadOption) as refused:
            await client.schedule_add("rc-tube", "bad", "x", cron="61 * * * *")
        assert refused.value.option == "cron"
        with pytest.raises(BadOption) as refused:
            await client.schedule_add("rc-tube", "bad", "x", every_ms=50)
        assert refused.value.option == "every-ms"
        with pytest.raises(ValueError):
            await client.schedule_add("rc-tube", "bad", "x")
        with pytest.raises(ValueError):
            await client.schedule_add("rc-tube", "bad", "x", cron="@daily", every_ms=1000)
        assert await client.list_tube_used() == "default"  # the connection is still in step


async def test_a_schedules_jobs_reach_a_worker(server: ServerProcess) -> None:
    async with Client(server.host, server.port) as client:
        await client.schedule_add("rc-work", "beat", "tick", every_ms=100, ttr=5)
        await client.watch("rc-work")
        try:
            for _ in range(2):
                job = await client.reserve_with_timeout(5)
                assert job.body == b"tick"
                await client.delete(job.id)
        finally:
            await client.schedule_remove("rc-work", "beat")


async def test_beanstalkd_does_not_know_schedules(client_beanstalkd: ServerProcess) -> None:
    async with Client(client_beanstalkd.host, client_beanstalkd.port) as client:
        with pytest.raises(UnknownCommand):
            await client.schedule_list("default")


def test_cli_schedule_add_list_remove(server: ServerProcess) -> None:
    cli = Cli(server.host, server.port)
    added = cli.json("schedule", "add", "rc-cli", "nightly", "hello", "--cron", "0 3 * * *")
    assert added["tube"] == "rc-cli" and added["next_ms"] % 60_000 == 0
    text = cli.run("schedule", "add", "rc-cli", "often", "--every-ms", "60000",
                   stdin=b"from stdin").stdout
    assert text.startswith("schedule often of tube rc-cli first ticks at ")
    rows = cli.json("schedule", "list", "rc-cli")
    assert [(r["name"], r["cron"], r["every_ms"], r["bytes"]) for r in rows] == [
        ("nightly", "0 3 * * *", None, 5), ("often", None, 60000, 10)]
    listed = cli.run("schedule", "list", "rc-cli").stdout
    assert "nightly  cron 0 3 * * *  next " in listed and "often  every 60000 ms" in listed
    assert cli.run("schedule", "remove", "rc-cli", "nightly").stdout == \
        "removed schedule nightly of tube rc-cli\n"
    assert cli.fails("schedule", "remove", "rc-cli", "nightly") == \
        "tubeq-cli: tube rc-cli has no schedule nightly"
    assert cli.fails("schedule", "add", "rc-cli", "x", "b", "--cron", "61 * * * *",
                     status=2) == "tubeq-cli: error: the server refused the cron expression"
    assert cli.fails("schedule", "add", "rc-cli", "x", "b", "--every-ms", "5",
                     status=2) == "tubeq-cli: error: the server refused the --every-ms"
    assert "required" in cli.fails("schedule", "add", "rc-cli", "x", "b", status=2)
    cli.run("schedule", "remove", "rc-cli", "often")
    with Wire(server.host, server.port) as w:
        assert w.ask("schedule-list rc-cli") == b"OK 7\r\n--- []\n\r\n"
