"""What every request/reply ("call") driver shares: its settings, the payloads, and the phases.

Owns: the contract between the call orchestrator (bench/peers/call.py) and a driver process in
the roles ``serve`` (the worker: an echo that answers each request with its payload
upper-cased, until killed by PID or its time limit) and ``call`` (the callers: a warm-up, then
the ``single`` phase, one caller awaiting each call before the next, then the ``parallel``
phase, ``callers`` callers at once). A phase ends when its count is done or its time is up,
whichever comes first; the calls then still out are awaited (each has its own timeout) and
counted. Each call's latency is taken around the system's whole call (request sent to answer in
hand, with whatever the caller must do before its next call) and checked against the expected
answer. Times are ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for every process of the
machine), so the orchestrator can line the phases up with its CPU samples.

Standard library only: this module is imported inside every system's virtualenv.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The queue or tube the requests go to.
CALL_QUEUE = "calls"
# How long one call waits for its answer before it counts as an error. Generous: the warm-up's
# first calls wait for the worker process to start.
CALL_TIMEOUT_S = 30
# A phase stops early after this many failed calls (a broken system is reported, not waited for).
MAX_ERRORS = 20

Answer = bytes | str
CallFn = Callable[[int, str], Awaitable[Answer]]
SyncCallFn = Callable[[int, str], Answer]


@dataclass(frozen=True)
class CallSettings:
    """One call driver run, as the orchestrator asked for it."""

    role: str  # "serve", "call" or "call_apart" (each caller a client of its own)
    url: str  # redis://127.0.0.1:PORT/0, or beanstalk://127.0.0.1:PORT
    single: int  # calls of the one-caller phase
    parallel: int  # calls of the many-callers phase
    callers: int  # callers at once in the parallel phase (and the warm-up)
    concurrency: int  # the worker's concurrency
    warmup: int  # calls before the measured phases, not measured
    phase_limit_s: float  # a phase starts no call after this long
    time_limit_s: float  # the driver process gives up after this long
    out: Path

    @property
    def deadline(self) -> float:
        return time.monotonic() + self.time_limit_s

    @classmethod
    def parse(cls, argv: list[str]) -> tuple[str, CallSettings]:
        p = argparse.ArgumentParser(prog="python -m bench.peers.driver SYSTEM {serve,call}")
        p.add_argument("system")
        p.add_argument("role", choices=("serve", "call", "call_apart"))
        p.add_argument("--url", required=True)
        p.add_argument("--single", type=int, required=True)
        p.add_argument("--parallel", type=int, required=True)
        p.add_argument("--callers", type=int, default=32)
        p.add_argument("--concurrency", type=int, default=32)
        p.add_argument("--warmup", type=int, default=64)
        p.add_argument("--phase-limit", type=float, required=True)
        p.add_argument("--time-limit", type=float, required=True)
        p.add_argument("--out", type=Path, required=True)
        a = p.parse_args(argv)
        return a.system, cls(a.role, a.url, a.single, a.parallel, a.callers, a.concurrency,
                             a.warmup, a.phase_limit, a.time_limit, a.out)


def payload(caller: int, seq: int) -> str:
    """The request of call ``seq`` by ``caller``: short, unique, ASCII."""
    return f"call {caller:02d} {seq:06d}"


def echo(text: str) -> str:
    """What every worker answers: the request upper-cased."""
    return text.upper()


class PhaseRecord:
    """The calls of one phase, from any task or thread: latencies, errors, wall time, own CPU.

    A caller takes the next sequence number with :meth:`next_seq` (None: the phase is over)
    and reports each call with :meth:`answered` or :meth:`failed`."""

    def __init__(self, name: str, target: int, callers: int, limit_s: float) -> None:
        self.name, self.target, self.callers = name, target, callers
        self.limit_s = limit_s
        self.started = 0
        self.latencies_us: list[int] = []
        self.errors = 0
        self.wrong = 0
        self.first_error: str | None = None
        self.stopped_by = "count"
        self._lock = threading.Lock()
        self.t0 = self.cpu0 = self.t1 = self.cpu1 = 0.0

    def begin(self) -> None:
        self.t0, self.cpu0 = time.monotonic(), time.process_time()
        self.deadline = self.t0 + self.limit_s

    def end(self) -> None:
        self.t1, self.cpu1 = time.monotonic(), time.process_time()

    def next_seq(self) -> int | None:
        with self._lock:
            if self.started >= self.target:
                return None
            if self.errors >= MAX_ERRORS:
                self.stopped_by = "errors"
                return None
            if time.monotonic() >= self.deadline:
                self.stopped_by = "time"
                return None
            self.started += 1
            return self.started - 1

    def answered(self, t0: float, t1: float, answer: Answer, expected: str) -> None:
        text = answer.decode() if isinstance(answer, bytes) else answer
        with self._lock:
            if text != expected:
                self.wrong += 1
                if self.first_error is None:
                    self.first_error = f"wrong answer {text[:60]!r}, expected {expected!r}"
                return
            self.latencies_us.append(round((t1 - t0) * 1e6))

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self.errors += 1
            if self.first_error is None:
                self.first_error = f"{type(exc).__name__}: {exc}"[:300]

    def result(self) -> dict[str, Any]:
        return {"phase": self.name, "calls": len(self.latencies_us), "target": self.target,
                "callers": self.callers, "errors": self.errors, "wrong": self.wrong,
                "first_error": self.first_error, "stopped_by": self.stopped_by,
                "t0": self.t0, "t1": self.t1, "seconds": self.t1 - self.t0,
                "cpu_s": self.cpu1 - self.cpu0, "latencies_us": self.latencies_us}


async def phase_async(name: str, target: int, callers: int, limit_s: float,
                      call: CallFn) -> dict[str, Any]:
    """Run ``target`` calls (or ``limit_s`` worth) with ``callers`` asyncio tasks, each
    awaiting ``call(caller, payload)`` before its next; the phase's result."""
    record = PhaseRecord(name, target, callers, limit_s)

    async def caller(index: int) -> None:
        while (seq := record.next_seq()) is not None:
            request = payload(index, seq)
            t0 = time.monotonic()
            try:
                answer = await call(index, request)
            except Exception as exc:  # counted, reported; the phase goes on up to MAX_ERRORS
                record.failed(exc)
                continue
            record.answered(t0, time.monotonic(), answer, echo(request))

    record.begin()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    record.end()
    return record.result()


def phase_threads(name: str, target: int, callers: int, limit_s: float,
                  call: SyncCallFn) -> dict[str, Any]:
    """:func:`phase_async` for a blocking client: one thread per caller."""
    record = PhaseRecord(name, target, callers, limit_s)

    def caller(index: int) -> None:
        while (seq := record.next_seq()) is not None:
            request = payload(index, seq)
            t0 = time.monotonic()
            try:
                answer = call(index, request)
            except Exception as exc:  # as in phase_async
                record.failed(exc)
                continue
            record.answered(t0, time.monotonic(), answer, echo(request))

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(callers)]
    record.begin()
    for thread in threads:
        thread.start()
    for thread in threads:
        # Each call is bounded by CALL_TIMEOUT_S, so a caller ends within limit + timeout.
        thread.join(limit_s + CALL_TIMEOUT_S + 5.0)
    record.end()
    return record.result()


async def phases_async(settings: CallSettings, call: CallFn) -> dict[str, Any]:
    """The warm-up (``callers`` at once), the single phase and the parallel phase."""
    limit = settings.phase_limit_s
    warmup = await phase_async("warmup", settings.warmup, settings.callers, limit, call)
    single = await phase_async("single", settings.single, 1, limit, call)
    parallel = await phase_async("parallel", settings.parallel, settings.callers, limit, call)
    return {"warmup": _brief(warmup), "single": single, "parallel": parallel}


def phases_threads(settings: CallSettings, call: SyncCallFn) -> dict[str, Any]:
    """:func:`phases_async` for a blocking client."""
    limit = settings.phase_limit_s
    warmup = phase_threads("warmup", settings.warmup, settings.callers, limit, call)
    single = phase_threads("single", settings.single, 1, limit, call)
    parallel = phase_threads("parallel", settings.parallel, settings.callers, limit, call)
    return {"warmup": _brief(warmup), "single": single, "parallel": parallel}


def _brief(phase: dict[str, Any]) -> dict[str, Any]:
    """The warm-up without its latencies (not measured, only checked)."""
    return {k: v for k, v in phase.items() if k != "latencies_us"}


def serve_until(deadline: float, running: Callable[[], bool] = lambda: True) -> dict[str, Any]:
    """Block a synchronous worker's watcher until ``deadline`` (or ``running()`` is false):
    the orchestrator normally kills the worker by PID long before."""
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    return {"stopped": "time limit" if running() else "worker ended"}
