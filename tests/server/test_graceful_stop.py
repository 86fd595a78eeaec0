"""Graceful stop (SIGTERM) and the bundled client's failover between servers.

SIGTERM: puts answer DRAINING, the listener closes, connections that hold jobs get
--shutdown-grace seconds to finish them, then every connection is closed (the jobs it still
held go back to ready) and tubeq exits 0. A second tubeq on the same Redis and prefix watches
the jobs. The client given several servers moves to the next one when its server dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable

import pytest

from tests.server.test_multiprocess import LineClient
from tests.support.servers import ServerProcess, TubeqCluster, unique_prefix
from tubeq.client import Client, ClientConnectionError

pytestmark = pytest.mark.usefixtures("skip_unless_tubeq")

EXIT_BOUND_S = 20.0  # bound on waits below, never asserted as a duration


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + EXIT_BOUND_S
    while not check():
        assert time.monotonic() < deadline, f"not within {EXIT_BOUND_S:g} s: {what}"
        time.sleep(0.05)


def refuses_connections(server: ServerProcess) -> bool:
    try:
        socket.create_connection(server.address, timeout=0.5).close()
    except OSError:
        return True
    return False


def test_sigterm_drains_lets_holders_finish_and_exits_0(tubeq_cluster: TubeqCluster) -> None:
    prefix = unique_prefix("tq-stop")
    stopping = tubeq_cluster.start(prefix, "tubeq-stopping", ("--shutdown-grace", "30"))
    watcher = LineClient(tubeq_cluster.start(prefix, "tubeq-watcher"))
    worker, producer = LineClient(stopping), LineClient(stopping)
    job_id = producer.put(b"finish me")
    assert worker.call("reserve-with-timeout 5").words[:2] == [b"RESERVED", str(job_id).encode()]

    stopping.send_signal(signal.SIGTERM)
    wait_until(lambda: refuses_connections(stopping), "the listener closes")
    assert producer.call("put 0 0 60 4\r\nlate").head == b"DRAINING"
    assert stopping.alive(), "tubeq must wait while a connection holds a job"
    # The holder finishes within the grace period: its delete is answered as usual.
    assert worker.call(f"delete {job_id}").head == b"DELETED"
    assert stopping.proc.wait(EXIT_BOUND_S) == 0
    assert watcher.call(f"peek {job_id}").head == b"NOT_FOUND"
    for client in (watcher, worker, producer):
        client.close()


def test_jobs_held_past_the_grace_go_back_to_ready(tubeq_cluster: TubeqCluster) -> None:
    prefix = unique_prefix("tq-stop")
    stopping = tubeq_cluster.start(prefix, "tubeq-stopping", ("--shutdown-grace", "0.5"))
    watcher = LineClient(tubeq_cluster.start(prefix, "tubeq-watcher"))
    worker = LineClient(stopping)
    job_id = LineClient(stopping).put(b"held too long")
    assert worker.call("reserve-with-timeout 5").words[0] == b"RESERVED"
    assert b"\nstate: reserved\n" in (watcher.call(f"stats-job {job_id}").data or b"")

    stopping.send_signal(signal.SIGTERM)
    assert stopping.proc.wait(EXIT_BOUND_S) == 0
    # Closed by the server, not by the TTR (60 s): the job is ready again at once.
    assert b"\nstate: ready\n" in (watcher.call(f"stats-job {job_id}").data or b"")
    assert worker.sock.recv(1) == b""  # the server closed the worker's connection
    watcher.close()


async def test_the_client_fails_over_to_the_next_server(
        tubeq_factory: Callable[[str], ServerProcess], tube_name: str) -> None:
    prefix = unique_prefix("tq-failover")
    first, second = tubeq_factory(prefix), tubeq_factory(prefix)
    async with Client(servers=[first.address, f"{second.host}:{second.port}"]) as client:
        assert (client.host, client.port) == first.address
        await client.use(tube_name)
        await client.watch(tube_name)
        before = await client.put(b"put through the first")
        os.kill(first.pid, signal.SIGKILL)
        first.proc.wait()
        # The call that finds the connection dead fails; the next one goes to the second server
        # with the client's state (use) replayed there.
        with contextlib.suppress(ClientConnectionError):
            await client.stats()
        after = await client.put(b"put through the second")
        assert (client.host, client.port) == second.address
        assert client.used == tube_name and tube_name in client.watched
        job = await client.reserve_with_timeout(5)
        assert (job.id, job.body) == (before, b"put through the first")
        await job.delete()
        job = await client.reserve_with_timeout(5)
        assert (job.id, job.body) == (after, b"put through the second")
        await job.delete()

    # A first server that is already down is skipped on the first connect too.
    async with Client(servers=[first.address, second.address]) as client:
        assert (client.host, client.port) == second.address
        assert (await client.stats())["pid"] == second.pid
