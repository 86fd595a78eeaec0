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

Connections that outlive a fault must keep working, not only fresh ones: the load's clients
reconnect on every error, so alone they would not notice a process that forgot a connection's
watch list (issue 19: a process whose heartbeats stopped reaching Redis for REAP_AFTER_MS was
reaped although alive, and its connections watched nothing from then on). So a test also opens
*idle connections* (:meth:`Load.open_idle`) before its faults: each watches the load's tube (or
a tube of the test's choosing, e.g. in another shard) and its idle tube (``<tube>/idle``, same
shard), ignores ``default``, and then says nothing until :meth:`Load.verify`, which

* probes them: puts as many marked jobs into each idle tube as there are idle connections on
  it, and has each reserve once with a bound (``reserve-with-timeout``, SERVED_WITHIN_S). Each
  takes at most one job and nobody else watches an idle tube, so while one waits its tube has a
  ready job: a ``TIMED_OUT`` (or a dropped connection) counts it as *starved*;
* checks the server's bookkeeping: every tube's ``current-watching`` (stats-tube) must equal the
  connections the test holds on it (the load's connected consumers and producers, the idle
  connections; the checking connection watches a tube of its own), polled until equal within
  WATCHING_S (WATCHING_AFTER_KILL_S where a process was killed: its watches go when it is
  reaped, seconds later). The difference of the last poll is *watchers lost* (expected minus
  seen, where short) and *extra watchers*.

At the end: lost = inserted numbers never delivered = 0; unexplained duplicates (a number
delivered more often than its lost holds allow) = 0; resurrected (a delivery after that
number's delete was acknowledged) = 0; reissued ids = 0; watchers lost = extra watchers = 0;
starved = 0, and at least one idle connection was probed and one watching check made.
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
# An idle connection's probe: reserve-with-timeout's bound while its tube has a ready job. The
# server answers at once when it finds the job; the bound only decides when "never" is called.
SERVED_WITHIN_S = 5
PROBE_S = 30.0  # bound on a probe's retries of INTERNAL_ERROR (a Redis still reconnecting)
# Bound on the wait for current-watching to match: a closed connection's watches go within
# milliseconds. A killed process's go when another reaps it, within REAP_AFTER_MS and a
# heartbeat of its last heartbeat (tubeq.server.scheduler): a test that kills one waits longer.
WATCHING_S = 6.0
WATCHING_AFTER_KILL_S = 15.0
POLL_S = 0.25
MARK = b"idle-probe"  # body of the idle tube's marked jobs; never a load number

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
class IdleConnection:
    """A connection opened before the faults that never reconnects (see the module header)."""

    wire: Wire
    address: tuple[str, int]
    tube: bytes  # it watches this and its idle tube, <tube>/idle
    label: str
    gone: bool = False  # its process was killed (the test says so) or it was dropped


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
    idle_probed: set[str] = field(default_factory=set)  # labels of idle connections probed
    starved: dict[str, str] = field(default_factory=dict)  # label: what it got instead
    watching_checks: int = 0
    watchers_lost: int = 0  # worst of the checks: expected minus current-watching, where short
    extra_watchers: int = 0  # worst of the checks: current-watching minus expected, where over
    watching_mismatches: list[str] = field(default_factory=list)

    def watching(self, expected: dict[str, int], seen: dict[str, int], when: str) -> None:
        """A watching check's last poll: ``current-watching`` per tube against ``expected``."""
        self.watching_checks += 1
        lost = sum(max(0, count - seen.get(tube, 0)) for tube, count in expected.items())
        extra = sum(max(0, seen.get(tube, 0) - count) for tube, count in expected.items())
        self.watchers_lost = max(self.watchers_lost, lost)
        self.extra_watchers = max(self.extra_watchers, extra)
        self.watching_mismatches += [
            f"{when}: {tube} current-watching {seen.get(tube, 0)}, expected {count}"
            for tube, count in expected.items() if seen.get(tube, 0) != count]

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
        if self.watching_checks:
            line += (f", watchers lost {self.watchers_lost} (extra {self.extra_watchers}, "
                     f"{self.watching_checks} checks)")
        else:
            line += ", watchers not checked"
        line += f", starved {len(self.starved)} of {len(self.idle_probed)} idle"
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
        assert not self.starved, (
            f"connections opened before the faults got no job while their tube had ready ones: "
            f"{self.starved}; watching: {self.watching_mismatches[:8]}: {line}")
        assert self.idle_probed, f"no idle connection was probed: {line}"
        assert self.watching_checks, f"current-watching was not checked: {line}"
        assert self.watchers_lost == 0 and self.extra_watchers == 0, (
            f"{self.watching_mismatches[:8]}: {line}")


def _idle_tube(tube: bytes) -> bytes:
    """Where the probes of idle connections watching ``tube`` put their marked jobs: in the
    same group, so the same shard (tubeq.store.shards)."""
    return tube.split(b"/", 1)[0] + b"/idle"


class Load:
    """Producers and consumers on one tube, over ``addresses()`` (called at every connect, so a
    test can move them), and the idle connections a test opens beside them."""

    def __init__(self, ledger: Ledger, addresses: Callable[[], list[tuple[str, int]]],
                 tube: str, *, producers: int = 2, consumers: int = 2,
                 max_jobs: int = 5000, put_pause_s: float = 0.002) -> None:
        self.ledger = ledger
        self.addresses = addresses
        self.tube = tube.encode()
        self.idle: list[IdleConnection] = []
        self._connected_producers: set[int] = set()
        self._connected_consumers: set[int] = set()
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
        """Stop putting, let the consumers take every inserted job (bounded), :meth:`verify`
        (if there are idle connections), stop the consumers, close the idle connections."""
        self._stop_producing.set()
        await asyncio.gather(*self._tasks[:self.producers])
        deadline = time.monotonic() + DRAIN_S
        while self.ledger.lost and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        # Unacknowledged puts that did happen are still being delivered: wait for the tube
        # to empty too (same bound), so every job that exists is counted.
        while time.monotonic() < deadline and not await self._tube_empty():
            await asyncio.sleep(0.1)
        if self.idle:
            await self.verify("at the end")
        self._stop_consuming.set()
        await asyncio.gather(*self._tasks[self.producers:])
        for idle in self.idle:
            idle.wire.close()

    async def open_idle(self, address: tuple[str, int], tube: str | None = None) -> None:
        """Open an idle connection to ``address`` watching ``tube`` (default: the load's) and
        its idle tube (see the module header); it stays open, silent, until a probe or
        :meth:`finish`."""
        watched = tube.encode() if tube is not None else self.tube
        wire = await Wire.open(address)
        for line in (b"watch " + watched, b"watch " + _idle_tube(watched), b"ignore default"):
            head, _ = await wire.call(line)
            assert head.startswith(b"WATCHING "), (line, head)
        label = f"idle-{len(self.idle)}@{address[1]}" + (f"/{tube}" if tube is not None else "")
        self.idle.append(IdleConnection(wire, address, watched, label))

    def idle_gone(self, address: tuple[str, int]) -> None:
        """The process at ``address`` was killed: its idle connections went with it."""
        for idle in self.idle:
            if idle.address == address:
                idle.gone = True
                idle.wire.close()

    async def verify(self, when: str = "", watching_s: float = WATCHING_S) -> None:
        """Probe every idle connection still there, then check every tube's watchers (see
        the module header), waiting up to ``watching_s`` for them to match; the ledger records
        both, as of ``when`` (default: after the last fault).

        The probe waits for the watchers to match first (same bound, not recorded): a
        process that repairs its state after a fault may take a heartbeat to do it, and a
        reserve that began to wait before the repair is not woken by it. The recorded check
        comes after the probe, whose own connections it waits out: closed just before a
        test's next fault, tubeq could fail to write their close to Redis.
        """
        when = when or f"after {self.ledger.faults[-1] if self.ledger.faults else 'no fault'}"
        await self.check_watching(when, watching_s, record=False)
        await self.probe_idle(when)
        await self.check_watching(when, watching_s)

    async def probe_idle(self, when: str) -> None:
        live = [idle for idle in self.idle if not idle.gone]
        assert live, "no idle connection left to probe"
        on = Counter(_idle_tube(idle.tube) for idle in live)
        for idle_tube, count in on.items():
            await self._put_marks(idle_tube, count)
        await asyncio.gather(*(self._probe(idle, when) for idle in live))
        for idle_tube, count in on.items():
            await self._clear_marks(idle_tube, count)

    async def _helper(self, setup: list[bytes]) -> Wire:
        deadline = time.monotonic() + PROBE_S
        while time.monotonic() < deadline:
            wire = await self._connect(0, setup)
            if wire is not None:
                return wire
        raise AssertionError(f"no tubeq at {self.addresses()} answered within {PROBE_S:g} s")

    async def _put_marks(self, idle_tube: bytes, count: int) -> None:
        wire = await self._helper([b"use " + idle_tube])
        deadline = time.monotonic() + PROBE_S
        try:
            while count and time.monotonic() < deadline:
                try:
                    head, _ = await wire.call(b"put 0 0 60 %d" % len(MARK), MARK)
                except _DROPPED:
                    wire.close()
                    wire = await self._helper([b"use " + idle_tube])
                    continue
                if head.startswith(b"INSERTED "):
                    count -= 1
                else:
                    await asyncio.sleep(RETRY_S)
        finally:
            wire.close()
        assert count == 0, f"could not put the idle probes' jobs within {PROBE_S:g} s"

    async def _clear_marks(self, idle_tube: bytes, count: int) -> None:
        """Delete the marked jobs no idle connection took (each was put for one)."""
        wire = await self._helper([b"watch " + idle_tube, b"ignore default"])
        try:
            for _ in range(count):
                head, _ = await wire.call(b"reserve-with-timeout 0")
                if not head.startswith(b"RESERVED "):
                    break
                await wire.call(b"delete " + head.split()[1])
        except _DROPPED:
            pass  # left over: harmless, the next probe puts as many as it needs
        finally:
            wire.close()

    async def _probe(self, idle: IdleConnection, when: str) -> None:
        """One reserve on ``idle`` while its tubes have a ready job: served or starved."""
        self.ledger.idle_probed.add(idle.label)
        deadline = time.monotonic() + PROBE_S
        while True:
            try:
                head, data = await idle.wire.call(b"reserve-with-timeout %d" % SERVED_WITHIN_S)
            except _DROPPED:
                self.ledger.starved.setdefault(idle.label, f"its connection was dropped ({when})")
                idle.gone = True
                idle.wire.close()
                return
            if head.startswith(b"RESERVED "):
                break
            # DEADLINE_SOON: it still holds a job whose delete failed; that job's TTR ends soon.
            if head in (b"INTERNAL_ERROR", b"DEADLINE_SOON") and time.monotonic() < deadline:
                await asyncio.sleep(RETRY_S)
                continue
            self.ledger.starved.setdefault(idle.label, f"{head.decode(errors='replace')} ({when})")
            return
        assert data is not None
        await self._delete(idle.wire, head.split()[1], data)

    async def _delete(self, wire: Wire, job_id: bytes, body: bytes) -> bool:
        """Account for a delivery of ``body`` (a load number, or an idle probe's mark) and
        delete it; False if the connection dropped."""
        number_text = body.removesuffix(BODY_PAD)
        number: int | None = None
        if number_text.isdigit():
            number = int(number_text)
            self.ledger.delivered(number)
        elif body != MARK:
            self.ledger.foreign += 1
        try:
            head, _ = await wire.call(b"delete " + job_id)
        except _DROPPED:
            if number is not None:
                self.ledger.lost_holds[number] += 1
            return False
        if number is not None:
            if head == b"DELETED":
                self.ledger.deleted.add(number)
            else:
                self.ledger.lost_holds[number] += 1
        return True

    def _expected_watching(self) -> dict[str, int]:
        """What current-watching must say per tube, by the connections this test holds."""
        expected = Counter({self.tube: len(self._connected_consumers),
                            b"default": len(self._connected_producers)})
        for idle in self.idle:
            if not idle.gone:
                expected[idle.tube] += 1
                expected[_idle_tube(idle.tube)] += 1
        return {tube.decode(): count for tube, count in expected.items()}

    async def check_watching(self, when: str, watching_s: float, *,
                             record: bool = True) -> None:
        """Poll stats-tube until each tube's current-watching is as expected, within
        ``watching_s``; record the last poll in the ledger (if ``record``)."""
        deadline = time.monotonic() + watching_s
        while True:
            expected = self._expected_watching()
            seen = await self._current_watching(list(expected))
            if seen is not None and (seen == expected or time.monotonic() > deadline):
                break
            if time.monotonic() > deadline + PROBE_S:
                raise AssertionError(f"no tubeq at {self.addresses()} answered stats-tube")
            await asyncio.sleep(POLL_S)
        if record:
            self.ledger.watching(expected, seen, when)

    async def _current_watching(self, tubes: list[str]) -> dict[str, int] | None:
        # Not on `default`: a test may fault Redis right after a check, and tubeq keeps
        # counting a connection whose close it could not write to Redis.
        wire = await self._connect(0, [b"watch " + self.tube + b"/check", b"ignore default"])
        if wire is None:
            return None
        seen: dict[str, int] = {}
        try:
            for tube in tubes:
                head, data = await wire.call(b"stats-tube " + tube.encode())
                if head == b"NOT_FOUND":
                    seen[tube] = 0
                    continue
                if data is None:
                    return None
                counts = dict(line.split(b": ", 1) for line in data.splitlines()[1:]
                              if b": " in line)
                seen[tube] = int(counts[b"current-watching"])
        except _DROPPED:
            return None
        finally:
            wire.close()
        return seen

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
            except _DROPPED:
                continue
            try:
                for line in setup:
                    head, _ = await wire.call(line)
                    if head.startswith(b"INTERNAL_ERROR"):
                        raise ConnectionError(head.decode())
                return wire
            except _DROPPED:
                wire.close()  # else it stays open, counted as watching by the server
                continue
        await asyncio.sleep(RETRY_S)
        return None

    async def _producer(self, index: int) -> None:
        wire: Wire | None = None
        while not self._stop_producing.is_set():
            if wire is None:
                wire = await self._connect(index, [b"use " + self.tube])
                if wire is not None:
                    self._connected_producers.add(index)
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
                self._connected_producers.discard(index)
                wire.close()
                wire = None
                continue
            if head.startswith(b"INSERTED "):
                self.ledger.acknowledged(number, int(head.split()[1]))
                await asyncio.sleep(self.put_pause_s)
            else:  # INTERNAL_ERROR, DRAINING: not stored, or not confirmed
                self.ledger.unacknowledged.add(number)
                await asyncio.sleep(RETRY_S)
        self._connected_producers.discard(index)
        if wire is not None:
            wire.close()

    async def _consumer(self, index: int) -> None:
        wire: Wire | None = None
        setup = [b"watch " + self.tube, b"ignore default"]
        while not self._stop_consuming.is_set():
            if wire is None:
                wire = await self._connect(index + 1, setup)
                if wire is not None:
                    self._connected_consumers.add(index)
                continue
            try:
                head, data = await wire.call(b"reserve-with-timeout 1")
            except _DROPPED:
                head, data = b"", None
            if head.startswith(b"RESERVED "):
                assert data is not None
                if await self._delete(wire, head.split()[1], data):
                    continue
            elif head:
                if head == b"INTERNAL_ERROR":
                    await asyncio.sleep(RETRY_S)
                continue
            self._connected_consumers.discard(index)
            wire.close()
            wire = None
        self._connected_consumers.discard(index)
        if wire is not None:
            with contextlib.suppress(*_DROPPED):
                wire.close()
