"""The admin verbs through the bundled client's typed methods and through tubeq-cli, against a
real tubeq on a real Redis; list-jobs documents parsed sans-IO."""

from __future__ import annotations

import pytest

from tests.client.test_cli import Cli
from tests.support.servers import ServerProcess
from tubeq.client import BadFormat, Client, JobPage, ListedJob, NotFound, ProtocolError
from tubeq.client.admin import parse_job_page


def test_parse_job_page_reads_every_shape() -> None:
    assert parse_job_page(b"---\ntube: t\nstate: ready\ncursor: 0\njobs: []\n") == JobPage(
        "t", "ready", "0", ())
    page = parse_job_page(b"---\ntube: 42\nstate: delayed\ncursor: 17-3\njobs:\n"
                          b"- id: 3\n  pri: 1\n  due-ms: 17\n- id: 4\n  pri: 0\n  due-ms: 18\n")
    assert page == JobPage("42", "delayed", "17-3", (ListedJob(3, 1, 17), ListedJob(4, 0, 18)))
    assert not page.last
    reserved = parse_job_page(b"---\ntube: t\nstate: reserved\ncursor: 0\njobs:\n"
                              b"- id: 9\n  pri: 2\n  deadline-ms: 99\n")
    assert reserved.jobs == (ListedJob(9, 2, 99),) and reserved.last


@pytest.mark.parametrize("data", [
    b"tube: t\n", b"---\ntube: t\nstate: ready\njobs: []\n",
    b"---\ntube: t\nstate: ready\ncursor: 0\njobs:\n- id: x\n  pri: 1\n",
    b"---\ntube: t\nstate: ready\ncursor: 0\njobs:\n- id: 1\n",
    b"---\ntube: t\nstate: ready\ncursor: 0\njobs:\n- id: 1\n  pri: 1\nstray: 1\n",
])
def test_parse_job_page_refuses_what_is_not_one(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_job_page(data)


async def test_client_methods(server: ServerProcess) -> None:
    async with Client(server.host, server.port) as client:
        await client.use("client-a")
        await client.watch("client-a")
        await client.ignore("default")
        ids = [await client.put(b"job", pri=pri) for pri in (5, 9, 5, 1)]
        delayed = await client.put(b"later", delay=100)
        page = await client.list_jobs("client-a", count=2)
        assert [job.id for job in page.jobs] == [ids[3], ids[0]] and not page.last
        walked = [job.id async for job in client.iter_jobs("client-a", page_size=1)]
        assert walked == [ids[3], ids[0], ids[2], ids[1]]
        (listed,) = (await client.list_jobs("client-a", "delayed")).jobs
        assert listed.id == delayed and listed.due_ms is not None

        await client.change_pri(ids[1], 0)
        job = await client.reserve_with_timeout(0)
        assert job.id == ids[1]
        await client.change_delay(delayed, 0)
        assert (await client.list_jobs("client-a", "delayed")).jobs == ()
        with pytest.raises(NotFound):
            await client.change_delay(ids[0], 5)  # ready, not delayed

        await client.tube_pause("client-a")
        stats = await client.stats_tube("client-a")
        assert stats["pause-time-left"] == 4294967295
        await client.tube_resume("client-a")
        assert (await client.stats_tube("client-a"))["pause"] == 0

        assert await client.clear_tube("client-a", "ready") == 4  # 3 + change-delay 0
        assert await client.clear_tube("client-a") == 0
        await job.delete()
        with pytest.raises(NotFound):
            await client.clear_tube("no-such-tube")
        with pytest.raises(NotFound):
            await client.change_pri(99999999, 1)
        with pytest.raises(BadFormat):
            await client.list_jobs("-bad")


async def test_client_refuses_bad_arguments_before_sending(server: ServerProcess) -> None:
    async with Client(server.host, server.port) as client:
        for call in (lambda: client.clear_tube("t", "reserved"),
                     lambda: client.list_jobs("t", "sleeping"),
                     lambda: client.list_jobs("t", cursor="5:1"),
                     lambda: client.list_jobs("t", count=0),
                     lambda: client.list_jobs("t", count=1001),
                     lambda: client.change_delay(1, -1)):
            with pytest.raises(ValueError):
                await call()


def test_cli_subcommands(server: ServerProcess) -> None:
    cli = Cli(server.host, server.port)
    first = cli.json("put", "a", "-t", "cli-a", "--pri", "7")["id"]
    second = cli.json("put", "b", "-t", "cli-a", "--pri", "3")["id"]
    later = cli.json("put", "c", "-t", "cli-a", "--delay", "100")["id"]
    assert cli.json("jobs", "cli-a") == {
        "tube": "cli-a", "state": "ready", "cursor": "0",
        "jobs": [{"id": second, "pri": 3}, {"id": first, "pri": 7}]}
    out = cli.run("jobs", "cli-a", "--count", "1").stdout.splitlines()
    assert out[0].split() == [str(second), "pri", "3"]
    assert out[1] == f"more: tubeq-cli jobs cli-a --state ready --cursor 3-{second}"
    assert [j["id"] for j in cli.json("jobs", "cli-a", "--count", "1", "--all")["jobs"]] == [
        second, first]
    delayed = cli.json("jobs", "cli-a", "--state", "delayed")["jobs"]
    assert [j["id"] for j in delayed] == [later] and "due_ms" in delayed[0]
    assert cli.run("change-pri", str(first), "1").stdout == f"job {first} now has priority 1\n"
    assert cli.json("jobs", "cli-a")["jobs"][0] == {"id": first, "pri": 1}
    assert cli.run("change-delay", str(later), "0").stdout == f"job {later} is ready now\n"
    assert cli.run("pause-forever", "cli-a").stdout == "paused tube cli-a until resumed\n"
    assert cli.json("stats", "-t", "cli-a")["pause"] == 4294967295
    assert cli.run("resume", "cli-a").stdout == "resumed tube cli-a\n"
    assert cli.run("clear", "cli-a", "--state", "buried").stdout == (
        "cleared 0 buried jobs from tube cli-a\n")
    assert cli.json("clear", "cli-a") == {"tube": "cli-a", "state": "all", "cleared": 3}
    assert cli.fails("clear", "cli-a") == "tubeq-cli: tube cli-a not found"
    assert cli.fails("jobs", "cli-a") == "tubeq-cli: tube cli-a not found"
    assert cli.fails("change-pri", "99999999", "1") == "tubeq-cli: job 99999999 not found"
    assert cli.fails("change-delay", str(first), "5") == (
        f"tubeq-cli: job {first} not found, or not delayed")
    assert cli.fails("resume", "no-such-tube") == "tubeq-cli: tube no-such-tube not found"
    assert cli.fails("pause-forever", "no-such-tube") == "tubeq-cli: tube no-such-tube not found"
    for bad in (["clear", "t", "--state", "reserved"], ["jobs", "t", "--count", "0"],
                ["change-delay", "1", "-5"], ["change-pri", "1", "x"]):
        cli.fails(*bad, status=2)
