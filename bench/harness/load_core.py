"""What every beanstalk load of the harness is built on: the load's spec, its run state, the job
body layout, and the connection base class (bench.harness.loadgen's modes and
bench.harness.batch_load's batch modes both build on it).

Owns: LoadSpec (one load, totals over all generator processes), RunState (one generator
process's counters, latency samples and window), the job body (a CLOCK_MONOTONIC timestamp and a
delay digit first, so any process can compute a job's latency from its body alone), the put
commands, and BeanstalkConnection (one asyncio Protocol per connection: setup replies, then
replies in command order).

Rules: imports nothing of the modes built on it; every bound (setup, reserve timeout, samples
kept) is a constant here with the reason for its value.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Body layout: monotonic_ns as 19 ASCII digits (enough for 300 years of uptime), then the job's
# delay in whole seconds as one digit, then padding up to --body-size.
TIMESTAMP_DIGITS = 19
BODY_HEADER = TIMESTAMP_DIGITS + 1
# delayed-ms: the delay digit is MS_MARK and the delay follows as MS_DIGITS ms digits.
MS_MARK = ord("m")
MS_DIGITS = 5
PRIORITY = 1024
# TTR long enough that no job of a run ever times out and comes back.
TTR_S = 120
# reserve-with-timeout's timeout: short, so idle consumers notice the end of a run, long enough
# not to add a noticeable stream of TIMED_OUT round trips.
RESERVE_TIMEOUT_S = 1
# Each process keeps at most this many latency samples (reservoir sampling beyond that).
LATENCY_SAMPLES_PER_PROC = 200_000


@dataclass(frozen=True)
class LoadSpec:
    """One load, as given on the command line (totals over all generator processes)."""

    mode: str
    port: int
    host: str = "127.0.0.1"
    producer_port: int | None = None
    connections: int = 8
    in_flight: int = 1
    body_size: int = 100
    jobs: int = 100_000
    seconds: float | None = None
    warmup: float = 0.0
    time_limit: float = 60.0
    procs: int = 1
    tube: str = "bench"
    tubes: int = 1
    puts_per_use: int = 1
    # many-tubes: consumer connections (totals over all processes); 0: as many as producers
    consumers: int = 0
    rate: float = 1000.0
    max_delay: int = 2
    backlog: int = 0
    seed: int = 1
    batch: int = 1  # batch modes: jobs per put-many / reserve-many
    # Several servers (tubeq processes on one namespace): generator process i connects to
    # ports[i % len(ports)] instead of ``port``.
    ports: tuple[int, ...] = ()

    def share(self, total: int, index: int) -> int:
        """Process ``index``'s part of ``total`` (the first ones take the remainder)."""
        base, extra = divmod(total, self.procs)
        return base + (1 if index < extra else 0)

    def tube_of(self, index: int) -> str:
        return f"{self.tube}-{index}"

    def port_of(self, index: int) -> int:
        """The port generator process ``index`` connects to."""
        return self.ports[index % len(self.ports)] if self.ports else self.port

    def spread_tube(self, connection: int) -> str:
        """put and cycle with ``tubes`` > 1: the one tube of connection number ``connection``
        (counted over all processes)."""
        return f"{self.tube}.{connection % self.tubes}"


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending sequence (None when empty)."""
    if not sorted_values:
        return None
    rank = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[rank]


def latency_summary(samples: list[float]) -> dict[str, float | int | None]:
    """p50/p90/p99/max in milliseconds of latency samples given in seconds."""
    values = sorted(samples)

    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 4)

    return {"n": len(values), "p50_ms": ms(percentile(values, 0.50)),
            "p90_ms": ms(percentile(values, 0.90)), "p99_ms": ms(percentile(values, 0.99)),
            "max_ms": ms(values[-1] if values else None)}


# -- one generator process's run state --------------------------------------------------------

class RunState:
    """Counters shared by the connections of one generator process.

    ``window_start``/``window_end`` bound the measurement: a completion counts, and a latency is
    kept, only inside it. ``budget`` is how many jobs may still be sent.
    """

    def __init__(self, spec: LoadSpec, index: int, jobs: int) -> None:
        self.spec = spec
        self.index = index
        self.jobs = jobs
        self.budget = jobs
        self.completed = 0
        self.counted = 0
        self.puts_counted = 0  # INSERTED inside the window (the producers' side of a cycle)
        self.window_start = float("inf")
        self.window_end = float("inf")
        self.first_completion: float | None = None
        self.last_completion: float | None = None
        self.latencies: list[float] = []
        self.latencies_seen = 0
        self.later_latencies: list[float] = []  # delayed mode: jobs with a delay >= 1 s
        self.later_seen = 0
        self.errors = 0
        self.error_samples: list[str] = []
        self.lost = 0
        self.stopped = False
        self.stop_reason = ""
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rng = random.Random(spec.seed * 1000 + index)

    def take(self, wanted: int) -> int:
        """Reserve up to ``wanted`` jobs of the budget; returns how many may be sent."""
        if self.stopped:
            return 0
        granted = min(wanted, self.budget)
        self.budget -= granted
        return granted

    def complete(self, now: float) -> None:
        self.completed += 1
        if self.window_start <= now <= self.window_end:
            self.counted += 1
            if self.first_completion is None:
                self.first_completion = now
            self.last_completion = now
        if self.completed >= self.jobs:
            self.stop("jobs done")

    def in_window(self, now: float) -> bool:
        return self.window_start <= now <= self.window_end

    def record_latency(self, seconds: float, delayed: bool = False) -> None:
        self.latencies_seen = self._keep(self.latencies, self.latencies_seen, seconds)
        if delayed:
            self.later_seen = self._keep(self.later_latencies, self.later_seen, seconds)

    def _keep(self, samples: list[float], seen: int, value: float) -> int:
        if seen < LATENCY_SAMPLES_PER_PROC:
            samples.append(value)
        else:
            slot = self._rng.randrange(seen + 1)
            if slot < LATENCY_SAMPLES_PER_PROC:
                samples[slot] = value
        return seen + 1

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what)

    def stop(self, reason: str) -> None:
        if not self.stopped:
            self.stopped = True
            self.stop_reason = reason
            if not self.finished.done():
                self.finished.set_result(None)

    def rng(self) -> random.Random:
        return self._rng


# -- connections ----------------------------------------------------------------------------

def put_command(body_size: int, delay: int = 0, priority: int = PRIORITY) -> Callable[[], bytes]:
    """A function returning one timestamped put command (header + body + CRLF)."""
    header = b"put %d %d %d %d\r\n" % (priority, delay, TTR_S, body_size)
    tail = b"%d" % delay + b"x" * (body_size - BODY_HEADER) + b"\r\n"

    def make() -> bytes:
        return header + b"%019d" % time.monotonic_ns() + tail

    return make


def put_ms_command(body_size: int, delay_ms: int,
                   priority: int = PRIORITY) -> Callable[[], bytes]:
    """A function returning one timestamped put-with command with delay-ms (delayed-ms mode)."""
    assert body_size >= BODY_HEADER + MS_DIGITS and delay_ms < 10**MS_DIGITS
    header = b"put-with %d 0 %d %d delay-ms=%d\r\n" % (priority, TTR_S, body_size, delay_ms)
    tail = (b"m%0*d" % (MS_DIGITS, delay_ms) + b"x" * (body_size - BODY_HEADER - MS_DIGITS)
            + b"\r\n")

    def make() -> bytes:
        return header + b"%019d" % time.monotonic_ns() + tail

    return make


class BeanstalkConnection(asyncio.Protocol):
    """Reply parsing and batching shared by every role.

    Replies are parsed in a loop over the bytes of one read; whatever the role sends in answer
    is collected and written once per read. Before the load starts, ``request`` sends setup
    commands (use, watch, ignore) and waits for their reply lines.
    """

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._setup_replies: list[bytes] | None = None
        self._setup_expected = 0
        self._setup_done: asyncio.Future[list[bytes]] | None = None
        self._closing = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self._closing and not self.state.stopped:
            self.state.error(f"connection lost: {exc!r}")
            self.state.stop("connection lost")
        if self._setup_done is not None and not self._setup_done.done():
            self._setup_done.set_exception(ConnectionError("connection lost during setup"))

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        now = time.monotonic()
        out = self._out
        pos, size = 0, len(buffer)
        while pos < size:
            eol = buffer.find(b"\r\n", pos)
            if eol < 0:
                break
            if buffer.startswith(b"RESERVED ", pos):
                _, job_id, length = bytes(buffer[pos:eol]).split()
                body_end = eol + 2 + int(length)
                if body_end + 2 > size:
                    break
                self.on_reserved(job_id, bytes(buffer[eol + 2:body_end]), now, out)
                pos = body_end + 2
            else:
                line = bytes(buffer[pos:eol])
                pos = eol + 2
                if self._setup_replies is not None:
                    self._on_setup_reply(line)
                else:
                    self.on_line(line, now, out)
        if pos:
            del buffer[:pos]
        self.flush()

    def flush(self) -> None:
        out = self._out
        if out:
            if self.transport is not None and not self.state.stopped:
                self.transport.write(b"".join(out))
            out.clear()

    # setup phase
    async def watch_only(self, tubes: Sequence[bytes]) -> None:
        """Watch ``tubes`` and nothing else (``default`` is ignored unless among them)."""
        commands = [b"watch %s\r\n" % t for t in tubes]
        if b"default" not in tubes:
            commands.append(b"ignore default\r\n")
        check_setup(await self.request(commands), (b"WATCHING",))

    async def request(self, commands: Sequence[bytes]) -> list[bytes]:
        """Send ``commands`` in one write and return their reply lines."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._setup_replies, self._setup_expected = [], len(commands)
        self._setup_done = loop.create_future()
        self.transport.write(b"".join(commands))
        try:
            return await self._setup_done
        finally:
            self._setup_replies, self._setup_done = None, None

    def _on_setup_reply(self, line: bytes) -> None:
        assert self._setup_replies is not None and self._setup_done is not None
        self._setup_replies.append(line)
        if len(self._setup_replies) == self._setup_expected and not self._setup_done.done():
            self._setup_done.set_result(self._setup_replies)

    async def prepare(self) -> None:
        """Setup commands before the load (use/watch); none by default."""

    def begin(self) -> None:
        """Start sending load (the measurement clock is already running)."""

    def close(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    # role hooks
    def on_line(self, line: bytes, now: float, out: list[bytes]) -> None:
        self.state.error(f"unexpected reply {line[:60]!r}")

    def on_reserved(self, job_id: bytes, body: bytes, now: float, out: list[bytes]) -> None:
        self.state.error("unexpected RESERVED")


def check_setup(replies: list[bytes], expected_prefixes: tuple[bytes, ...]) -> None:
    for line in replies:
        if not line.startswith(expected_prefixes):
            raise RuntimeError(f"setup command answered {line[:80]!r}")


Role = tuple[BeanstalkConnection, int]  # a connection and the port it connects to
