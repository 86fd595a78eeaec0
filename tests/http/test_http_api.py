"""The HTTP API (tubeq.http.api) against a real tubeq and Redis: every route, its errors, the
long-poll reserve and who owns what it reserves, and the same semantics as the text protocol."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.client_support import eventually
from tests.support.http_support import Beanstalk, running_server
from tubeq.server.process import Server


class Api:
    """The listener's base URL and a session; each call returns (status, JSON or None)."""

    def __init__(self, server: Server, session: aiohttp.ClientSession) -> None:
        self.server = server
        self.base = f"http://127.0.0.1:{server.http_port}"
        self.session = session

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.session.request(method, self.base + path, **kwargs) as response:
            if response.status == 204:
                return 204, None
            assert response.content_type == "application/json", await response.text()
            return response.status, await response.json()

    async def put(self, tube: str = "default", body: bytes = b"x", **query: Any) -> int:
        status, data = await self.call("POST", f"/api/tubes/{tube}/jobs", data=body,
                                       params={k: str(v) for k, v in query.items()})
        assert status == 201, data
        return int(data["id"])

    async def reserve(self, tubes: str = "default", timeout: int = 0) -> tuple[int, Any]:
        return await self.call("POST", f"/api/tubes/{tubes}/reserve",
                               params={"timeout": str(timeout)})


@pytest.fixture
async def server(redis_url: str) -> AsyncIterator[Server]:
    async with running_server(redis_url) as s:
        yield s


@pytest.fixture
async def api(server: Server) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(server, session)


async def job_state(api: Api, job_id: int) -> str:
    status, data = await api.call("GET", f"/api/jobs/{job_id}")
    assert status == 200, data
    return str(data["state"])


# -- put, peek, stats ---------------------------------------------------------------------------

async def test_a_raw_put_takes_its_options_from_the_query(api: Api) -> None:
    status, data = await api.call("POST", "/api/tubes/mail/jobs?pri=7&delay=0&ttr=30",
                                  data=b"hello")
    assert (status, data) == (201, {"id": data["id"], "tube": "mail", "state": "ready"})
    status, job = await api.call("GET", f"/api/jobs/{data['id']}")
    assert status == 200
    assert {k: job[k] for k in ("tube", "state", "pri", "ttr", "delay", "reserves", "body",
                                "body_base64")} == {
        "tube": "mail", "state": "ready", "pri": 7, "ttr": 30, "delay": 0, "reserves": 0,
        "body": "hello", "body_base64": base64.b64encode(b"hello").decode()}


async def test_a_json_put_carries_text_or_base64_and_its_options(api: Api) -> None:
    status, data = await api.call("POST", "/api/tubes/mail/jobs",
                                  json={"body": "héllo", "pri": 1, "delay": 60, "ttr": 5})
    assert status == 201 and data["state"] == "delayed"
    _, job = await api.call("GET", f"/api/jobs/{data['id']}")
    assert (job["body"], job["pri"], job["state"], job["delay"]) == ("héllo", 1, "delayed", 60)
    binary = bytes(range(256))
    status, data = await api.call(
        "POST", "/api/tubes/mail/jobs",
        json={"body_base64": base64.b64encode(binary).decode()})
    assert status == 201
    _, job = await api.call("GET", f"/api/jobs/{data['id']}")
    assert job["body"] is None and base64.b64decode(job["body_base64"]) == binary


async def test_a_json_put_of_any_encoding_up_to_the_job_size_is_taken(api: Api) -> None:
    limit = api.server.config.max_job_size
    # Escapes cost up to 6 bytes per byte of body (\u0001), so these requests are far larger
    # than the bodies they carry; the decoded body is what max-job-size bounds.
    for text in ("\n" * 50_000, "é" * 30_000, "\x01" * limit):
        payload = json.dumps({"body": text}).encode()
        assert len(payload) > limit * 4 // 3 + 4096
        status, data = await api.call("POST", "/api/tubes/big/jobs", data=payload,
                                      headers={"Content-Type": "application/json"})
        assert status == 201, (len(text), data)
        _, job = await api.call("GET", f"/api/jobs/{data['id']}")
        assert job["body"] == text
    status, data = await api.call("POST", "/api/tubes/big/jobs",
                                  json={"body": "\x01" * (limit + 1)})
    assert (status, data["error"]) == (413, f"job body too big: {limit + 1} bytes, at most "
                                            f"{limit}")
    # The request is still bounded: past six bytes per byte of body (and room for the options)
    # it is refused before it is decoded.
    status, data = await api.call("POST", "/api/tubes/big/jobs",
                                  data=b'{"body": "' + b" " * (6 * limit + 8192) + b'"}',
                                  headers={"Content-Type": "application/json"})
    assert status == 413 and "request body too large" in data["error"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: read up to limit + 1
        for _ in range(3):
            yield b"x" * limit

    status, data = await api.call("POST", "/api/tubes/big/jobs", data=chunks())
    assert (status, data["error"]) == (413, f"job body too big: more bytes, at most {limit}")


async def test_a_put_over_http_is_a_put_over_the_protocol(api: Api) -> None:
    job_id = await api.put("shared", b"from http", pri=3)
    bean = await Beanstalk.open(api.server.port)
    try:
        assert await bean.ask(b"watch shared") == b"WATCHING 2\r\n"
        assert await bean.ask(b"reserve-with-timeout 5") == (
            b"RESERVED %d 9\r\nfrom http\r\n" % job_id)
        assert await bean.ask(b"stats-job %d" % job_id) != b"NOT_FOUND\r\n"
        stats = await bean.ask(b"stats")
        assert b"\ncmd-put: 1\n" in stats and b"\ntotal-jobs: 1\n" in stats
    finally:
        await bean.close()


def documented_counts() -> dict[str, str]:
    """protocol.md's HTTP route table: route (its first cell) -> its "counts" cell."""
    text = (Path(__file__).parents[2] / "protocol.md").read_text()
    table = text.split("| route | protocol | counts | answer |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| `")]
    return {row[0][2:]: row[2] for row in rows}


async def test_each_route_counts_the_counter_its_row_names(api: Api) -> None:
    counters = api.server.ctx.counters if api.server.ctx else None
    assert counters is not None
    await api.put("c", b"kicked", delay=100)
    buried = await api.put("c", b"held")
    for_kick_job = await api.put("c", b"held twice", delay=100)

    async def held(job_id: int) -> str:
        status, got = await api.reserve("c")
        assert status == 200 and got["id"] == job_id, got
        return str(got["reservation"])

    token = ""

    async def reserve_buried() -> None:
        nonlocal token
        token = await held(buried)

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "`POST /api/tubes/{tube}/jobs`": lambda: api.put("c", b"x", delay=100),
        "`GET /api/jobs/{id}`": lambda: api.call("GET", f"/api/jobs/{buried}"),
        "`GET /api/jobs/{id}/result?wait-ms=N[&progress=P]`": lambda: api.call(
            "GET", f"/api/jobs/{buried}/result"),
        "`POST /api/tubes/{t1,t2,...}/reserve?timeout=S`": reserve_buried,
        "`POST /api/jobs/{id}/touch` `{\"reservation\"}`": lambda: api.call(
            "POST", f"/api/jobs/{buried}/touch", json={"reservation": token}),
        "`POST /api/quiet` `{\"tube\"?, \"conn\"?}`": lambda: api.call(
            "POST", "/api/quiet", json={"tube": "nobody"}),
        "`POST /api/jobs/{id}/bury` `{\"reservation\", \"pri\"?}`": lambda: api.call(
            "POST", f"/api/jobs/{buried}/bury", json={"reservation": token}),
        "`GET /api/tubes/{tube}/peek/{ready,delayed,buried}`": lambda: api.call(
            "GET", "/api/tubes/c/peek/buried"),
        "`POST /api/tubes/{tube}/kick` `{\"bound\"?}`": lambda: api.call(
            "POST", "/api/tubes/c/kick"),
        "`POST /api/jobs/{id}/release` `{\"reservation\", \"pri\"?, \"delay\"?}`":
            lambda: release(),
        "`POST /api/jobs/{id}/hand-back` `{\"reservation\"}`": lambda: hand_back(),
        "`POST /api/jobs/{id}/kick`": lambda: api.call("POST", f"/api/jobs/{for_kick_job}/kick"),
        "`DELETE /api/jobs/{id}[?reservation=T]`": lambda: api.call(
            "DELETE", f"/api/jobs/{for_kick_job}"),
        "`GET /api/tubes/{tube}/jobs?state=S&limit=N`": lambda: api.call(
            "GET", "/api/tubes/c/jobs?state=delayed"),
        "`POST /api/tubes/{tube}/pause` `{\"delay\"}`": lambda: api.call(
            "POST", "/api/tubes/c/pause", json={"delay": 0}),
        "`GET /api/tubes/{tube}`": lambda: api.call("GET", "/api/tubes/c"),
        "`GET /api/tubes`": lambda: api.call("GET", "/api/tubes"),
        "`GET /api/stats`": lambda: api.call("GET", "/api/stats"),
        "`GET /api/servers`": lambda: api.call("GET", "/api/servers"),
    }

    async def release() -> Any:
        return await api.call("POST", f"/api/jobs/{buried}/release",
                              json={"reservation": await held(buried)})

    async def hand_back() -> Any:
        return await api.call("POST", f"/api/jobs/{buried}/hand-back",
                              json={"reservation": await held(buried)})

    documented = documented_counts()
    assert set(documented) == set(calls)
    for route, call in calls.items():
        counters.flush()
        before = dict(counters.totals)
        got = await call()
        assert not isinstance(got, tuple) or got[0] < 300, (route, got)
        counters.flush()
        counted = {name for name, n in counters.totals.items() if n != before.get(name, 0)}
        if route.startswith(("`POST /api/jobs/{id}/release`",
                             "`POST /api/jobs/{id}/hand-back`")):
            counted -= {"reserve-with-timeout"}  # the reserve that took the job back
        want = documented[route]
        if want.endswith(" ..."):  # a family, one per state: peek-ready ... (buried here)
            assert counted == {"peek-buried"} and want.startswith("`peek-"), (route, counted)
        else:
            assert counted == (set() if want == "none" else {want.strip("`")}), (route, counted)


async def test_stats_of_server_tube_and_job(api: Api) -> None:
    job_id = await api.put("counted")
    status, stats = await api.call("GET", "/api/stats")
    assert status == 200
    assert stats["cmd-put"] == 1 and stats["current-jobs-ready"] == 1
    assert stats["version"].endswith("-tubeq") and not stats["version"].startswith('"')
    status, tube = await api.call("GET", "/api/tubes/counted")
    assert status == 200
    assert (tube["name"], tube["current-jobs-ready"], tube["total-jobs"]) == ("counted", 1, 1)
    status, job = await api.call("GET", f"/api/jobs/{job_id}")
    assert status == 200 and job["id"] == job_id and "time-left" in job
    status, tubes = await api.call("GET", "/api/tubes")
    assert status == 200 and tubes["count"] == 2
    assert [t["name"] for t in tubes["tubes"]] == ["default", "counted"]


async def test_peek_by_state_and_the_job_list(api: Api) -> None:
    first = await api.put("p", b"one", pri=5)
    await api.put("p", b"two", pri=9)
    delayed = await api.put("p", b"later", delay=100)
    status, data = await api.call("GET", "/api/tubes/p/peek/ready")
    assert (status, data["id"], data["body"]) == (200, first, "one")
    status, data = await api.call("GET", "/api/tubes/p/peek/delayed")
    assert (status, data["id"]) == (200, delayed)
    status, data = await api.call("GET", "/api/tubes/p/peek/buried")
    assert status == 404 and "no buried job" in data["error"]
    status, data = await api.call("GET", "/api/tubes/p/jobs?state=ready&limit=5")
    assert status == 200
    assert [(j["id"], j["pri"], j["body"]) for j in data["jobs"]] == [
        (first, 5, "one"), (first + 1, 9, "two")]


# -- delete, kick, pause ------------------------------------------------------------------------

async def test_delete_kick_and_pause(api: Api) -> None:
    job_id = await api.put("k")
    status, data = await api.call("DELETE", f"/api/jobs/{job_id}")
    assert (status, data) == (200, {"deleted": job_id})
    status, data = await api.call("DELETE", f"/api/jobs/{job_id}")
    assert status == 404 and "not found" in data["error"]

    delayed = await api.put("k", delay=100)
    status, data = await api.call("POST", f"/api/jobs/{delayed}/kick")
    assert (status, data) == (200, {"kicked": delayed})
    assert await job_state(api, delayed) == "ready"
    status, data = await api.call("POST", f"/api/jobs/{delayed}/kick")
    assert status == 404  # ready: neither buried nor delayed

    for _ in range(3):
        await api.put("k", delay=100)
    status, data = await api.call("POST", "/api/tubes/k/kick", json={"bound": 2})
    assert (status, data) == (200, {"kicked": 2})

    status, data = await api.call("POST", "/api/tubes/k/pause", json={"delay": 60})
    assert (status, data) == (200, {"paused": "k", "delay": 60})
    _, tube = await api.call("GET", "/api/tubes/k")
    assert tube["pause"] == 60
    assert await api.reserve("k") == (204, None)  # paused: nothing reservable
    status, _ = await api.call("POST", "/api/tubes/k/pause", params={"delay": "0"})
    assert status == 200
    status, data = await api.reserve("k")
    assert status == 200  # resumed


# -- consuming: reserve, then delete / release / bury / touch by reservation -------------------

async def test_reserve_then_settle_with_the_reservation(api: Api) -> None:
    ids = [await api.put("w", str(i).encode()) for i in range(4)]
    status, got = await api.reserve("w")
    assert status == 200 and got["id"] == ids[0] and got["body"] == "0"
    token = got["reservation"]
    assert await job_state(api, ids[0]) == "reserved"
    # Without the reservation, or with another one, the job is not yours.
    status, data = await api.call("DELETE", f"/api/jobs/{ids[0]}")
    assert status == 404
    _, other = await api.reserve("w")
    status, _ = await api.call("DELETE", f"/api/jobs/{ids[0]}",
                               params={"reservation": other["reservation"]})
    assert status == 404
    status, data = await api.call("DELETE", f"/api/jobs/{ids[0]}",
                                  params={"reservation": token})
    assert (status, data) == (200, {"deleted": ids[0]})

    status, data = await api.call("POST", f"/api/jobs/{other['id']}/release",
                                  json={"reservation": other["reservation"], "delay": 50})
    assert (status, data) == (200, {"released": other["id"], "state": "delayed"})
    assert await job_state(api, other["id"]) == "delayed"

    _, third = await api.reserve("w")
    status, data = await api.call("POST", f"/api/jobs/{third['id']}/touch",
                                  json={"reservation": third["reservation"]})
    assert status == 200 and data["deadline_ms"] >= third["deadline_ms"]
    status, data = await api.call("POST", f"/api/jobs/{third['id']}/bury",
                                  json={"reservation": third["reservation"], "pri": 3})
    assert (status, data) == (200, {"buried": third["id"]})
    _, job = await api.call("GET", f"/api/jobs/{third['id']}")
    assert (job["state"], job["pri"], job["buries"]) == ("buried", 3, 1)
    # Settled: the reservation no longer holds it.
    status, _ = await api.call("POST", f"/api/jobs/{third['id']}/release",
                               json={"reservation": third["reservation"]})
    assert status == 404


async def test_a_release_without_pri_keeps_the_jobs_priority(api: Api) -> None:
    job_id = await api.put("r", pri=42)
    _, got = await api.reserve("r")
    status, _ = await api.call("POST", f"/api/jobs/{job_id}/release",
                               json={"reservation": got["reservation"]})
    assert status == 200
    _, job = await api.call("GET", f"/api/jobs/{job_id}")
    assert (job["state"], job["pri"], job["releases"]) == ("ready", 42, 1)


async def test_a_reserve_takes_the_best_job_across_its_tubes(api: Api) -> None:
    await api.put("a", b"a", pri=10)
    best = await api.put("b", b"b", pri=1)
    status, got = await api.reserve("a,b")
    assert status == 200 and (got["id"], got["tube"]) == (best, "b")


async def test_a_long_poll_times_out_with_204_and_leaves_nothing_behind(api: Api) -> None:
    assert await api.reserve("idle", timeout=1) == (204, None)
    _, tubes = await api.call("GET", "/api/tubes")
    assert [t["name"] for t in tubes["tubes"]] == ["default"]  # its watch went with it


async def test_a_long_poll_gets_a_job_put_over_the_protocol(api: Api) -> None:
    poll = asyncio.create_task(api.reserve("later", timeout=30))
    await eventually(lambda: _waiting(api, "later"), "the poll waits on the tube")
    bean = await Beanstalk.open(api.server.port)
    try:
        await bean.ask(b"use later")
        reply = await bean.ask(b"put 0 0 60 4", b"ping")
    finally:
        await bean.close()
    status, got = await poll
    assert status == 200
    assert (b"INSERTED %d\r\n" % got["id"], got["body"]) == (reply, "ping")


async def test_a_long_poll_of_a_reaped_process_waits_again_after_its_restore(api: Api) -> None:
    """The process is reaped (as after a pause past the reap limit): reap.lua counts out the
    poll's token, which is in no connection set; the restore that follows makes the poll count
    itself in again, so a put is handed to it at once (not found at its next 10 s re-check)."""
    ctx = api.server.ctx
    assert ctx is not None
    poll = asyncio.create_task(api.reserve("reaped", timeout=8))
    await eventually(lambda: _waiting(api, "reaped"), "the poll waits on the tube")
    assert await ctx.store.leave() == 1  # the reap another process would run
    assert not await _waiting(api, "reaped")  # counted out with its process
    ctx.restore_registrations()  # what its next heartbeat does, found unregistered
    await eventually(lambda: _waiting(api, "reaped"), "the poll waits again")
    job_id = await api.put("reaped", b"after the reap")
    status, got = await asyncio.wait_for(poll, 3)
    assert status == 200 and got["id"] == job_id


async def _waiting(api: Api, tube: str) -> bool:
    status, data = await api.call("GET", f"/api/tubes/{tube}")
    return status == 200 and data["current-waiting"] == 1


async def test_an_http_reservation_lives_until_its_ttr(api: Api) -> None:
    job_id = await api.put("t", b"slow work", ttr=1)
    _, got = await api.reserve("t")
    assert got["id"] == job_id

    async def back() -> bool:
        return await job_state(api, job_id) == "ready"

    await eventually(back, "the job's TTR ran out and it is ready again")
    _, job = await api.call("GET", f"/api/jobs/{job_id}")
    assert job["timeouts"] == 1
    for action in ("touch", "release", "bury"):  # the reservation ended with the TTR
        status, data = await api.call("POST", f"/api/jobs/{job_id}/{action}",
                                      json={"reservation": got["reservation"]})
        assert status == 404, data
    status, again = await api.reserve("t")
    assert status == 200 and again["id"] == job_id and again["reservation"] != got["reservation"]


async def test_a_poll_whose_client_went_away_gives_its_job_back(api: Api) -> None:
    timeout = aiohttp.ClientTimeout(total=1.0)
    with pytest.raises(TimeoutError):
        async with aiohttp.ClientSession(timeout=timeout) as impatient:
            await impatient.post(f"{api.base}/api/tubes/gone/reserve?timeout=60")

    async def nobody_waits() -> bool:
        status, data = await api.call("GET", "/api/tubes/gone")
        return status == 404 or data["current-waiting"] == 0

    await eventually(nobody_waits, "the abandoned poll stopped waiting")
    job_id = await api.put("gone", b"for someone else")
    status, got = await api.reserve("gone", timeout=5)
    assert status == 200 and got["id"] == job_id


async def test_draining_refuses_http_puts_and_uses_their_ids(api: Api) -> None:
    first = await api.put("default", b"before")
    api.server.drain()
    status, data = await api.call("POST", "/api/tubes/default/jobs", data=b"x")
    assert status == 503 and "draining" in data["error"]
    status, data = await api.call("POST", "/api/tubes/default/jobs?key=k", data=b"x")
    assert status == 503 and "draining" in data["error"]
    # Each refused put used up an id, as a protocol put does (tubeq.server.ops).
    for ctx in api.server.namespaces.values():
        ctx.draining = False
    assert await api.put("default", b"after") == first + 3


# -- bad input: a 4xx with a JSON error, and the server serves on -------------------------------

BAD_REQUESTS: list[tuple[str, str, dict[str, Any], int, str]] = [
    ("POST", "/api/tubes/t/jobs", {"data": b"{not json",
                                   "headers": {"Content-Type": "application/json"}},
     400, "not valid JSON"),
    ("POST", "/api/tubes/t/jobs", {"json": ["a", "list"]}, 400, "JSON object"),
    ("POST", "/api/tubes/t/jobs", {"json": {"pri": 1}}, 400, "exactly one of"),
    ("POST", "/api/tubes/t/jobs", {"json": {"body": "x", "body_base64": "eA=="}}, 400,
     "exactly one of"),
    ("POST", "/api/tubes/t/jobs", {"json": {"body": 5}}, 400, "must be a string"),
    ("POST", "/api/tubes/t/jobs", {"json": {"body_base64": "%%%"}}, 400, "not valid base64"),
    ("POST", "/api/tubes/t/jobs", {"json": {"body": "x", "pri": -1}}, 400, "pri must be"),
    ("POST", "/api/tubes/t/jobs", {"json": {"body": "x", "pri": 2**32}}, 400, "pri must be"),
    ("POST", "/api/tubes/t/jobs", {"json": {"body": "x", "ttr": "soon"}}, 400, "ttr must be"),
    ("POST", "/api/tubes/t/jobs", {"json": {"body": "x", "delay": True}}, 400, "delay must be"),
    ("POST", "/api/tubes/t/jobs", {"json": {"body": "x", "max_tries": 3}}, 400,
     "unknown option 'max_tries'"),
    ("POST", "/api/tubes/t/jobs?pri=1.5", {"data": b"x"}, 400, "pri must be"),
    ("POST", "/api/tubes/t/jobs?pri=1&pri=2", {"data": b"x"}, 400, "twice"),
    ("POST", "/api/tubes/t/jobs?ttr=1", {"json": {"body": "x", "ttr": 2}}, 400,
     "both in the query and in the body"),
    ("POST", "/api/tubes/-bad/jobs", {"data": b"x"}, 400, "bad tube name"),
    ("POST", "/api/tubes/" + "a" * 201 + "/jobs", {"data": b"x"}, 400, "bad tube name"),
    ("POST", "/api/tubes/t%20x/jobs", {"data": b"x"}, 400, "bad tube name"),
    ("POST", "/api/tubes/t/jobs", {"data": b"x" * 65536}, 413, "too big"),
    ("POST", "/api/tubes/t/jobs", {"data": b"x" * 600_000}, 413,
     "job body too big: 600000 bytes, at most 65535"),
    ("GET", "/api/jobs/0", {}, 400, "bad job id"),
    ("GET", "/api/jobs/abc", {}, 400, "bad job id"),
    ("GET", "/api/jobs/18446744073709551616", {}, 400, "bad job id"),
    ("GET", "/api/jobs/4242", {}, 404, "job 4242 not found, and no end of it kept"),
    ("GET", "/api/jobs/4242/result", {}, 404, "job 4242 not found, and no end of it kept"),
    ("GET", "/api/jobs/abc/result", {}, 400, "bad job id"),
    ("GET", "/api/jobs/4242/result?wait-ms=soon", {}, 400,
     "wait-ms must be a whole number from 0 to 600000"),
    ("GET", "/api/jobs/4242/result?wait-ms=-1", {}, 400, "wait-ms must be"),
    ("GET", "/api/jobs/4242/result?wait-ms=600001", {}, 400, "wait-ms must be"),
    ("GET", "/api/jobs/4242/result?wait-ms=1&wait-ms=2", {}, 400, "twice"),
    ("GET", "/api/jobs/4242/result?progress=x", {}, 400, "progress must be"),
    ("GET", "/api/jobs/4242?wait-ms=1", {}, 400, "unknown option 'wait-ms'"),
    ("DELETE", "/api/jobs/4242", {}, 404, "not found"),
    ("POST", "/api/jobs/4242/kick", {}, 404, "not found"),
    ("POST", "/api/jobs/4242/release", {"json": {"reservation": "x", "pri": 1}}, 404,
     "not reserved"),
    ("POST", "/api/jobs/4242/release", {"json": {"reservation": "x"}}, 404, "not found"),
    ("POST", "/api/jobs/4242/release", {"json": {"pri": 1}}, 400, "'reservation'"),
    ("POST", "/api/jobs/4242/bury", {"json": {"reservation": 7, "pri": 1}}, 400,
     "'reservation'"),
    ("POST", "/api/jobs/4242/touch", {"json": {"reservation": "x"}}, 404, "not reserved"),
    ("GET", "/api/tubes/nosuch", {}, 404, "tube 'nosuch' not found"),
    ("GET", "/api/tubes/nosuch/jobs", {}, 404, "not found"),
    ("GET", "/api/tubes/default/jobs?state=lost", {}, 400, "state must be"),
    ("GET", "/api/tubes/default/jobs?limit=100000", {}, 400, "limit must be"),
    ("GET", "/api/tubes/default/jobs?limit=0", {}, 400,
     "limit must be a whole number from 1 to 200"),
    ("GET", "/api/tubes/default/peek/reserved", {}, 400, "state must be"),
    ("POST", "/api/tubes/nosuch/pause", {"json": {"delay": 5}}, 404, "not found"),
    ("POST", "/api/tubes/default/pause", {"json": {}}, 400, "'delay'"),
    ("POST", "/api/tubes/default/kick", {"json": {"bound": -3}}, 400, "bound must be"),
    ("POST", "/api/tubes/default/reserve?timeout=601", {}, 400, "timeout must be"),
    ("POST", "/api/tubes/a,-b/reserve", {}, 400, "bad tube name"),
    ("GET", "/api/nothing-here", {}, 404, "not found"),
    ("PUT", "/api/stats", {}, 405, "method not allowed"),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "message"), BAD_REQUESTS,
                         ids=[f"{m} {p[:40]} {s}" for m, p, _, s, _ in BAD_REQUESTS])
async def test_bad_requests_get_a_clear_json_error(api: Api, method: str, path: str,
                                                   kwargs: dict[str, Any], status: int,
                                                   message: str) -> None:
    got, data = await api.call(method, path, **kwargs)
    assert got == status, data
    assert set(data) == {"error"} and message in data["error"], data
    assert (await api.call("GET", "/api/stats"))[0] == 200  # and the server serves on


async def test_the_job_list_of_every_state(api: Api) -> None:
    ready = await api.put("s", b"r")
    delayed = await api.put("s", b"d", delay=100)
    held = await api.put("s", b"h")
    await api.put("other", b"o")
    _, got = await api.reserve("s")  # the ready job with the lowest id
    assert got["id"] == ready
    status, _ = await api.call("POST", f"/api/jobs/{ready}/bury",
                                  json={"reservation": got["reservation"]})
    assert status == 200
    _, got = await api.reserve("s")
    assert got["id"] == held

    async def ids(state: str) -> list[int]:
        status, data = await api.call("GET", f"/api/tubes/s/jobs?state={state}")
        assert status == 200
        return [j["id"] for j in data["jobs"]]

    assert await ids("buried") == [ready]
    assert await ids("delayed") == [delayed]
    assert await ids("reserved") == [held]
    assert await ids("ready") == []


async def test_a_put_with_wait_ms_answers_how_the_job_ended(api: Api, server: Server) -> None:
    """Request/reply over HTTP: POST with wait-ms returns the job's end (200), or the usual
    201 when it has not ended by then; the worker here finishes over the protocol."""
    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"watch calls\r\nreserve\r\n")
        await reader.readuntil(b"abc\r\n")
        writer.write(b"finish 1 4\r\n\xffok!\r\n")
        assert await reader.readline() == b"FINISHED\r\n"
        writer.close()

    done = asyncio.ensure_future(worker())
    status, data = await api.call("POST", "/api/tubes/calls/jobs", data=b"abc",
                                  params={"wait-ms": "10000"})
    await done
    assert (status, data) == (200, {"id": 1, "tube": "calls", "ended": "finished",
                                    "data": None, "data_base64": "/29rIQ=="})
    status, data = await api.call("POST", "/api/tubes/calls/jobs", data=b"x",
                                  params={"wait-ms": "50"})
    assert (status, data["id"], data["state"]) == (201, 2, "ready")


async def test_a_jobs_result_is_a_long_poll_and_its_failures_are_in_its_json(
        api: Api, server: Server) -> None:
    job_id = await api.put("answers", b"q")
    status, data = await api.call("GET", f"/api/jobs/{job_id}/result", params={"wait-ms": "50"})
    assert (status, data) == (204, None)  # not ended in time: the job lives on
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"watch answers\r\nreserve\r\nfail %d 4\r\nbad!\r\n" % job_id)
    await reader.readuntil(b"FAILED\r\n")
    status, data = await api.call("GET", f"/api/jobs/{job_id}")
    assert (status, data["state"], data["failures"], data["error"]) == (200, "ready", 1, "bad!")
    progress = asyncio.ensure_future(api.call("GET", f"/api/jobs/{job_id}/result",
                                              params={"wait-ms": "10000", "progress": "0"}))
    polling = asyncio.ensure_future(api.call("GET", f"/api/jobs/{job_id}/result",
                                             params={"wait-ms": "10000"}))
    writer.write(b"reserve\r\nprogress %d 3\r\n50%%\r\n" % job_id)
    await reader.readuntil(b"TOUCHED\r\n")
    assert await progress == (200, {"id": job_id, "progress": 1, "data": "50%",
                                    "data_base64": "NTAl"})
    writer.write(b"finish %d 3\r\nyes\r\n" % job_id)
    await reader.readuntil(b"FINISHED\r\n")
    writer.close()
    assert await polling == (200, {"id": job_id, "ended": "finished", "data": "yes",
                                   "data_base64": "eWVz"})
    status, data = await api.call("GET", "/api/jobs/999999/result")
    assert status == 404 and "not found" in data["error"]
    status, data = await api.call("GET", f"/api/jobs/{job_id}/result", params={"wait": "1"})
    assert status == 400


async def finish_over_the_protocol(server: Server, tube: str, result: bytes) -> int:
    """Put a job into ``tube`` over HTTP's sibling, the protocol, reserve it and finish it
    with ``result``; its id."""
    bean = await Beanstalk.open(server.port)
    try:
        assert (await bean.ask(b"use " + tube.encode())).startswith(b"USING ")
        job_id = int((await bean.ask(b"put 0 0 60 1", b"q")).split()[1])
        await bean.ask(b"watch " + tube.encode())
        assert (await bean.ask(b"reserve-with-timeout 5")).startswith(b"RESERVED %d " % job_id)
        assert await bean.ask(b"finish %d %d" % (job_id, len(result)), result) == (
            b"FINISHED\r\n")
    finally:
        await bean.close()
    return job_id


async def test_an_ended_jobs_json_says_how_it_ended_with_its_result(
        api: Api, server: Server) -> None:
    """A finished job's end is kept (--result-ttl): its JSON is its end, as the result route
    gives it, text and base64; another end only when a wait marked the job."""
    job_id = await finish_over_the_protocol(server, "answers", b"42 \xe2\x9c\x93")
    status, data = await api.call("GET", f"/api/jobs/{job_id}")
    assert (status, data) == (200, {"id": job_id, "ended": "finished", "data": "42 \u2713",
                                    "data_base64": "NDIg4pyT"})
    binary = await finish_over_the_protocol(server, "answers", b"\xff\x00")
    status, data = await api.call("GET", f"/api/jobs/{binary}")
    assert (status, data) == (200, {"id": binary, "ended": "finished", "data": None,
                                    "data_base64": "/wA="})
    # deleted after a wait marked it: its end, without data
    waited = await api.put("answers")
    assert (await api.call("GET", f"/api/jobs/{waited}/result"))[0] == 204
    assert (await api.call("DELETE", f"/api/jobs/{waited}"))[0] == 200
    status, data = await api.call("GET", f"/api/jobs/{waited}")
    assert (status, data) == (200, {"id": waited, "ended": "deleted", "data": "",
                                    "data_base64": ""})


async def test_reading_a_living_jobs_json_marks_it_for_nothing(api: Api) -> None:
    """GET /api/jobs/{id} is no wait: it does not mark the job, so an end that is kept only
    for a job somebody waited for (a delete's) is not kept after it."""
    job_id = await api.put("looked-at")
    for _ in range(2):
        status, data = await api.call("GET", f"/api/jobs/{job_id}")
        assert (status, data["state"], data["failures"], data["error"]) == (200, "ready", 0, "")
        assert "ended" not in data
    assert (await api.call("DELETE", f"/api/jobs/{job_id}"))[0] == 200
    for path in (f"/api/jobs/{job_id}", f"/api/jobs/{job_id}/result"):
        status, data = await api.call("GET", path)
        assert (status, data) == (404, {"error": f"job {job_id} not found, and no end of it "
                                                 "kept"}), path


async def test_tubes_count_their_jobs_finished_and_failed(api: Api, server: Server) -> None:
    await finish_over_the_protocol(server, "done", b"ok")
    failing = await api.put("done", b"bad")
    bean = await Beanstalk.open(server.port)
    try:
        await bean.ask(b"watch done")
        for _ in range(2):  # two failures of one job: ready again after each
            assert (await bean.ask(b"reserve-with-timeout 5")).startswith(
                b"RESERVED %d " % failing)
            assert await bean.ask(b"fail %d 4" % failing, b"oops") == b"FAILED\r\n"
    finally:
        await bean.close()
    status, tube = await api.call("GET", "/api/tubes/done")
    assert status == 200
    assert {k: tube[k] for k in ("total-finished", "total-failed", "total-expired",
                                 "total-dead-lettered", "total-deduplicated")} == {
        "total-finished": 1, "total-failed": 2, "total-expired": 0, "total-dead-lettered": 0,
        "total-deduplicated": 0}
    status, tubes = await api.call("GET", "/api/tubes")
    assert status == 200
    assert [(t["name"], t["finished"], t["failed"]) for t in tubes["tubes"]] == [
        ("default", 0, 0), ("done", 1, 2)]


async def test_the_summed_row_of_the_tube_list_has_no_finished_or_failed(
        redis_url: str) -> None:
    async with running_server(redis_url, metrics_max_tubes=1) as server, \
            aiohttp.ClientSession() as session:
        api = Api(server, session)
        await finish_over_the_protocol(server, "one", b"ok")
        await finish_over_the_protocol(server, "two", b"ok")
        status, tubes = await api.call("GET", "/api/tubes")
        assert status == 200
        assert [(t["name"], t["finished"], t["failed"]) for t in tubes["tubes"]] == [
            ("default", 0, 0), (None, None, None)]


async def test_a_put_after_parents_is_held_listed_and_refused_for_an_unknown_parent(
        api: Api) -> None:
    """put-with after= over HTTP: the query's "1,2" or a JSON list; the job's state now in the
    answer; held jobs in the job list; 422 for an unknown parent; 400 for a malformed list."""
    a = await api.put("parts", b"a")
    b = await api.put("parts", b"b")
    status, data = await api.call("POST", "/api/tubes/sum/jobs", data=b"s",
                                  params={"after": f"{a},{b}"})
    assert (status, data["state"]) == (201, "held")
    status, listed = await api.call("POST", "/api/tubes/sum/jobs",
                                    json={"body": "t", "after": [a]})
    assert (status, listed["state"]) == (201, "held")
    status, page = await api.call("GET", "/api/tubes/sum/jobs", params={"state": "held"})
    assert status == 200 and [j["id"] for j in page["jobs"]] == [data["id"], listed["id"]]
    status, tube = await api.call("GET", "/api/tubes/sum")
    assert status == 200 and tube["current-jobs-held"] == 2
    status, refused = await api.call("POST", "/api/tubes/sum/jobs", json={
        "body": "u", "after": [a, 424242]})
    assert status == 422 and "424242" in refused["error"]
    for bad in ("", "0", "1,,2", "x"):
        status, _ = await api.call("POST", "/api/tubes/sum/jobs", data=b"v",
                                   params={"after": bad})
        assert status == 400, bad
    status, _ = await api.call("POST", "/api/tubes/sum/jobs", json={"body": "w", "after": [0]})
    assert status == 400
    status, tube = await api.call("GET", "/api/tubes/sum")
    assert tube["total-jobs"] == 2  # the refused puts stored nothing


async def test_a_jobs_json_shows_its_latest_progress_and_parents_to_come(api: Api) -> None:
    """Read without marking anything (job_policies.lua): the progress count and latest report,
    and a held job's parents that have not finished."""
    job_id = await api.put("prog", b"work")
    child = await api.put("prog-next", b"then", after=str(job_id))
    conn = await Beanstalk.open(api.server.port)
    try:
        assert await conn.ask(b"watch prog") == b"WATCHING 2\r\n"
        assert (await conn.ask(b"reserve-with-timeout 5")).startswith(b"RESERVED %d " % job_id)
        assert await conn.ask(b"progress %d 3" % job_id, b"40%") == b"TOUCHED\r\n"
        _, data = await api.call("GET", f"/api/jobs/{job_id}")
        assert (data["progress_reports"], data["progress"], data["parents_pending"]) == (
            1, "40%", 0)
        _, held = await api.call("GET", f"/api/jobs/{child}")
        assert (held["state"], held["parents_pending"], held["progress"]) == ("held", 1, "")
    finally:
        await conn.close()


async def test_a_hand_back_is_ready_at_once_without_a_try(api: Api) -> None:
    job_id = await api.put("hb", pri=42)
    _, got = await api.reserve("hb")
    status, data = await api.call("POST", f"/api/jobs/{job_id}/hand-back",
                                  json={"reservation": got["reservation"]})
    assert (status, data) == (200, {"handed_back": job_id, "state": "ready"})
    _, job = await api.call("GET", f"/api/jobs/{job_id}")
    assert (job["state"], job["pri"], job["releases"], job["timeouts"]) == ("ready", 42, 0, 0)
    status, data = await api.call("POST", f"/api/jobs/{job_id}/hand-back",
                                  json={"reservation": got["reservation"]})
    assert status == 404 and "not reserved" in data["error"]
    _, got = await api.reserve("hb")
    bean = await Beanstalk.open(api.server.port)
    try:
        assert await bean.ask(b"cancel %d" % job_id) == b"CANCELLED\r\n"
    finally:
        await bean.close()
    status, data = await api.call("POST", f"/api/jobs/{job_id}/hand-back",
                                  json={"reservation": got["reservation"]})
    assert status == 410 and "cancelled" in data["error"]
    assert (await api.call("GET", f"/api/jobs/{job_id}"))[0] == 404


async def test_quiet_over_http_reaches_push_connections(api: Api) -> None:
    bean = await Beanstalk.open(api.server.port)
    try:
        assert await bean.ask(b"watch qt\r\npush 2 quiet=1") == b"WATCHING 2\r\n"
        assert await bean.reader.readline() == b"PUSHING 2\r\n"
        assert await api.call("POST", "/api/quiet?tube=qt") == (
            202, {"quieting": "tube", "tube": "qt"})
        assert await asyncio.wait_for(bean.reader.readline(), 5) == b"QUIET\r\n"
        assert await api.call("POST", "/api/quiet") == (202, {"quieting": "all"})
        assert await asyncio.wait_for(bean.reader.readline(), 5) == b"QUIET\r\n"
    finally:
        await bean.close()
    for query, error in (("tube=a&conn=b", "give 'tube' or 'conn'"), ("tube=-x", "tube"),
                         ("conn=", "'conn' must be"), ("all=1", "all")):
        status, data = await api.call("POST", f"/api/quiet?{query}")
        assert status == 400 and error in data["error"], (query, data)
