"""Third-party Python beanstalkd clients (greenstalk, pystalk) doing one full round trip.

The round trip is the one of research/pipeline-ecosystem.md section 6: use/watch/ignore, put,
reserve, stats-job, release with a delay, bury, kick, delete, list-tubes, stats-tube and a
TIMED_OUT. Each client runs it against tubeq and against beanstalkd 1.12; the beanstalkd run
proves the test itself. pystalk reads a one-line reply with a single ``recv``, so it also checks
that tubeq writes each reply line in one piece.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any

import greenstalk
import pystalk  # type: ignore[import-untyped]
import pytest

from tests.support.servers import ServerProcess

SERVER_FIXTURES = ("tubeq", "beanstalkd")
# Bounds for the waits of the round trip; the delayed job is due after 1 s.
RESERVE_TIMEOUT_S = 5
SOCKET_TIMEOUT_S = 10.0


@pytest.fixture(params=SERVER_FIXTURES)
def server(request: pytest.FixtureRequest) -> ServerProcess:
    if request.param == "tubeq" and request.config.getoption("--wire-target") != "tubeq":
        pytest.skip("the wire target is beanstalkd; tubeq is not exercised in this run")
    started: ServerProcess = request.getfixturevalue(request.param)
    return started


def fresh_tube() -> str:
    return f"clients-{secrets.token_hex(4)}"


def test_greenstalk_round_trip(server: ServerProcess) -> None:
    tube = fresh_tube()
    with greenstalk.Client(server.address, use=tube, watch=tube) as client:
        assert client.watching() == [tube]
        job_id = client.put("round trip", priority=100, delay=0, ttr=30)
        job = client.reserve(timeout=RESERVE_TIMEOUT_S)
        assert (job.id, job.body) == (job_id, "round trip")
        _check_stats(client.stats_job(job), state="reserved", pri=100, tube=tube)

        client.release(job, priority=50, delay=1)
        _check_stats(client.stats_job(job), state="delayed", pri=50, tube=tube)
        job = client.reserve(timeout=RESERVE_TIMEOUT_S)
        assert job.id == job_id

        client.bury(job, priority=60)
        stats = client.stats_job(job)
        _check_stats(stats, state="buried", pri=60, tube=tube)
        assert stats["buries"] == 1

        assert client.kick(10) == 1
        _check_stats(client.stats_job(job), state="ready", pri=60, tube=tube)
        job = client.reserve(timeout=RESERVE_TIMEOUT_S)
        client.delete(job)
        with pytest.raises(greenstalk.NotFoundError):
            client.stats_job(job)

        assert tube in client.tubes()
        _check_tube_after_round_trip(client.stats_tube(tube))
        with pytest.raises(greenstalk.TimedOutError):
            client.reserve(timeout=0)


def test_pystalk_round_trip(server: ServerProcess) -> None:
    tube = fresh_tube()
    client = pystalk.BeanstalkClient(server.host, server.port, socket_timeout=SOCKET_TIMEOUT_S,
                                     auto_decode=True)
    try:
        client.use(tube)
        client.watch(tube)  # pystalk's first watch also ignores "default"
        assert client.watchlist == {tube}
        inserted = client.put_job("round trip", pri=100, delay=0, ttr=30)
        job_id = _pystalk_id(inserted)
        job = client.reserve_job(RESERVE_TIMEOUT_S)
        assert (job.job_id, job.job_data) == (job_id, "round trip")
        _check_stats(client.stats_job(job_id), state="reserved", pri=100, tube=tube)

        client.release_job(job_id, pri=50, delay=1)
        _check_stats(client.stats_job(job_id), state="delayed", pri=50, tube=tube)
        assert client.reserve_job(RESERVE_TIMEOUT_S).job_id == job_id

        client.bury_job(job_id, pri=60)
        stats = client.stats_job(job_id)
        _check_stats(stats, state="buried", pri=60, tube=tube)
        assert stats["buries"] == 1

        assert _pystalk_id(client.kick_jobs(10)) == 1
        _check_stats(client.stats_job(job_id), state="ready", pri=60, tube=tube)
        assert client.reserve_job(RESERVE_TIMEOUT_S).job_id == job_id
        client.delete_job(job_id)
        _expect_pystalk_error("NOT_FOUND", lambda: client.stats_job(job_id))

        assert tube in client.list_tubes()
        _check_tube_after_round_trip(client.stats_tube(tube))
        _expect_pystalk_error("TIMED_OUT", lambda: client.reserve_job(0))
    finally:
        client.close()


def _check_stats(stats: Mapping[str, Any], *, state: str, pri: int, tube: str) -> None:
    assert (stats["state"], stats["pri"], stats["tube"]) == (state, pri, tube), stats


def _check_tube_after_round_trip(stats: Mapping[str, Any]) -> None:
    assert stats["total-jobs"] == 1, stats
    for key in ("current-jobs-ready", "current-jobs-reserved", "current-jobs-buried"):
        assert stats[key] == 0, (key, stats)


def _pystalk_id(reply: Any) -> int:
    """pystalk returns ``(b"INSERTED", id)`` / ``(b"KICKED", n)`` from put_job and kick_jobs."""
    number = reply[-1] if isinstance(reply, tuple) else reply
    return int(number)


def _expect_pystalk_error(word: str, call: Callable[[], object]) -> None:
    with pytest.raises(pystalk.BeanstalkError) as caught:
        call()
    assert word in str(caught.value), caught.value
