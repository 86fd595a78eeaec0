"""Process metrics: plain counters and histograms that the hot path updates and /metrics reads.

Owns: what tubeq measures beyond the beanstalkd ``stats`` counters, the histogram buckets, the
tube-label cap and the slow-command log line. The ``cmd-*`` counts themselves stay in
:class:`tubeq.server.stats.CommandCounters`, which feeds both ``stats`` and Prometheus (one counter
source, two renderings).

Rules:

* No import of prometheus_client or aiohttp here: the core updates plain ints and lists, and
  ``tubeq.http.prometheus`` turns a snapshot of them into the exposition format at scrape time.
  A hook costs a list append (a batch's jobs: one extend), never a prometheus_client lock;
  the per-tube histograms take the pending observations in at a read (TubeHistograms.fold).
* Replies are counted where they are written, a write's worth at a time: a connection notes
  the command class of each reply it queues (:meth:`Metrics.asked_lists`, a list append) and
  hands each write's replies to :meth:`Metrics.written`, which counts them by (class, first
  word) with no Python step per reply: a write of one command's replies with one word (16
  INSERTED) in one step, a mixed one in C; classes become labels at scrape time (measured in
  bench/RESULTS-metrics.md, issue 33: a cycle job costs ~5 % more with metrics on, from ~17 %
  when each command had a callback of its own). No callback, closure or clock read per
  command: the slow-command log times a command from its read's turn (one clock read per
  turn) to the write of its reply (one per write).
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

import math
import re
from bisect import bisect_left
from collections import _count_elements  # type: ignore[attr-defined]
from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from time import perf_counter
from typing import Any

import structlog

from tubeq.protocol import commands as c
from tubeq.store.records import Reservation

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
    cumulative (the renderer sums them). Whole milliseconds (the scripts' figures) are summed
    as an int, exactly; :meth:`observe`'s seconds as a float."""

    __slots__ = ("bounds", "bounds_ms", "counts", "slot_of_ms", "sum_ms", "sum_s")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        # For whole milliseconds: an int of ms lands in the first bucket whose bound it does
        # not exceed, as its seconds would (bounds under 1 ms take only 0 ms).
        self.bounds_ms = tuple(math.floor(b * 1000 + 1e-9) for b in self.bounds)
        # The bucket of each ms below SLOT_TABLE_MS, looked up instead of searched (shared by
        # the histograms of the same bounds).
        self.slot_of_ms = _slot_table(self.bounds_ms)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum_s = 0.0
        self.sum_ms = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum_s += seconds

    def observe_ms(self, ms: int, n: int = 1) -> None:
        """``n`` observations of ``ms`` (>= 0) whole milliseconds."""
        self.counts[self.slot_of_ms[ms] if ms < SLOT_TABLE_MS
                    else bisect_left(self.bounds_ms, ms)] += n
        self.sum_ms += ms * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def merged(self, other: Histogram) -> Histogram:
        """A new histogram of both's observations (same bounds)."""
        both = Histogram(self.bounds)
        both.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        both.sum_s, both.sum_ms = self.sum_s + other.sum_s, self.sum_ms + other.sum_ms
        return both

    @property
    def sum(self) -> float:
        return self.sum_s + self.sum_ms / 1000


# Observations a TubeHistograms holds unfolded at most (a fold is one C-level count of them).
PENDING_MAX = 1024
# Whole milliseconds below this are bucketed by a table lookup (a list of small ints per set of
# bounds, 8 KB): most waits and holds of a busy queue, and most lateness.
SLOT_TABLE_MS = 1024
_SLOT_TABLES: dict[tuple[int, ...], list[int]] = {}


def _slot_table(bounds_ms: tuple[int, ...]) -> list[int]:
    table = _SLOT_TABLES.get(bounds_ms)
    if table is None:
        table = _SLOT_TABLES[bounds_ms] = [bisect_left(bounds_ms, ms)
                                           for ms in range(SLOT_TABLE_MS)]
    return table


class TubeHistograms:
    """One :class:`Histogram` per tube, for at most ``max_tubes`` tubes (then OTHER_TUBE).
    A hook may name a tube as Redis returned it (bytes: no decode per job) or as text: both
    names of a tube lead to its one histogram, and the cap counts tubes, not names.

    Observations wait in :attr:`pending` as (ms, tube) pairs, appended by the hooks (a batch's
    in one C-level extend), and go into their histograms in one count by pair (:meth:`fold`)
    once PENDING_MAX wait or when the histograms are read (:attr:`by_tube`): the hot path takes
    no Python step per job, and a fold takes one per distinct (ms, tube), not per job."""

    def __init__(self, bounds: Sequence[float], max_tubes: int) -> None:
        self.bounds = tuple(bounds)
        self.max_tubes = max_tubes
        # By the name as the hooks gave it (at most two names a tube, none past the cap).
        self.raw: dict[str | bytes, Histogram] = {}
        self._by_name: dict[str, Histogram] = {}  # one a tube, and OTHER_TUBE's
        self.pending: list[tuple[int, str | bytes]] = []  # (ms, tube); ms < 0: no observation

    def note(self, pairs: Iterable[tuple[int, str | bytes]]) -> None:
        """Observe each (ms, tube) of ``pairs`` (ms < 0: none), folded in later."""
        pending = self.pending
        pending.extend(pairs)
        if len(pending) >= PENDING_MAX:
            self.fold()

    def fold(self) -> None:
        """Put the pending observations into their histograms."""
        pending = self.pending
        if not pending:
            return
        counted: dict[tuple[int, str | bytes], int] = {}
        _count_elements(counted, pending)
        pending.clear()
        for (ms, tube), n in counted.items():
            if ms >= 0:
                self.of(tube).observe_ms(ms, n)

    def of(self, tube: str | bytes) -> Histogram:
        """``tube``'s histogram, made on first use (OTHER_TUBE's past the cap)."""
        h = self.raw.get(tube)
        if h is not None:
            return h
        name = tube.decode() if isinstance(tube, bytes) else tube
        h = self._by_name.get(name)
        if h is None:
            if len(self._by_name) - (OTHER_TUBE in self._by_name) >= self.max_tubes:
                # Past the cap: OTHER_TUBE's, and no name of it kept (its decode each time).
                h = self._by_name.get(OTHER_TUBE)
                if h is None:
                    h = self._by_name[OTHER_TUBE] = Histogram(self.bounds)
                return h
            h = self._by_name[name] = Histogram(self.bounds)
        self.raw[tube] = h
        return h

    def observe(self, tube: str, seconds: float) -> None:
        self.of(tube).observe(seconds)

    @property
    def by_tube(self) -> dict[str, Histogram]:
        """The histograms by tube name, every observation in (the registry's own: read it, do
        not change it)."""
        self.fold()
        return self._by_name


# When the command of a reply that is not timed for the slow log began: never that long ago.
UNTIMED = float("inf")

# Metrics.written's pieces, made once: a reply's first 32 bytes (the longest reply word is
# shorter; a RESERVED reply's body is not copied), split at the first space.
_HEAD = itemgetter(slice(0, 32))
# _count_elements: Counter.update's C helper (collections has had it since 3.2, with a
# pure-Python stand-in where the C module is missing): counts an iterable into a dict.
_PARTITION = bytes.partition
_STARTS = bytes.startswith
_SPACES = repeat(b" ")  # endless: each map below takes one per reply
_FIRST = itemgetter(0)
_WAITED = attrgetter("waited_ms", "tube")  # a Reservation's (ms, tube)
_KICK = c.Kick
_KICK_JOB = c.KickJob

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
        # Reply counts by (command class, reply word) from the connections' writes, and by
        # (command label, reply word) from the HTTP API: merged by ``outcomes``.
        self._by_kind: dict[tuple[type[Any], bytes], int] = {}
        self._by_label: dict[tuple[str, bytes], int] = {}
        self._kicked = 0  # kick's "KICKED n" and the HTTP API's kicks (see jobs_kicked)
        self.slow_commands = 0
        self.connections_opened = 0
        self.connections_closed = 0

    # -- store and Redis hooks ----------------------------------------------------------------

    def job_reserved(self, tube: str, waited_ms: int) -> None:
        """A job of ``tube`` reserved after ``waited_ms`` ready (negative: not from ready)."""
        self.wait.note(((waited_ms, tube),))

    def jobs_reserved(self, reservations: Iterable[Reservation]) -> None:
        """Jobs reserved together (a reserve-many script's), each after its ``waited_ms``."""
        self.wait.note(map(_WAITED, reservations))

    def job_deleted(self, tube: str | bytes, held_ms: int) -> None:
        """A job deleted ``held_ms`` after its holder reserved it (negative: not reserved);
        ``tube`` as Redis returned it, or decoded."""
        self.held.note(((held_ms, tube),))

    def jobs_deleted(self, replies: Iterable[Any]) -> None:
        """A delete_many script's replies, one per id: {held_ms, tube} deleted, 0 not."""
        self.held.note(map(tuple, filter(None, replies)))

    def jobs_promoted(self, lateness_ms: Sequence[int]) -> None:
        for ms in lateness_ms:
            self.lateness.observe_ms(max(0, ms))

    def redis_round_trip(self, seconds: float) -> None:
        self.redis_rtt.observe(seconds)

    def redis_error(self, kind: str) -> None:
        self.redis_errors[kind] = self.redis_errors.get(kind, 0) + 1

    # -- connection hooks ---------------------------------------------------------------------

    def asked_lists(self) -> tuple[list[type[Any] | None], list[float] | None]:
        """A new connection's record of what it queues replies for, in reply order: each
        reply's command class (None: a push frame, no command's), and while the slow log is on
        (else None) when its command's turn began (``perf_counter``; :data:`UNTIMED`: not
        timed, see :meth:`written`). The connection appends; :meth:`written` takes the front
        off as the replies leave."""
        return [], [] if self.slow_s > 0 else None

    def answered(self, command: str, reply: bytes) -> None:
        """A reply left for ``command`` (its label, see :func:`command_label`): the HTTP API's
        commands, counted one at a time."""
        if not self.count_outcomes:
            return
        word = reply_word(reply)
        key = (command, word)
        self._by_label[key] = self._by_label.get(key, 0) + 1
        if word == b"KICKED":  # "KICKED n" from kick, plain "KICKED" from kick-job
            self._kicked += int(reply[7:-2]) if len(reply) > 9 else 1

    def written(self, token: str, kinds: list[type[Any] | None], since: list[float] | None,
                out: list[bytes]) -> None:
        """``out`` leaves connection ``token`` in one write: the replies to the first
        ``len(out)`` entries of ``kinds`` and ``since`` (:meth:`asked_lists`). Counts their
        outcomes; a timed one written ``slow_ms`` or more after its command's turn began is a
        slow command. Not timed: immediate replies, reserves (they wait by design) and
        commands sent while a reserve before them was unanswered (their replies wait for its).
        A reply that waits behind a slow one is slow too: it was, to its client."""
        n = len(out)
        asked = kinds[:n]
        del kinds[:n]
        if self.count_outcomes and self._count(asked, out):  # kick's "KICKED n": the jobs
            for kind, reply in zip(asked, out, strict=True):
                if kind is _KICK and reply.startswith(b"KICKED "):
                    self._kicked += int(reply[7:-2])
        if since is not None:
            started = since[:n]
            del since[:n]
            if min(started) <= perf_counter() - self.slow_s:
                self._log_slow(token, asked, started, out)

    def _count(self, asked: list[type[Any] | None], out: list[bytes]) -> bool:
        """Count ``out``'s replies by (command class, the reply up to its first space), with no
        Python step per reply. A reply without arguments keeps its CRLF in the key (there is
        no space to cut at): :attr:`outcomes` cuts it, once per key at read time. Returns
        whether a kick's reply is among them."""
        n = len(out)
        kind = asked[0]
        if kind is not None and asked.count(kind) == n:  # one command's replies, the usual
            first = out[0]
            word = first[:32].partition(b" ")[0]
            if len(word) == len(first):  # no arguments: all the same reply (DELETED...)?
                same = out.count(first) == n
            else:  # or the same word with arguments (INSERTED <id>, RESERVED <id> ...)?
                same = all(map(_STARTS, out, repeat(word + b" ", n)))
            if same:
                key = (kind, word)
                self._by_kind[key] = self._by_kind.get(key, 0) + n
                return kind is _KICK
        # Mixed replies: each cut at its first space, in C.
        _count_elements(self._by_kind, zip(
            asked, map(_FIRST, map(_PARTITION, map(_HEAD, out), _SPACES)), strict=True))
        return _KICK in asked

    def _log_slow(self, token: str, kinds: list[type[Any] | None], since: list[float],
                  out: list[bytes]) -> None:
        now = perf_counter()
        for kind, at, reply in zip(kinds, since, out, strict=True):
            if kind is None or now - at < self.slow_s:
                continue
            self.slow_commands += 1
            log.warning("slow command", command=command_label(kind),
                        ms=round((now - at) * 1000, 1),
                        reply=reply_word(reply).decode(errors="replace"), conn=token)

    @property
    def outcomes(self) -> dict[tuple[str, bytes], int]:
        """Replies by (command label, reply word): what the connections wrote and the HTTP API
        answered. Built on each read (a scrape), from the counts by command class."""
        merged = dict(self._by_label)
        for (kind, head), n in self._by_kind.items():
            if kind is None:  # push frames
                continue
            key = (command_label(kind), head[:-2] if head.endswith(b"\r\n") else head)
            merged[key] = merged.get(key, 0) + n
        return merged

    @property
    def jobs_kicked(self) -> int:
        """Jobs kicked by this process's clients: kick's counts, one per kick-job that kicked."""
        return self._kicked + self._by_kind.get((_KICK_JOB, b"KICKED\r\n"), 0)
