"""Load that counts every job: producers put uniquely numbered jobs, consumers reserve and delete
them, and a :class:`Ledger` records what each side was told, so that after the faults a test can
prove that no acknowledged job vanished and that every duplicate had a cause.

The clients speak the raw protocol over asyncio streams: each call is bounded, and any transport
error or timeout makes the client drop its connection and open a new one, to the next address
in its list (several tubeq processes can serve one queue). What the ledger trusts:

* a number is *inserted* only when its put got ``INSERTED``; a put answered otherwise, or not
  at all, is *unacknowledged*: it may or may not exist, and is never put again;
* a delivery (``RESERVED``) whose delete did not get ``DELETED`` is a *lost hold*: the holder
  (its connection, its tubeq, its Redis) failed while it held the job, and the job may come
  again. That is the only allowed cause of a duplicate (at-least-once delivery);
* the job id of an ``INSERTED`` reply is never given out again: the id counter moved in the
  same acknowledged change. An id that comes back means the store went back to a state from
  before that acknowledgement (e.g. a master replaced by an emptier copy): the jobs of that
  state are gone, and so is each connection's watch list, so later jobs may sit undelivered
  on the master and count as lost although they are there.

At the end: lost = inserted numbers never delivered = 0; unexplained duplicates (a number
delivered more often than its lost holds allow) = 0; resurrected (a delivery after that
number's delete was acknowledged) = 0; reissued ids = 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

REPLY_S = 15.0  # bound on one reply; a server or Redis that is down answers at once or drops
RETRY_S = 0.05  # pause before reconnecting or after an INTERNAL_ERROR
TTR_S = 2  # short: a job held by a dead tubeq comes back within seconds
DRAIN_S = 45.0  # bound on the wait for every inserted job to be delivered at the end
BODY_PAD = b"-" * 32

# Accounting lines of every fault test of the run, printed at the end of the session
# (tests/faults/conftest.py), so `make test` shows them even though pytest captures output.
REPORTS: list[str] = []

_DROPPED = (OSError, asyncio.IncompleteReadError, TimeoutError, ConnectionError)
_WITH_DATA = (b"RESERVED", b"OK", b"FOUND")


class Wire:
    """One raw-protocol connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, address: tuple[str, int]) -> Wire:
        async with asyncio.timeout(REPLY_S):
            reader, writer = await asyncio.open_connection(*address)
        return cls(reader, writer)

    async def call(self, line: bytes, body: bytes | None = None) -> tuple[bytes, bytes | None]:
        """Send a command (and a put's body); its reply line and data."""
        self.writer.write(line + b"\r\n" + (body + b"\r\n" if body is not None else b""))
        async with asyncio.timeout(REPLY_S):
            head = (await self.reader.readuntil(b"\r\n"))[:-2]
            data = None
            if head.split(b" ", 1)[0] in _WITH_DATA:
                size = int(head.rsplit(b" ", 1)[1])
                data = (await self.reader.readexactly(size + 2))[:-2]
        return head, data

    def close(self) -> None:
        self.writer.transport.abort()


@dataclass
class Ledger:
    name: str
    attempted: int = 0
    inserted: set[int] = field(default_factory=set)
    unacknowledged: set[int] = field(default_factory=set)
    deliveries: Counter[int] = field(default_factory=Counter)
    deleted: set[int] = field(default_factory=set)
    lost_holds: Counter[int] = field(default_factory=Counter)
    resurrected: int = 0
    ids: dict[int, int] = field(default_factory=dict)  # job id of each INSERTED: its number
    reissued: list[int] = field(default_factory=list)  # numbers whose id was given out before
    foreign: int = 0  # bodies that are not ours
    inserted_after_fault: int = 0
    faults: list[str] = field(default_factory=list)

    def fault(self, what: str) -> None:
        self.faults.append(what)
        self.inserted_after_fault = 0

    def acknowledged(self, number: int, job_id: int) -> None:
        """``number`` got ``INSERTED job_id``."""
        self.inserted.add(number)
        self.inserted_after_fault += 1
        if job_id in self.ids:
            self.reissued.append(number)
        else:
            self.ids[job_id] = number

    def delivered(self, number: int) -> None:
        if number in self.deleted:
            self.resurrected += 1
        self.deliveries[number] += 1

    @property
    def lost(self) -> set[int]:
        return self.inserted - set(self.deliveries)

    @property
    def duplicated(self) -> int:
        return sum(count - 1 for count in self.deliveries.values())

    @property
    def unexplained_duplicates(self) -> int:
        return sum(max(0, count - 1 - self.lost_holds[number])
                   for number, count in self.deliveries.items())

    def report(self) -> str:
        unacked_delivered = len(self.unacknowledged & set(self.deliveries))
        line = (f"[{self.name}] faults: {', '.join(self.faults) or 'none'} | put {self.attempted}"
                f", inserted {len(self.inserted)}, unacknowledged {len(self.unacknowledged)} "
                f"(of which delivered {unacked_delivered}), delivered {len(self.deliveries)} "
                f"jobs in {sum(self.deliveries.values())} deliveries, duplicated "
                f"{self.duplicated} (lost holds {sum(self.lost_holds.values())}, unexplained "
                f"{self.unexplained_duplicates}), resurrected {self.resurrected}, "
                f"lost {len(self.lost)}, reissued ids {len(self.reissued)}")
        return line

    def check(self) -> None:
        """Print the accounting and assert it (the test's verdict)."""
        line = self.report()
        print(line)
        REPORTS.append(line)
        assert self.inserted, f"nothing was inserted: {line}"
        # First: once acknowledged state went back in time, "lost" counts its aftermath too.
        assert not self.reissued, (
            f"the job ids of numbers {self.reissued[:5]}... had already been INSERTED: the "
            f"store lost acknowledged state: {line}")
        assert not self.lost, f"lost {sorted(self.lost)[:20]}: {line}"
        assert self.unexplained_duplicates == 0, line
        assert self.resurrected == 0, line
        assert self.foreign == 0, line


class Load:
    """Producers and consumers on one tube, over ``addresses()`` (called at every connect, so a
    test can move them)."""

    def __init__(self, ledger: Ledger, addresses: Callable[[], list[tuple[str, int]]],
                 tube: str, *, producers: int = 2, consumers: int = 2,
                 max_jobs: int = 5000, put_pause_s: float = 0.002) -> None:
        self.ledger = ledger
        self.addresses = addresses
        self.tube = tube.encode()
        self.producers = producers
        self.consumers = consumers
        self.max_jobs = max_jobs
        self.put_pause_s = put_pause_s
        self._numbers: Iterator[int] = itertools.count(1)
        self._stop_producing = asyncio.Event()
        self._stop_consuming = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._producer(i)) for i in range(self.producers)]
        self._tasks += [asyncio.create_task(self._consumer(i)) for i in range(self.consumers)]

    async def run_for(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def finish(self) -> None:
        """Stop putting, let the consumers take every inserted job (bounded), stop them."""
        self._stop_producing.set()
        await asyncio.gather(*self._tasks[:self.producers])
        deadline = time.monotonic() + DRAIN_S
        while self.ledger.lost and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        # Unacknowledged puts that did happen are still being delivered: wait for the tube
        # to empty too (same bound), so every job that exists is counted.
        while time.monotonic() < deadline and not await self._tube_empty():
            await asyncio.sleep(0.1)
        self._stop_consuming.set()
        await asyncio.gather(*self._tasks[self.producers:])

    async def _tube_empty(self) -> bool:
        for address in self.addresses():
            try:
                wire = await Wire.open(address)
            except _DROPPED:
                continue
            try:
                head, data = await wire.call(b"stats-tube " + self.tube)
            except _DROPPED:
                continue
            finally:
                wire.close()
            if head == b"NOT_FOUND":
                return True
            if data is None:
                continue
            counts = dict(line.split(b": ", 1) for line in data.splitlines()[1:]
                          if b": " in line)
            return all(counts.get(b"current-jobs-" + state) == b"0"
                       for state in (b"ready", b"reserved", b"delayed", b"buried"))
        return False

    async def _connect(self, index: int, setup: list[bytes]) -> Wire | None:
        addresses = self.addresses()
        for address in addresses[index % len(addresses):] + addresses[:index % len(addresses)]:
            try:
                wire = await Wire.open(address)
                for line in setup:
                    head, _ = await wire.call(line)
                    if head.startswith(b"INTERNAL_ERROR"):
                        raise ConnectionError(head.decode())
                return wire
            except _DROPPED:
                continue
        await asyncio.sleep(RETRY_S)
        return None

    async def _producer(self, index: int) -> None:
        wire: Wire | None = None
        while not self._stop_producing.is_set():
            if wire is None:
                wire = await self._connect(index, [b"use " + self.tube])
                continue
            number = next(self._numbers)
            if number > self.max_jobs:
                break
            body = b"%d" % number + BODY_PAD
            self.ledger.attempted += 1
            try:
                head, _ = await wire.call(b"put 0 0 %d %d" % (TTR_S, len(body)), body)
            except _DROPPED:
                self.ledger.unacknowledged.add(number)
                wire.close()
                wire = None
                continue
            if head.startswith(b"INSERTED "):
                self.ledger.acknowledged(number, int(head.split()[1]))
                await asyncio.sleep(self.put_pause_s)
            else:  # INTERNAL_ERROR, DRAINING: not stored, or not confirmed
                self.ledger.unacknowledged.add(number)
                await asyncio.sleep(RETRY_S)
        if wire is not None:
            wire.close()

    async def _consumer(self, index: int) -> None:
        wire: Wire | None = None
        setup = [b"watch " + self.tube, b"ignore default"]
        while not self._stop_consuming.is_set():
            if wire is None:
                wire = await self._connect(index + 1, setup)
                continue
            try:
                head, data = await wire.call(b"reserve-with-timeout 1")
            except _DROPPED:
                wire.close()
                wire = None
                continue
            if not head.startswith(b"RESERVED "):
                if head == b"INTERNAL_ERROR":
                    await asyncio.sleep(RETRY_S)
                continue
            job_id = head.split()[1]
            assert data is not None
            number_text = data.removesuffix(BODY_PAD)
            if not number_text.isdigit():
                self.ledger.foreign += 1
                continue
            number = int(number_text)
            self.ledger.delivered(number)
            try:
                head, _ = await wire.call(b"delete " + job_id)
            except _DROPPED:
                self.ledger.lost_holds[number] += 1
                wire.close()
                wire = None
                continue
            if head == b"DELETED":
                self.ledger.deleted.add(number)
            else:
                self.ledger.lost_holds[number] += 1
        if wire is not None:
            with contextlib.suppress(*_DROPPED):
                wire.close()
