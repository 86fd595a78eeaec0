"""What the job store hands up and hears back: the records its calls return (a reservation, a
job's stats, a tube's counts, ...), the signal of a deferred command, the clock it reads and
the observer it tells of the figures its scripts return.

Rules: plain data, decoded by the store (tubeq.store.store) from its scripts' replies; the layers
above read them. This module imports nothing of tubeq, so the interface (tubeq.store.base), the
store and its split (tubeq.store.shards) all import it and none imports another for its types.
A job's record in Redis is described field by field in lua/includes/job_record.lua.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# The store's clock: milliseconds since the epoch (an injectable ``wall_clock_ms``, so tests
# move time without sleeping).
Clock = Callable[[], int]


@dataclass(frozen=True, slots=True)
class Reservation:
    """A job reserved for a connection: what RESERVED carries, its TTR deadline, and for the
    metrics how long it had been ready and its tube."""

    id: int
    ttr: int
    body: bytes
    deadline_ms: int
    waited_ms: int = -1  # how long it had been ready (-1: not taken from ready)
    tube: str = ""


@dataclass(frozen=True, slots=True)
class NoJob:
    """Nothing reservable."""


# How a job ended, as a wait hears it (lua/includes/ends.lua, END_HOW).
END_HOWS = ("finished", "deleted", "buried", "expired", "cancelled")
# What touch (instead of a deadline) and finish (instead of True) answer for a job cancelled
# while its holder held it: the job is gone (lua/cancel.lua).
CANCELLED = -2
# What finish answers (instead of True) when only the calling process waited for the job
# (its request/reply marked it, JOB_WAITED_BY): the end was not published, and that process
# tells its own waits (lua/finish.lua).
FINISHED_HERE = 2
# hand_back.lua's answer for a job past its TTL: it expired instead of going back to ready.
HANDED_BACK_EXPIRED = 3


@dataclass(frozen=True, slots=True)
class Failed:
    """What became of a job its holder failed (fail.lua): ``state`` 'ready', 'delayed' (until
    ``due_ms``, its backoff), 'taken' (buried or expired by its policies) or 'cancelled' (it
    was cancelled while held: it is gone)."""

    state: str
    due_ms: int = 0


@dataclass(frozen=True, slots=True)
class Progress:
    """A living job's latest progress (progress.lua): its ``seq``-th report and its data."""

    seq: int
    data: bytes


@dataclass(frozen=True, slots=True)
class JobEnd:
    """How a job ended (one of END_HOWS; ``buried`` also while it lies buried) and its data:
    the result of a finished job, why tubeq buried one ('' when a client did), else b''."""

    how: str
    data: bytes


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The raw fields behind stats-job."""

    id: int
    tube: str
    state: str
    pri: int
    created_ms: int
    delay: int
    ttr: int
    due_ms: int
    reserves: int
    timeouts: int
    releases: int
    buries: int
    kicks: int


@dataclass(frozen=True, slots=True)
class TubeCounts:
    """One row of overview.lua; ``name`` "" is the sum of the tubes past the limit."""

    name: str
    urgent: int
    ready: int
    reserved: int
    delayed: int
    buried: int
    total: int  # jobs ever put (stats-tube total-jobs)
    deletes: int  # stats-tube cmd-delete
    pause_until_ms: int  # 0: never paused (or the summed row); compare with now
    waiting: int
    watching: int
    using: int


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job of browse.lua: the start of its body, not all of it."""

    id: int
    pri: int
    created_ms: int
    due_ms: int
    reserves: int
    body_head: bytes


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """One tubeq process of the namespace: its last heartbeat and gauges."""

    id: str
    heartbeat_ms: int
    addr: str
    http: str
    connections: int
    producers: int
    workers: int
    waiting: int


@dataclass(frozen=True, slots=True)
class PutOutcome:
    """What a put-with did: ``inserted`` job ``id``, or refused as a duplicate of job ``id``;
    with ``unknown_parent``, refused because ``after=`` names that job, which tubeq does not
    know (``id`` is then 0)."""

    id: int
    inserted: bool
    unknown_parent: int = 0


# What a parent is for a child about to be put after it (lua/includes/after.lua parent_state).
PARENT_UNKNOWN, PARENT_LIVING, PARENT_DONE, PARENT_FAILED = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class ParentEnd:
    """A parent's end on its way to a child (lua/includes/ends.lua, K_PARENT_ENDS): ``member``
    as stored, ``at`` when it was left (ms)."""

    member: str
    child: int
    parent: int
    done: bool  # finished, or deleted by its holder
    at: int

    @classmethod
    def parse(cls, member: bytes, score: float) -> ParentEnd:
        child, parent, done = member.split(b" ")
        return cls(member.decode(), int(child), int(parent), done == b"1", int(score))


@dataclass(frozen=True, slots=True)
class JobPolicies:
    """A job's policy state (lua/includes/policies.lua), as stats-job shows it to tubeq clients."""

    reason: str  # why tubeq last buried it: "max-tries", "expired", or ""
    tries: int  # reservations that ended in a TTR timeout, a release or a disconnect
    max_tries: int  # its own, else its tube's now; 0: none
    expires_at_ms: int  # when it expires; 0: no expiry pending
    key: str  # its dedupe key, or ""
    failures: int = 0  # failures its holders reported (fail)
    error: bytes = b""  # the last one's error text
    progress_seq: int = 0  # progress reports its holders made (progress)
    progress: bytes = b""  # the latest one
    parents_pending: int = 0  # held (put-with after=): its parents not finished yet
    traceparent: str = ""  # put-with traceparent=: the producer's W3C context, or ""


@dataclass(frozen=True, slots=True)
class JobTrace:
    """What the server's spans of a reservation need of a traced job (put-with traceparent=):
    its context, when it was put and last became ready (ms; 0: straight from its put), and how
    many times it has been reserved (this reservation included)."""

    traceparent: str
    created_ms: int
    ready_since_ms: int
    reserves: int


class Deferred(Exception):
    """A command pipelined behind a reserve of its connection did nothing: that reserve waits
    for a job, and beanstalkd runs what follows a reserve only once it is answered. The
    connection's reserve queue sends the command again then (tubeq.server.reserves)."""


# Where a put's new job goes that put.lua handed straight to a push loop of the calling
# process (its direct hand-over): the connection's token, the job's reservation and its
# priority. Set on the store by the server (tubeq.server.context.ServerContext.deliver_direct).
DirectGrants = Callable[[str, Reservation, int], None]


class JobObserver(Protocol):
    """What the store tells of the figures its scripts return, when metrics are on: the server's
    Metrics (tubeq.server.metrics) is one. Stated here so the store imports nothing above it."""

    def job_reserved(self, tube: str, waited_ms: int) -> None:
        """A job of ``tube`` reserved after ``waited_ms`` ready (negative: not from ready)."""

    def jobs_reserved(self, reservations: Iterable[Reservation]) -> None:
        """Jobs reserved together, each after its ``waited_ms`` ready (negative: not from
        ready)."""

    def job_deleted(self, tube: str | bytes, held_ms: int) -> None:
        """A job deleted ``held_ms`` after its holder reserved it (negative: not reserved);
        ``tube`` as Redis returned it (bytes) or decoded."""

    def jobs_deleted(self, replies: Iterable[Any]) -> None:
        """Jobs deleted together: delete_many.lua's replies, one per id ({held_ms, tube} as
        job_deleted's, or 0: not deleted)."""

    def jobs_promoted(self, lateness_ms: Sequence[int]) -> None:
        """Delayed jobs made ready, each ``lateness_ms`` after its due time."""
