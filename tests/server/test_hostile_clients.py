"""Clients that do not read, flood, stall or vanish: tubeq's memory stays bounded and the other
connections keep being served (flow control, protocol.md "Limits").

Each test drives a private tubeq process over real sockets, prints what it measured (the server's
RSS before and after, whether and how fast another client was answered) and asserts only
bounds that a regression breaks: growth of a few MB where the unbounded server grew by tens or
hundreds, and liveness (another client answered within ``LIVENESS_S``), never a duration.
Every load here is bounded in time or count.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import ServerProcess, TubeqCluster

# Another client's command must be answered within this long while a hostile client misbehaves:
# a liveness bound (the unbounded server left it unanswered), not a timing claim.
LIVENESS_S = 5.0
# How long each flood runs.
FLOOD_S = 4.0
# What a non-reading client may grow the server by (issue 8: at most 5 MB; it grew ~30-580 MB).
NON_READER_GROWTH_MAX_KB = 5 * 1024
MB = 1024.0
# SO_LINGER on with a zero timeout: close() sends a reset instead of a FIN.
LINGER_RESET = struct.pack("ii", 1, 0)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


class Line:
    """A blocking beanstalkd connection for probes: one command, one whole reply."""

    def __init__(self, server: ServerProcess, *, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect, so the TCP window starts small
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(LIVENESS_S)
        self.sock.connect(server.address)
        self._buffer = b""

    def ask(self, command: bytes) -> bytes:
        """Send one command and return its whole reply (raises socket.timeout past LIVENESS_S)."""
        self.sock.sendall(command)
        return self.reply()

    def reply(self) -> bytes:
        line = self._read_until_crlf()
        word, _, rest = line.partition(b" ")
        if word in (b"OK", b"RESERVED", b"FOUND"):
            size = int(rest.split()[-1])
            return line + b"\r\n" + self._read_exactly(size + 2)
        return line + b"\r\n"

    def _read_until_crlf(self) -> bytes:
        while b"\r\n" not in self._buffer:
            self._more()
        line, _, self._buffer = self._buffer.partition(b"\r\n")
        return line

    def _read_exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._more()
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the server")
        self._buffer += data

    def close(self) -> None:
        self.sock.close()


def stat(reply: bytes, key: str) -> str:
    for line in reply.decode().splitlines():
        if line.startswith(key + ": "):
            return line.split(": ", 1)[1]
    raise AssertionError(f"no {key} in {reply!r}")


@contextlib.contextmanager
def flooding(server: ServerProcess, payload: bytes, *, read: bool) -> Iterator[list[int]]:
    """A connection that sends ``payload`` over and over for FLOOD_S (never waiting for a
    reply), reading and discarding replies only if ``read``. Yields [bytes sent, bytes read]."""
    sock = socket.create_connection(server.address)
    sock.setblocking(False)
    counts = [0, 0]
    stop = threading.Event()

    def run() -> None:
        chunk = payload * max(1, 65536 // len(payload))
        deadline = time.monotonic() + FLOOD_S
        while not stop.is_set() and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock] if read else [], [sock], [], 0.05)
            if readable:
                with contextlib.suppress(BlockingIOError):
                    counts[1] += len(sock.recv(1 << 20))
            if writable:
                with contextlib.suppress(BlockingIOError):
                    counts[0] += sock.send(chunk)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield counts
        thread.join(FLOOD_S + LIVENESS_S)
    finally:
        stop.set()
        thread.join(LIVENESS_S)
        sock.close()


def probe(other: Line, command: bytes, seconds: float, pid: int) -> tuple[list[float], int]:
    """Send ``command`` on ``other`` every 0.25 s for ``seconds``; returns each reply's latency
    (s) and the server's peak RSS (kB) meanwhile. A reply missing for LIVENESS_S raises: the
    other client was starved."""
    latencies: list[float] = []
    peak = rss_kb(pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        other.ask(command)
        latencies.append(time.monotonic() - started)
        peak = max(peak, rss_kb(pid))
        time.sleep(0.25)
    return latencies, peak


@pytest.fixture(scope="module")
def server(tubeq_cluster: TubeqCluster) -> Iterator[ServerProcess]:
    """A tubeq process of this module's own, so its RSS is this module's doing."""
    process = tubeq_cluster.start(label="tubeq-hostile")
    yield process
    process.stop()


def report(capsys: pytest.CaptureFixture[str], what: str, **figures: object) -> None:
    with capsys.disabled():
        print(f"\n[hostile] {what}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def test_a_client_that_never_reads_cannot_grow_the_server_or_starve_others(
        server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    other = Line(server)
    other.ask(b"stats-tube default\r\n")  # warm: the reply path's objects exist already
    before = rss_kb(server.pid)
    with flooding(server, b"list-tubes\r\n", read=False) as counts:
        latencies, peak = probe(other, b"stats-tube default\r\n", FLOOD_S, server.pid)
    after = rss_kb(server.pid)
    report(capsys, "non-reading list-tubes flood", seconds=FLOOD_S,
           sent_mb=round(counts[0] / 1e6, 1), rss_before_mb=round(before / MB, 1),
           rss_peak_mb=round(peak / MB, 1), rss_after_mb=round(after / MB, 1),
           others_answered=len(latencies), others_slowest_ms=round(max(latencies) * 1000, 1))
    assert peak - before <= NON_READER_GROWTH_MAX_KB, (before, peak)
    assert len(latencies) >= 4  # answered all along, not once at the end
    other.close()


def test_a_pipelined_put_flood_does_not_starve_another_connections_work(
        server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    other = Line(server)
    other.ask(b"use calm\r\n")
    other.ask(b"watch calm\r\n")
    before = rss_kb(server.pid)
    cycles, slowest = 0, 0.0
    with flooding(server, b"put 0 0 60 5\r\nflood\r\n", read=True) as counts:
        deadline = time.monotonic() + FLOOD_S
        while time.monotonic() < deadline:  # a worker's whole cycle, each reply bounded
            started = time.monotonic()
            assert other.ask(b"put 0 0 60 4\r\ncalm\r\n").startswith(b"INSERTED ")
            job_id = other.ask(b"reserve-with-timeout 0\r\n").split()[1]
            assert other.ask(b"delete " + job_id + b"\r\n") == b"DELETED\r\n"
            slowest = max(slowest, time.monotonic() - started)
            cycles += 1
    after = rss_kb(server.pid)
    flooded = int(stat(other.ask(b"stats-tube default\r\n"), "total-jobs"))
    report(capsys, "pipelined put flood (reading its replies)", seconds=FLOOD_S,
           flood_puts_inserted=flooded, flood_reply_mb=round(counts[1] / 1e6, 1),
           other_cycles=cycles, other_slowest_cycle_ms=round(slowest * 1000, 1),
           rss_before_mb=round(before / MB, 1), rss_after_mb=round(after / MB, 1))
    assert flooded > 0 and cycles > 0
    other.close()


def test_half_a_command_and_a_stall_hold_nothing_up(
        server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    stalled_line, stalled_body = Line(server), Line(server)
    stalled_line.sock.sendall(b"stats-tu")  # half a command line
    stalled_body.sock.sendall(b"use stall\r\nput 0 0 60 11\r\nhalf")  # half a body
    assert stalled_body.reply() == b"USING stall\r\n"
    other = Line(server)
    latencies, _ = probe(other, b"stats\r\n", 1.0, server.pid)
    stalled_line.sock.sendall(b"be default\r\n")  # the stalls end: both commands complete
    stalled_body.sock.sendall(b" a body\r\n")
    assert stalled_line.reply().startswith(b"OK ")
    job_id = stalled_body.reply().split()[1]
    assert other.ask(b"peek " + job_id + b"\r\n").endswith(b"\r\nhalf a body\r\n")
    report(capsys, "half a line and half a body, stalled", others_answered=len(latencies),
           others_slowest_ms=round(max(latencies) * 1000, 1))
    for line in (stalled_line, stalled_body, other):
        line.close()


def test_a_max_size_put_trickled_one_byte_a_second(
        server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    """65,535 bytes at one a second would take 18 hours: the first bytes trickle, one a second,
    while another client is served; then the rest arrives and the job is whole."""
    size, trickled = 65535, 3
    body = bytes(i % 251 for i in range(size))
    slow = Line(server)
    slow.sock.sendall(f"use trickle\r\nput 0 0 60 {size}\r\n".encode())
    assert slow.reply() == b"USING trickle\r\n"
    other = Line(server)
    before = rss_kb(server.pid)
    latencies: list[float] = []
    for i in range(trickled):
        slow.sock.sendall(body[i:i + 1])
        more, _ = probe(other, b"stats-tube default\r\n", 1.0, server.pid)
        latencies += more
    slow.sock.sendall(body[trickled:] + b"\r\n")
    job_id = slow.reply().split()[1]
    assert other.ask(b"peek " + job_id + b"\r\n").endswith(b"\r\n" + body + b"\r\n")
    after = rss_kb(server.pid)
    report(capsys, "65,535-byte put trickled", trickled_bytes=trickled,
           others_answered=len(latencies), others_slowest_ms=round(max(latencies) * 1000, 1),
           rss_before_mb=round(before / MB, 1), rss_after_mb=round(after / MB, 1))
    slow.close()
    other.close()


def test_a_client_gone_in_the_middle_of_a_body_loses_nothing(
        server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    other = Line(server)
    other.ask(b"use midbody\r\n")
    held_id = other.ask(b"put 0 0 60 4\r\nheld\r\n").split()[1]
    leaving = Line(server)
    leaving.ask(b"watch midbody\r\n")
    leaving.ask(b"ignore default\r\n")
    assert leaving.ask(b"reserve-with-timeout 0\r\n").split()[1] == held_id
    leaving.sock.sendall(b"use midbody\r\nput 0 0 60 100\r\n" + b"x" * 50)
    assert leaving.reply() == b"USING midbody\r\n"
    leaving.close()  # 50 of the 100 body bytes sent
    deadline = time.monotonic() + LIVENESS_S
    while stat(other.ask(b"stats-job " + held_id + b"\r\n"), "state") != "ready":
        assert time.monotonic() < deadline, "the reserved job did not come back"
        time.sleep(0.05)
    tube = other.ask(b"stats-tube midbody\r\n")
    report(capsys, "disconnect in the middle of a body", held_job_state="ready",
           tube_total_jobs=stat(tube, "total-jobs"))
    assert stat(tube, "total-jobs") == "1"  # the half-sent put made no job
    other.close()


def test_3000_connections_opened_and_dropped_at_once(
        server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    count = 3000
    other = Line(server)
    baseline = int(stat(other.ask(b"stats\r\n"), "current-connections"))
    before = rss_kb(server.pid)
    socks = []
    for i in range(count):
        sock = socket.create_connection(server.address, timeout=LIVENESS_S)
        if i % 2 == 0:
            # half of them blocked in a reserve on a tube that stays empty
            sock.sendall(b"watch dropped\r\nignore default\r\nreserve\r\n")
        socks.append(sock)
    deadline = time.monotonic() + 4 * LIVENESS_S
    while int(stat(other.ask(b"stats\r\n"), "current-waiting")) < count // 2:
        assert time.monotonic() < deadline, "the reserves never all started waiting"
        time.sleep(0.1)
    peak = rss_kb(server.pid)
    for i, sock in enumerate(socks):
        if i % 3 == 0:  # a third reset (RST), the rest closed (FIN)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        sock.close()
    while True:
        stats = other.ask(b"stats\r\n")
        if (int(stat(stats, "current-connections")) == baseline
                and stat(stats, "current-waiting") == "0"):
            break
        assert time.monotonic() < deadline, "the dropped connections were not all cleaned up"
        time.sleep(0.1)
    after = rss_kb(server.pid)
    report(capsys, f"{count} connections opened and dropped", rss_before_mb=round(before / MB, 1),
           rss_with_them_mb=round(peak / MB, 1), rss_after_mb=round(after / MB, 1),
           per_connection_kb=round((peak - before) / count, 1))
    assert other.ask(b"list-tubes-watched\r\n").startswith(b"OK ")
    other.close()


def test_a_connection_over_the_buffer_cap_is_closed_and_its_job_comes_back(
        tubeq_cluster: TubeqCluster, capsys: pytest.CaptureFixture[str]) -> None:
    cap = 256 * 1024
    capped = tubeq_cluster.start(label="tubeq-capped", flags=("--max-client-buffer", str(cap)))
    try:
        other = Line(capped)
        big = other.ask(b"put 0 0 60 60000\r\n" + b"b" * 60000 + b"\r\n").split()[1]
        held = other.ask(b"put 0 0 60 4\r\nheld\r\n").split()[1]
        greedy = Line(capped, rcvbuf=4096)
        assert greedy.ask(b"reserve-job " + held + b"\r\n").startswith(b"RESERVED")
        # 100 peeks of a 60 kB job, never read: ~6 MB of replies past a 256 kB cap.
        greedy.sock.sendall((b"peek " + big + b"\r\n") * 100)
        deadline = time.monotonic() + LIVENESS_S
        while stat(other.ask(b"stats-job " + held + b"\r\n"), "state") != "ready":
            assert time.monotonic() < deadline, "the capped connection's job did not come back"
            time.sleep(0.05)
        logged = "over its buffer limit" in capped.log_tail()
        report(capsys, "connection over --max-client-buffer", cap_bytes=cap,
               closed_and_logged=logged, held_job_state="ready")
        assert logged
        assert other.ask(b"stats\r\n").startswith(b"OK ")
        greedy.close()
        other.close()
    finally:
        capped.stop()


def test_a_client_that_stops_reading_and_reads_again_gets_every_reply(
        server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    """Backpressure pauses the connection and must let it go again: all replies arrive."""
    count = 20_000  # stats-tube: answered by Redis, after the pump has moved on; ~300 B each
    sock = socket.create_connection(server.address, timeout=LIVENESS_S)
    sender = threading.Thread(target=sock.sendall, args=(b"stats-tube default\r\n" * count,),
                              daemon=True)
    sender.start()
    time.sleep(1.0)  # not reading: the server's buffers fill and it stops reading too
    replies, buffer = 0, b""
    while replies < count:
        chunk = sock.recv(1 << 20)  # a stall past LIVENESS_S raises: the connection was stuck
        assert chunk, "closed by the server"
        buffer += chunk
        while (end := buffer.find(b"\r\n")) >= 0:  # OK <bytes>\r\n<yaml>\r\n
            size = int(buffer[3:end])
            if len(buffer) < end + 2 + size + 2:
                break
            buffer = buffer[end + 2 + size + 2:]
            replies += 1
    sender.join(LIVENESS_S)
    report(capsys, "stopped reading, then read again", commands=count, replies=replies)
    assert replies == count and buffer == b""
    sock.close()
