"""A delayed job that comes due goes to the reserve that waits for it (promote.lua's hand-over).

Against a real tubeq and its private Redis: a reserve blocked in the process whose scheduler
promotes the job gets it in promote's own reply, with no reserve script run for it (counted by
MONITOR); a reserve blocked only in another process gets it through that process's wake-up, as
before. Waits are bounded, never asserted as durations.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import pytest
import redis

from tests.support.servers import ServerProcess, TubeqCluster, unique_prefix
from tests.support.wire import Wire

pytestmark = pytest.mark.usefixtures("skip_unless_tubeq")

# The bound on every wait here; a due job normally reaches its reserve within milliseconds.
BOUND_S = 10.0


def _waiting_on(server: ServerProcess, tube: str) -> bool:
    """Poll stats-tube until a reserve is counted waiting on ``tube`` (bounded)."""
    with Wire(server.host, server.port) as w:
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            if w.yaml(f"stats-tube {tube}").get("current-waiting") == "1":
                return True
            time.sleep(0.02)
    return False


def test_a_due_job_reaches_a_reserve_of_the_promoting_process_with_no_reserve_script(
        tubeq_cluster: TubeqCluster) -> None:
    """The worker's reserve blocks (its first try and its try after counting in find nothing);
    a job put with a delay then comes due: promote hands it to the waiting reserve in its own
    reply, counted out. Before, promote published a wake-up and the woken reserve ran
    reserve.lua to take it: one more script and one more Redis round trip per due job."""
    prefix = unique_prefix("tq-due")
    marker = f"{prefix}-end"
    server = tubeq_cluster.start(prefix=prefix, label="tubeq-due")
    monitor = redis.Redis.from_url(tubeq_cluster.redis.url)
    other = redis.Redis.from_url(tubeq_cluster.redis.url)
    seen: list[str] = []
    watching = threading.Event()

    def record() -> None:
        """The scripts of this namespace MONITOR shows from the put on (FCALL tq<hash>_<name>
        ...: Redis 7 runs them so), up to the marker (sent last)."""
        with monitor.monitor() as m:
            watching.set()
            while True:
                command = m.next_command()["command"]
                if marker in command:
                    return
                if prefix in command and command.startswith("FCALL "):
                    name = command.split()[1].split("_", 1)[-1]
                    if seen or name == "put":
                        seen.append(name)

    recorder = threading.Thread(target=record, daemon=True)
    try:
        with Wire(server.host, server.port) as worker, Wire(server.host, server.port) as producer:
            # One tube (not default too): in a split namespace (TUBEQ_TEST_SHARDS) a reserve
            # over two shards takes no job from a reply (mode 'h'/'o', not 'r').
            assert worker.ask(b"watch due\r\n") == b"WATCHING 2\r\n"
            assert worker.ask(b"ignore default\r\n") == b"WATCHING 1\r\n"
            assert producer.ask(b"use due\r\n") == b"USING due\r\n"
            worker.send(b"reserve-with-timeout 30\r\n")
            assert _waiting_on(server, "due"), "the reserve was never counted waiting"
            recorder.start()
            assert watching.wait(BOUND_S)
            inserted = producer.ask(b"put 0 1 60 3\r\nabc\r\n")
            assert inserted.startswith(b"INSERTED ")
            job_id = inserted.split()[1]
            assert worker.reply() == b"RESERVED %s 3\r\nabc\r\n" % job_id
            other.echo(marker)
            recorder.join(BOUND_S)
            assert not recorder.is_alive(), "MONITOR never showed the marker"
    finally:
        with contextlib.suppress(redis.RedisError):
            other.echo(marker)  # lets the recorder end on every path
        if recorder.is_alive():
            recorder.join(BOUND_S)
        monitor.close()
        other.close()
    # The put, then the sweep (promote, and expire and schedule_due beside it), and nothing
    # for the job: no reserve.lua to take it, no count_waiting.lua to count the reserve out.
    assert seen[0] == "put" and "promote" in seen, seen
    assert "reserve" not in seen and "count_waiting" not in seen, seen


def test_a_due_job_reaches_a_reserve_blocked_only_in_another_process(
        tubeq_factory: Callable[[str], ServerProcess]) -> None:
    """Process A stores the delayed job (and so promotes it when it comes due), while the
    only reserve waits in process B: A's promote hands nothing over (B's connection is first in
    line) and publishes the wake-up, B's reserve takes the job."""
    prefix = unique_prefix("tq-due-far")
    a, b = tubeq_factory(prefix), tubeq_factory(prefix)
    with Wire(b.host, b.port) as worker, Wire(a.host, a.port) as producer:
        assert worker.ask(b"watch far\r\n") == b"WATCHING 2\r\n"
        assert producer.ask(b"use far\r\n") == b"USING far\r\n"
        worker.send(b"reserve-with-timeout 30\r\n")
        assert _waiting_on(b, "far"), "the reserve was never counted waiting"
        inserted = producer.ask(b"put 0 1 60 3\r\nxyz\r\n")
        assert inserted.startswith(b"INSERTED ")
        assert worker.reply() == b"RESERVED %s 3\r\nxyz\r\n" % inserted.split()[1]
