"""Two tubeq processes on one Redis and one prefix serve one queue.

A reserve blocked on process A must be woken by a put made through process B (the wake-up crosses
processes through Redis), and what A stores must be what B reports. Waits are bounded, never
asserted as durations.
"""

from __future__ import annotations

import secrets
import signal
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from tests.differential.grammar import Reply, split_reply
from tests.support.servers import ServerProcess, TubeqCluster, unique_prefix
from tubeq.store.shards import shard_of_tube

# The bound on every reply; the cross-process wake-up normally takes milliseconds.
REPLY_TIMEOUT_S = 8.0
# A pause of one process longer than the reap limit (tubeq.server.scheduler.REAP_AFTER_MS, 3 s)
# plus a heartbeat: the other process takes it for dead.
PAUSE_S = 5.0

pytestmark = pytest.mark.usefixtures("skip_unless_tubeq")


class LineClient:
    """A blocking raw-protocol client: send a command, read one reply (by the reply grammar)."""

    def __init__(self, server: ServerProcess) -> None:
        self.sock = socket.create_connection(server.address, timeout=REPLY_TIMEOUT_S)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> Reply:
        while True:
            parsed = split_reply(self.buffer)
            if parsed is not None:
                outcome, used = parsed
                self.buffer = self.buffer[used:]
                assert isinstance(outcome, Reply), outcome
                return outcome
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection"
            self.buffer += chunk

    def nothing_within(self, seconds: float) -> bool:
        self.sock.settimeout(seconds)
        try:
            return not self.sock.recv(1, socket.MSG_PEEK)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(REPLY_TIMEOUT_S)

    def call(self, line: str) -> Reply:
        self.send(line.encode() + b"\r\n")
        return self.reply()

    def put(self, body: bytes) -> int:
        self.send(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
        reply = self.reply()
        assert reply.words[0] == b"INSERTED", reply
        return int(reply.words[1])

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def two_processes(
    tubeq_factory: Callable[[str], ServerProcess],
) -> tuple[ServerProcess, ServerProcess]:
    prefix = unique_prefix("tq-shared")
    return tubeq_factory(prefix), tubeq_factory(prefix)


@pytest.fixture
def clients() -> Iterator[Callable[[ServerProcess], LineClient]]:
    opened: list[LineClient] = []

    def connect(server: ServerProcess) -> LineClient:
        opened.append(LineClient(server))
        return opened[-1]

    yield connect
    for client in opened:
        client.close()


def _tube() -> str:
    return f"mp-{secrets.token_hex(4)}"


def test_put_on_one_process_wakes_reserve_blocked_on_the_other(
    two_processes: tuple[ServerProcess, ServerProcess],
    clients: Callable[[ServerProcess], LineClient],
) -> None:
    process_a, process_b = two_processes
    tube = _tube()
    worker = clients(process_a)
    assert worker.call(f"watch {tube}").head == b"WATCHING 2"
    assert worker.call("ignore default").head == b"WATCHING 1"
    worker.send(b"reserve-with-timeout 30\r\n")
    assert worker.nothing_within(0.5), "the reserve should be blocked: nothing is ready"

    producer = clients(process_b)
    assert producer.call(f"use {tube}").head == f"USING {tube}".encode()
    job_id = producer.put(b"across processes")

    reserved = worker.reply()
    assert reserved.words[:2] == [b"RESERVED", str(job_id).encode()], reserved
    assert reserved.data == b"across processes"


def test_put_on_one_process_is_visible_from_the_other(
    two_processes: tuple[ServerProcess, ServerProcess],
    clients: Callable[[ServerProcess], LineClient],
) -> None:
    process_a, process_b = two_processes
    tube = _tube()
    producer = clients(process_a)
    producer.call(f"use {tube}")
    job_id = producer.put(b"seen from B")

    observer = clients(process_b)
    listing = observer.call("list-tubes")
    assert f"- {tube}\n".encode() in (listing.data or b""), listing
    tube_stats = observer.call(f"stats-tube {tube}").data or b""
    assert b"\ncurrent-jobs-ready: 1\n" in tube_stats, tube_stats
    assert b"\ntotal-jobs: 1\n" in tube_stats, tube_stats  # the put's script counted it
    peeked = observer.call(f"peek {job_id}")
    assert (peeked.words[0], peeked.data) == (b"FOUND", b"seen from B"), peeked


def test_another_processs_command_counts_arrive_within_the_flush_delay(
    two_processes: tuple[ServerProcess, ServerProcess],
    clients: Callable[[ServerProcess], LineClient],
) -> None:
    """cmd-* leave a process 10 ms after their first count (protocol.md, "When counts are
    seen"): another process's stats shows them soon after, and its own at once."""
    process_a, process_b = two_processes
    producer, observer = clients(process_a), clients(process_b)

    def cmd_peek_ready(client: LineClient) -> int:
        document = client.call("stats").data or b""
        line = next(x for x in document.split(b"\n") if x.startswith(b"cmd-peek-ready: "))
        return int(line.split()[1])

    before = cmd_peek_ready(observer)
    for _ in range(3):
        assert producer.call("peek-ready").head == b"NOT_FOUND"
    assert cmd_peek_ready(producer) == before + 3  # its own process sends them before it reads
    for _ in range(3):
        assert producer.call("peek-ready").head == b"NOT_FOUND"
    deadline = time.monotonic() + 5
    while (seen := cmd_peek_ready(observer)) < before + 6 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert seen == before + 6


def test_every_job_is_delivered_exactly_once_across_processes(
    two_processes: tuple[ServerProcess, ServerProcess],
    clients: Callable[[ServerProcess], LineClient],
) -> None:
    """Delayed jobs fall due while both processes sweep, and workers on both take them: each
    job is promoted once and delivered once (the scripts are atomic)."""
    tube = _tube()
    producer = clients(two_processes[0])
    producer.call(f"use {tube}")
    expected = [str(i).encode() for i in range(120)]
    for body in expected:
        producer.send(b"put 0 1 60 %d\r\n%s\r\n" % (len(body), body))
    for _ in expected:
        assert producer.reply().words[0] == b"INSERTED"
    workers = [clients(server) for server in two_processes for _ in range(2)]
    for worker in workers:
        assert worker.call(f"watch {tube}").head == b"WATCHING 2"
    delivered: list[bytes] = []
    idle_rounds = 0
    while len(delivered) < len(expected) and idle_rounds < 3:  # bounded: 3 rounds of 2 s
        idle_rounds += 1
        for worker in workers:
            got = worker.call("reserve-with-timeout 2")
            if got.words[0] == b"RESERVED":
                idle_rounds = 0
                delivered.append(got.data or b"")
                assert worker.call(f"delete {got.words[1].decode()}").head == b"DELETED"
    assert sorted(delivered) == sorted(expected)
    for worker in workers:
        assert worker.call("reserve-with-timeout 0").head == b"TIMED_OUT"


def _eventually(check: Callable[[], bool]) -> bool:
    """Poll ``check`` until it holds or REPLY_TIMEOUT_S passes (a bound, not a measurement)."""
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_use_counts_reach_the_other_process(
    two_processes: tuple[ServerProcess, ServerProcess],
    clients: Callable[[ServerProcess], LineClient],
) -> None:
    """A process tells Redis its use counts in batches (tubeq.server.using): another process sees a
    tube's users come and go, and a tube with no job disappears once its last user leaves."""
    process_a, process_b = two_processes
    tube = _tube()
    first, second = clients(process_a), clients(process_a)
    observer = clients(process_b)

    def using_count() -> bytes:
        reply = observer.call(f"stats-tube {tube}")
        if reply.head == b"NOT_FOUND":
            return b"gone"
        data = reply.data or b""
        return data.split(b"\ncurrent-using: ")[1].split(b"\n")[0]

    assert first.call(f"use {tube}").head == f"USING {tube}".encode()
    assert using_count() == b"1"  # the first user in a process is told at once
    second.call(f"use {tube}")
    assert _eventually(lambda: using_count() == b"2")
    first.call("use default")
    assert _eventually(lambda: using_count() == b"1")
    second.close()
    assert _eventually(lambda: using_count() == b"gone")
    assert f"- {tube}\n".encode() not in (observer.call("list-tubes").data or b"")


@pytest.mark.parametrize("shards", [1, 4])
def test_a_process_paused_past_the_reap_limit_serves_its_connections_again(
    tubeq_cluster: TubeqCluster, clients: Callable[[ServerProcess], LineClient], shards: int,
) -> None:
    """A paused process (a VM pause, swapping) is reaped by the other as dead; when it runs
    again its heartbeat finds it unregistered and it restores its connections' watches, so a
    connection opened before the pause is served, and stats count its watch again. With
    shards, the tube lives in a shard other than tube default's (the connection's home): the
    reap there takes the watch counts but not the watch list."""
    prefix = unique_prefix("tq-pause")
    flags = ("--shards", str(shards))
    process_a, process_b = (tubeq_cluster.start(prefix, f"tubeq-pause-{n}", flags)
                            for n in "ab")
    try:
        tube = _tube()
        while shards > 1 and shard_of_tube(tube, shards) == shard_of_tube("default", shards):
            tube = _tube()
        worker = clients(process_a)
        assert worker.call(f"watch {tube}").head == b"WATCHING 2"
        process_a.send_signal(signal.SIGSTOP)
        try:
            time.sleep(PAUSE_S)  # past REAP_AFTER_MS: process B reaps A meanwhile
        finally:
            process_a.send_signal(signal.SIGCONT)
        producer = clients(process_b)
        producer.call(f"use {tube}")
        job_id = producer.put(b"after the pause")
        worker.send(b"reserve-with-timeout 6\r\n")
        reserved = worker.reply()
        assert reserved.words[:2] == [b"RESERVED", str(job_id).encode()], reserved
        assert "registrations restored" in process_a.log_tail(20000), process_a.log_tail()
        assert "reaped silent tubeq processes" in process_b.log_tail(20000)
        # Each shard's reap and restore run on that shard's own heartbeat: poll, bounded.
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while b"\ncurrent-watching: 1\n" not in (
                tube_stats := producer.call(f"stats-tube {tube}").data or b""):
            assert time.monotonic() < deadline, tube_stats
            time.sleep(0.1)
    finally:
        process_a.send_signal(signal.SIGCONT)
        process_a.stop()
        process_b.stop()
