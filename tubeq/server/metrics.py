"""Process metrics: plain counters and histograms that the hot path updates and /metrics reads.

Owns: what tubeq measures beyond the beanstalkd ``stats`` counters, the histogram buckets, the
tube-label cap and the slow-command log line. The ``cmd-*`` counts themselves stay in
:class:`tubeq.server.stats.CommandCounters`, which feeds both ``stats`` and Prometheus (one counter
source, two renderings).

Rules:

* No import of prometheus_client or aiohttp here: the core updates plain ints and lists, and
  ``tubeq.http.prometheus`` turns a snapshot of them into the exposition format at scrape time.
  A hook costs a dict lookup and an increment, never a prometheus_client lock.
* Tubes are user-created, so a tube label is capped: the first ``max_tubes`` tubes this process
  sees get a series of their own and every later one is counted under :data:`OTHER_TUBE` (a
  name no tube can have: ``~`` is outside beanstalkd's tube alphabet). The cap bounds memory
  and series however many tubes clients create.
* Every observation comes from data the store already has: the scripts return how long a job
  waited, how long it was held, how late a delayed job became ready (see the headers of
  ``lua/includes/jobs.lua``, ``delete.lua`` and ``promote.lua``); nothing here costs a round
  trip.
"""

from __future__ import annotations

import asyncio
import re
from bisect import bisect_left
from collections.abc import Sequence
from time import perf_counter
from typing import Any

import structlog

log = structlog.get_logger("tubeq.slow")

# The tube label value for tubes past the cap.
OTHER_TUBE = "~other"
# Series of their own for this many tubes per histogram family by default: 100 tubes x 16
# buckets x 2 families is ~3,400 series, what one Prometheus target comfortably carries.
DEFAULT_MAX_TUBES = 100
# A command whose reply took longer than this (ms) is logged (reserves, which wait by design,
# are not); 0 turns the line off.
DEFAULT_SLOW_MS = 1000

# Seconds. A job's wait (ready -> reserved) and hold (reserved -> deleted) range from a
# millisecond on a busy queue to the hour-long TTRs of batch work.
JOB_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
# How late a delayed job became ready: the scheduler aims at the due instant, so most land
# within a few ms; the top buckets catch a stalled process or a dead one's jobs (heartbeat).
LATENESS_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# One Redis round trip (a batch written -> its last reply read): ~100 us on loopback when idle,
# milliseconds when Redis is saturated.
RTT_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class Histogram:
    """Fixed buckets (upper bounds, seconds) plus +Inf; ``counts`` are per bucket, not
    cumulative (the renderer sums them)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        self.count += 1


class TubeHistograms:
    """One :class:`Histogram` per tube, for at most ``max_tubes`` tubes (then OTHER_TUBE)."""

    def __init__(self, bounds: Sequence[float], max_tubes: int) -> None:
        self.bounds = tuple(bounds)
        self.max_tubes = max_tubes
        self.by_tube: dict[str, Histogram] = {}

    def observe(self, tube: str, seconds: float) -> None:
        h = self.by_tube.get(tube)
        if h is None:
            if len(self.by_tube) >= self.max_tubes:
                tube = OTHER_TUBE
            h = self.by_tube.get(tube)
            if h is None:
                h = self.by_tube[tube] = Histogram(self.bounds)
        h.observe(seconds)


_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


_LABELS: dict[type[Any], str] = {}


def command_label(kind: type[Any]) -> str:
    """The label of a command class: its ``stat`` (the wire name beanstalkd counts it as), else
    its class name in wire style (``ReserveJob`` -> ``reserve-job``)."""
    label = _LABELS.get(kind)
    if label is None:
        stat = getattr(kind, "stat", None)
        label = stat if isinstance(stat, str) else _CAMEL.sub("-", kind.__name__).lower()
        _LABELS[kind] = label
    return label


def reply_word(reply: bytes) -> bytes:
    """The first word of a reply (``INSERTED``, ``NOT_FOUND``...), the command's outcome. A
    reply without arguments is the word and CRLF (tubeq.protocol.replies)."""
    end = reply.find(b" ", 0, 32)
    return reply[:end] if end > 0 else reply[:-2]


class Metrics:
    """This process's measurements. Hooks are called from the store, the Redis client and the
    connections; ``tubeq.http.prometheus`` reads the attributes."""

    def __init__(self, max_tubes: int = DEFAULT_MAX_TUBES, slow_ms: int = DEFAULT_SLOW_MS,
                 *, outcomes: bool = True) -> None:
        """``outcomes``: count replies by command and outcome (the /metrics listener is on);
        without it only slow commands are looked at."""
        if max_tubes < 1:
            raise ValueError("max_tubes must be at least 1")
        self.max_tubes = max_tubes
        self.slow_s = slow_ms / 1000
        self.count_outcomes = outcomes
        self.wait = TubeHistograms(JOB_BUCKETS, max_tubes)  # ready -> reserved
        self.held = TubeHistograms(JOB_BUCKETS, max_tubes)  # reserved -> deleted
        self.lateness = Histogram(LATENESS_BUCKETS)  # delayed job: due -> ready
        self.redis_rtt = Histogram(RTT_BUCKETS)
        self.redis_errors: dict[str, int] = {}  # by reply error code, or "connection_lost"
        self.outcomes: dict[tuple[str, bytes], int] = {}  # (command, reply word) -> count
        self.jobs_kicked = 0
        self.slow_commands = 0
        self.connections_opened = 0
        self.connections_closed = 0

    # -- store and Redis hooks ----------------------------------------------------------------

    def job_reserved(self, tube: str, waited_ms: int) -> None:
        """A job of ``tube`` reserved after ``waited_ms`` ready (negative: not from ready)."""
        if waited_ms >= 0:
            self.wait.observe(tube, waited_ms / 1000)

    def job_deleted(self, tube: str, held_ms: int) -> None:
        """A job deleted ``held_ms`` after its holder reserved it (negative: not reserved)."""
        if held_ms >= 0:
            self.held.observe(tube, held_ms / 1000)

    def jobs_promoted(self, lateness_ms: Sequence[int]) -> None:
        for ms in lateness_ms:
            self.lateness.observe(max(0, ms) / 1000)

    def redis_round_trip(self, seconds: float) -> None:
        self.redis_rtt.observe(seconds)

    def redis_error(self, kind: str) -> None:
        self.redis_errors[kind] = self.redis_errors.get(kind, 0) + 1

    # -- connection hooks ---------------------------------------------------------------------

    def answered(self, command: str, reply: bytes) -> None:
        """A reply left for ``command`` (its label, see :func:`command_label`)."""
        if not self.count_outcomes:
            return
        word = reply_word(reply)
        key = (command, word)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        if word == b"KICKED":  # "KICKED n" from kick, plain "KICKED" from kick-job
            self.jobs_kicked += int(reply[7:-2]) if len(reply) > 9 else 1

    def finished(self, token: str, command: str, started: float,
                 reply: asyncio.Future[bytes]) -> None:
        """A reply that was in flight (a store call) since ``started`` (``perf_counter``) is
        done: its outcome, and a log line if it was slow. The connection calls this from the
        reply's one done-callback, so tracking adds no callback of its own."""
        took = perf_counter() - started
        try:
            answer = reply.result()
        except BaseException:  # failed or cancelled: the client is told INTERNAL_ERROR
            answer = b"INTERNAL_ERROR\r\n"
        if self.count_outcomes:
            self.answered(command, answer)
        if self.slow_s and took >= self.slow_s:
            self.slow_commands += 1
            log.warning("slow command", command=command, ms=round(took * 1000, 1),
                        reply=reply_word(answer).decode(errors="replace"), conn=token)
