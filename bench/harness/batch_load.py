"""The batch loads of bench.harness.loadgen: tubeq's put-many, reserve-many
and delete-many under load. tubeq only: beanstalkd has none of these commands.

Modes (``--batch B`` jobs per command):
  put-batch     N connections keep P put-many commands of B jobs in flight each; a job counts at
                its INSERTED; latency = the put-many round trip.
  reserve-batch each generator process first fills its tube with --jobs jobs (put-many, outside
                the clock), then N consumers keep P reserve-many B in flight each and answer
                every batch with one delete-many of its ids and the next reserve-many, in one
                write; a job counts at its DELETED; latency = put sent -> RESERVED received.
  cycle-batch   N put-many producers (P in flight) and N reserve-many consumers at once (the
                two above together, no pre-fill): the batched counterpart of cycle mode. Each
                consumer keeps ONE reserve-many in flight: when consumers outpace producers a
                reserve-many waits, and a delete-many sent behind it would be answered only
                after it (replies keep command order), stalling the count by up to the timeout.

Bodies carry loadgen's timestamp header, so latencies mean what they mean in the other modes.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence

from bench.harness.load_core import (
    BODY_HEADER,
    PRIORITY,
    RESERVE_TIMEOUT_S,
    TIMESTAMP_DIGITS,
    TTR_S,
    BeanstalkConnection,
    LoadSpec,
    Role,
    RunState,
    check_setup,
)

BATCH_MODES = ("put-batch", "reserve-batch", "cycle-batch")
# The pre-fill of reserve-batch: jobs per put-many and put-many commands in flight.
FILL_BATCH = 1000
FILL_IN_FLIGHT = 4


def _entry_maker(body_size: int) -> tuple[bytes, bytes]:
    """The fixed parts of one put-many entry: header line, and body tail after the timestamp."""
    header = b"%d 0 %d %d\r\n" % (PRIORITY, TTR_S, body_size)
    tail = b"0" + b"x" * (body_size - BODY_HEADER) + b"\r\n"
    return header, tail


class BatchProducer(BeanstalkConnection):
    """Keeps ``in_flight`` put-many commands of ``batch`` jobs outstanding; one more per
    completed batch. ``fill``: jobs to put before the load (reserve-batch), outside the clock."""

    def __init__(self, state: RunState, tube: str, in_flight: int, batch: int, body_size: int,
                 *, completes: bool, fill: int = 0) -> None:
        super().__init__(state)
        self.tube = tube.encode()
        self.in_flight = in_flight
        self.batch = batch
        self.completes = completes
        self.fill = fill
        self._header, self._tail = _entry_maker(body_size)
        self._sent: deque[tuple[float, int]] = deque()  # per put-many: sent at, jobs left
        self._filling: asyncio.Future[None] | None = None
        self._fill_left = 0
        self._fill_sent = 0

    def _put_many(self, count: int) -> bytes:
        header, tail = self._header, self._tail
        stamp = b"%019d" % time.monotonic_ns()
        return b"put-many %d\r\n" % count + (header + stamp + tail) * count

    async def prepare(self) -> None:
        replies = await self.request([b"use %s\r\n" % self.tube])
        check_setup(replies, (b"USING",))
        if self.fill:
            assert self.transport is not None
            self._filling = asyncio.get_running_loop().create_future()
            self._fill_left = self.fill
            self._send_fill()
            await self._filling
            self._filling = None

    def _send_fill(self) -> None:
        assert self.transport is not None
        while self._fill_sent < self.fill and len(self._sent) < FILL_IN_FLIGHT:
            count = min(FILL_BATCH, self.fill - self._fill_sent)
            self._fill_sent += count
            self._sent.append((0.0, count))
            self.transport.write(self._put_many(count))

    def begin(self) -> None:
        self._send(self.in_flight, time.monotonic(), self._out)
        self.flush()

    def _send(self, commands: int, now: float, out: list[bytes]) -> None:
        for _ in range(commands):
            count = self.state.take(self.batch)
            if not count:
                return
            out.append(self._put_many(count))
            self._sent.append((now, count))

    def on_line(self, line: bytes, now: float, out: list[bytes]) -> None:
        if line.startswith(b"BATCH"):
            return
        if not line.startswith(b"INSERTED"):
            self.state.error(f"put-many entry answered {line[:60]!r}")
        sent, left = self._sent[0]
        left -= 1
        if self._filling is not None:
            self._fill_left -= 1
            if left:
                self._sent[0] = (sent, left)
                return
            self._sent.popleft()
            if self._fill_left == 0:
                self._filling.set_result(None)
            else:
                self._send_fill()
            return
        state = self.state
        if state.in_window(now):
            state.puts_counted += 1
        if self.completes:
            state.complete(now)
        if left:
            self._sent[0] = (sent, left)
            return
        self._sent.popleft()
        if state.in_window(now) and self.completes:
            state.record_latency(now - sent)
        self._send(1, now, out)


class BatchConsumer(BeanstalkConnection):
    """Keeps ``in_flight`` reserve-many ``batch`` outstanding; each batch of jobs is answered
    with one delete-many of its ids and the next reserve-many, in one write."""

    def __init__(self, state: RunState, watch: Sequence[str], in_flight: int,
                 batch: int) -> None:
        super().__init__(state)
        self.watch = [t.encode() for t in watch]
        self.in_flight = in_flight
        self._reserve = b"reserve-many %d %d\r\n" % (batch, RESERVE_TIMEOUT_S)
        self._pending: deque[bytes] = deque()  # b"r" reserve-many, b"d" delete-many, in order
        self._expected = 0  # RESERVED frames of the batch being read
        self._ids: list[bytes] = []

    async def prepare(self) -> None:
        await self.watch_only(self.watch)

    def begin(self) -> None:
        self._out.extend([self._reserve] * self.in_flight)
        self._pending.extend([b"r"] * self.in_flight)
        self.flush()

    def on_reserved(self, job_id: bytes, body: bytes, now: float, out: list[bytes]) -> None:
        state = self.state
        if state.in_window(now):
            sent = int(body[:TIMESTAMP_DIGITS]) / 1e9
            state.record_latency(now - sent)
        self._ids.append(job_id)
        if len(self._ids) < self._expected:
            return
        out.append(b"delete-many %s\r\n" % b" ".join(self._ids))
        self._pending.append(b"d")
        self._ids = []
        if not state.stopped:
            out.append(self._reserve)
            self._pending.append(b"r")

    def on_line(self, line: bytes, now: float, out: list[bytes]) -> None:
        if line == b"DELETED":
            self.state.complete(now)
        elif line.startswith(b"BATCH"):
            if self._pending.popleft() == b"r":
                self._expected = int(line.split()[1])
        elif line in (b"TIMED_OUT", b"DEADLINE_SOON"):
            self._pending.popleft()
            if not self.state.stopped:
                out.append(self._reserve)
                self._pending.append(b"r")
        else:
            self.state.error(f"reserve-many/delete-many answered {line[:60]!r}")


def build_roles(spec: LoadSpec, index: int, state: RunState) -> list[Role]:
    """The connections of generator process ``index`` for a batch mode."""
    conns = spec.share(spec.connections, index)
    tube = spec.tube_of(index)
    port = spec.port
    if spec.mode == "put-batch":
        return [(BatchProducer(state, tube, spec.in_flight, spec.batch, spec.body_size,
                               completes=True), port) for _ in range(conns)]
    # reserve-batch never waits (its tube is full); cycle-batch keeps one in flight (above).
    reserves = spec.in_flight if spec.mode == "reserve-batch" else 1
    consumers: list[Role] = [(BatchConsumer(state, [tube], reserves, spec.batch), port)
                             for _ in range(conns)]
    if spec.mode == "reserve-batch":
        filler = BatchProducer(state, tube, 0, spec.batch, spec.body_size, completes=False,
                               fill=spec.share(spec.jobs, index))
        return [(filler, port), *consumers]
    if spec.mode == "cycle-batch":
        producers: list[Role] = [(BatchProducer(state, tube, spec.in_flight, spec.batch,
                                                spec.body_size, completes=False), port)
                                 for _ in range(conns)]
        return [*producers, *consumers]
    raise ValueError(f"not a batch mode: {spec.mode!r}")
