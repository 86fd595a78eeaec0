"""What every peer driver shares: its settings, the job tally, and the result it writes.

Owns: the contract between the orchestrator (bench/peers/run.py) and a driver process. A
driver is told its role (``produce`` or ``consume``) and sizes on the command line, and writes
one JSON object to ``--out``. Times are ``time.monotonic()`` (CLOCK_MONOTONIC, the same clock
in every process of the machine), so the orchestrator can line them up with its CPU samples.
CPU is the driver's own ``time.process_time()`` (every thread of the process).

Standard library only: this module is imported inside every system's virtualenv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.peers.call_common import CallSettings

# The queue or tube every system uses.
QUEUE = "peers"
# After the last handler returned, how often and how long a consumer looks for its queue to be
# empty (acknowledgements still travelling, jobs still marked active).
EMPTY_POLL_S = 0.005
EMPTY_WAIT_S = 10.0


@dataclass(frozen=True)
class Settings:
    """One driver run, as the orchestrator asked for it."""

    role: str  # "produce" or "consume"
    url: str  # redis://127.0.0.1:PORT/0, or beanstalk://127.0.0.1:PORT
    single: int  # jobs enqueued one at a time, each awaited, before the batched ones
    batched: int  # jobs enqueued with the batch API (or n/a: see the driver)
    chunk: int  # jobs per batch call
    concurrency: int  # the worker's concurrency
    time_limit_s: float  # the driver gives up after this long
    out: Path

    @property
    def total(self) -> int:
        return self.single + self.batched

    @property
    def deadline(self) -> float:
        return time.monotonic() + self.time_limit_s

    @classmethod
    def parse(cls, argv: list[str]) -> tuple[str, Settings]:
        p = argparse.ArgumentParser(prog="python -m bench.peers.driver")
        p.add_argument("system")
        p.add_argument("role", choices=("produce", "consume"))
        p.add_argument("--url", required=True)
        p.add_argument("--single", type=int, required=True)
        p.add_argument("--batched", type=int, required=True)
        p.add_argument("--chunk", type=int, default=1000)
        p.add_argument("--concurrency", type=int, default=32)
        p.add_argument("--time-limit", type=float, required=True)
        p.add_argument("--out", type=Path, required=True)
        a = p.parse_args(argv)
        return a.system, cls(a.role, a.url, a.single, a.batched, a.chunk, a.concurrency,
                             a.time_limit, a.out)


def chunks(total: int, size: int) -> list[int]:
    """The sizes of the batches that enqueue ``total`` jobs ``size`` at a time."""
    return [min(size, total - start) for start in range(0, total, size)]


class Phase:
    """The wall time and own CPU of one enqueue phase: ``with Phase(jobs, api) as phase:``."""

    def __init__(self, jobs: int, api: str) -> None:
        self.jobs, self.api = jobs, api
        self.result: dict[str, Any] = {}

    def __enter__(self) -> Phase:
        self.t0, self.cpu0 = time.monotonic(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        t1, cpu1 = time.monotonic(), time.process_time()
        self.result = {"jobs": self.jobs, "api": self.api, "t0": self.t0, "t1": t1,
                       "seconds": t1 - self.t0, "cpu_s": cpu1 - self.cpu0}


class Tally:
    """Handler calls of a consumer, from any thread: the first start, and the instant the
    ``target``-th call returned (``finished`` is set then)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.first_start: float | None = None
        self.cpu_at_first: float | None = None
        self.last_done: float | None = None
        self.cpu_at_last: float | None = None
        self.finished = threading.Event()
        self.notify: Callable[[], None] | None = None  # called (in the handler's thread) then
        self._lock = threading.Lock()

    def start(self) -> None:
        if self.first_start is None:
            with self._lock:
                if self.first_start is None:
                    self.cpu_at_first = time.process_time()
                    self.first_start = time.monotonic()

    def done(self) -> None:
        with self._lock:
            self.count += 1
            if self.count == self.target:
                self.last_done = time.monotonic()
                self.cpu_at_last = time.process_time()
                self.finished.set()
                if self.notify is not None:
                    self.notify()

    def result(self, empty_at: float | None, remaining: dict[str, int]) -> dict[str, Any]:
        cpu = None
        if self.cpu_at_first is not None and self.cpu_at_last is not None:
            cpu = self.cpu_at_last - self.cpu_at_first
        return {"jobs": self.count, "target": self.target, "first_start": self.first_start,
                "last_done": self.last_done, "cpu_s": cpu, "empty_at": empty_at,
                "remaining": remaining}


def write(settings: Settings | CallSettings, result: dict[str, Any]) -> None:
    settings.out.write_text(json.dumps(result))


def wait_empty_sync(remaining: Any, deadline: float) -> tuple[float | None, dict[str, int]]:
    """Poll ``remaining()`` (a dict of counts that are all 0 once the queue is empty) until it
    is, or until ``deadline``; returns (the instant it was seen empty, the last counts)."""
    counts: dict[str, int] = remaining()
    while any(counts.values()) and time.monotonic() < deadline:
        time.sleep(EMPTY_POLL_S)
        counts = remaining()
    return (None if any(counts.values()) else time.monotonic()), counts


async def wait_empty_async(remaining: Any, deadline: float) -> tuple[float | None, dict[str, int]]:
    """:func:`wait_empty_sync` for an async ``remaining()``."""
    counts: dict[str, int] = await remaining()
    while any(counts.values()) and time.monotonic() < deadline:
        await asyncio.sleep(EMPTY_POLL_S)
        counts = await remaining()
    return (None if any(counts.values()) else time.monotonic()), counts


async def finished_async(tally: Tally, worker: asyncio.Future[Any], deadline: float) -> None:
    """Wait until ``tally`` is finished, the ``worker`` task ends (its error is raised), or
    ``deadline``; an asyncio driver's handler runs on the loop, so ``notify`` sets an Event."""
    event = asyncio.Event()
    tally.notify = event.set
    if tally.finished.is_set():
        return
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter, worker}, timeout=max(0.0, deadline - time.monotonic()),
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if worker.done() and not tally.finished.is_set():
        worker.result()
        raise RuntimeError("the worker stopped before every job was processed")


async def in_flight(jobs: int, limit: int, enqueue: Callable[[], Awaitable[object]]) -> None:
    """Call ``enqueue()`` ``jobs`` times with at most ``limit`` calls awaiting at once: the
    batched phase of an async client that has no batch API."""
    gate = asyncio.Semaphore(limit)

    async def one() -> None:
        async with gate:
            await enqueue()

    await asyncio.gather(*(one() for _ in range(jobs)))
