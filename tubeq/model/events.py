"""The lifecycle event schema: the one definition of what a job's life looks like on the record.

Every Lua script that changes a job's state appends one entry to the namespace's event stream
(``Keys.events``, a Redis Stream) in the same script, so an event exists if and only if its
transition happened. This module owns the event names, the fields and their order, the parsing
of a stream entry back into an :class:`Event`, and the schema Spark reads (``SPARK_DDL``); the Lua
side writes the same fields in the same order (``lua/includes/events.lua``) and a test keeps the
two equal.

Rules:

* Every entry carries every field, in ``FIELDS`` order, with ``""`` or ``0`` where a field does not
  apply. Redis then stores the field names once per stream node instead of once per entry (its
  "same fields" flag), which keeps an event to roughly its values' size.
* Times are milliseconds since the epoch on the clock the scripts are given (``now``); durations
  are milliseconds too, so second-granular beanstalkd values and later millisecond delays share
  one unit.
* No import of pyspark here: the core server must not need it. ``tubeq.pipeline`` builds its
  Spark schema from ``SPARK_DDL``.
* Fields are only ever added, at the end (``LATER_FIELDS``), so what an older tubeq wrote still
  reads: an entry without the later fields parses with their defaults (0, ``""``), and an
  archive written before them reads them as null (``report.py`` counts a null as 0). An entry
  with some of the later fields but not all is malformed, as is one with a field not here.
* Text a client gave (a fail's error) is decoded with replacement characters where it is not
  UTF-8: an event carries what the job carried, and a client's bytes must not make it unreadable.
* A trailing field (``TRAILING_FIELDS``) follows every field of ``FIELDS`` on the entries it
  applies to, and only on them: ``traceparent`` on the ``put`` of a job put with one. So the
  entries of every other job cost nothing more. It is not a column of ``SPARK_DDL`` (the
  archive does not keep it) and an entry without it parses to ``""``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final


class EventName(enum.StrEnum):
    """What happened to a job. The values are what the stream's ``event`` field holds."""

    PUT = "put"  # a new job, ready or delayed (delay_ms > 0, due_ms set)
    PROMOTED = "promoted"  # a delayed job came due and became ready
    RESERVED = "reserved"  # a connection took it (reserve, reserve-job, push, hand-over)
    RELEASED = "released"  # its holder gave it back, ready or delayed
    TIMED_OUT = "timed-out"  # its TTR ran out (or its holder went away) and it came back
    TOUCHED = "touched"  # its holder asked for a fresh TTR
    BURIED = "buried"  # put aside (reason says why when tubeq, not a client, did it)
    KICKED = "kicked"  # a buried or delayed job made ready by kick / kick-job
    DELETED = "deleted"  # gone for good (reason "finished": by finish, with its result's size)
    # Its holder said it failed (fail): error, size and failures set. The job's move follows
    # as its own event: released (reason "failed"), or a policy's buried or expired.
    FAILED = "failed"
    # Transitions of the "beyond beanstalkd" extensions, written when they land.
    EXPIRED = "expired"
    DEAD_LETTERED = "dead-lettered"
    DEDUPLICATED = "deduplicated"
    # Admin verbs (change-pri, change-delay): the job keeps its state; clear-tube writes
    # DELETED with reason "cleared".
    REPRIORITIZED = "reprioritized"  # a new priority (pri holds it)
    RESCHEDULED = "rescheduled"  # a delayed job's new due time (delay_ms, due_ms hold it)


# The stream entry's fields, in the order every entry carries them.
FIELDS: Final = (
    "event",     # an EventName value
    "id",        # job id
    "tube",      # the job's tube
    "pri",       # the job's priority after the event
    "delay_ms",  # the delay asked for by this put or release; 0 otherwise
    "ttr_ms",    # the job's time-to-run
    "due_ms",    # when a delayed job becomes ready (put or release with a delay); 0 otherwise
    "tries",     # how many times the job has been reserved, this event included
    "time_ms",   # when it happened (the script's clock)
    "by",        # the tubeq process (instance id) whose script call did it; "" if none
    "reason",    # why tubeq did it on its own (e.g. "disconnect" for timed-out); "" otherwise
    # Added with finish and fail (issue 32); entries written before them have none of the three.
    "size",      # bytes of a finish's result (deleted, reason finished) or a fail's whole error
    "error",     # a fail's error text: its first ERROR_EXCERPT_BYTES bytes (failed); "" otherwise
    "failures",  # how many times the job has failed, this fail included (failed); 0 otherwise
)

# The fields added after the first schema, in FIELDS order, each with the value an entry that
# lacks them (written by an older tubeq) parses to.
LATER_FIELDS: Final = ("size", "error", "failures")
LATER_DEFAULTS: Final[dict[str, int | str]] = {"size": 0, "error": "", "failures": 0}

# Fields after FIELDS that only some entries carry (see the rules above): the producer's W3C
# traceparent on the put of a job put-with gave one (protocol.md, "Traces").
TRAILING_FIELDS: Final = ("traceparent",)

# The fields that hold integers; the rest are strings.
INT_FIELDS: Final = frozenset({"id", "pri", "delay_ms", "ttr_ms", "due_ms", "tries", "time_ms",
                               "size", "failures"})

# The most bytes of a fail's error text its event keeps (lua/includes/events.lua's
# EVENT_ERROR_MAX), cut back to where a UTF-8 character begins. The job keeps the whole text
# (stats-job's error, the HTTP API, a waiter's ENDED); the stream is capped by entries, not
# bytes, so this bounds what a storm of failures costs it: a one-line exception message fits,
# a traceback's head does, and 500,000 failed events (the default cap's half: each fail writes
# two) hold at most ~128 MB of error text.
ERROR_EXCERPT_BYTES: Final = 256

# The archive's and the data source's columns: the stream entry id (Redis "<ms>-<seq>", the
# source's offset and the archive's unique key) followed by the fields. Spark DDL, so the core
# package need not import pyspark to state it.
SPARK_DDL: Final = ", ".join(
    ["stream_id STRING"]
    + [f"{name} {'BIGINT' if name in INT_FIELDS else 'STRING'}" for name in FIELDS]
)


class MalformedEvent(ValueError):
    """A stream entry that is not an event of this schema (missing, extra or bad fields)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One lifecycle event as read back from the stream."""

    stream_id: str
    event: str
    id: int
    tube: str
    pri: int
    delay_ms: int
    ttr_ms: int
    due_ms: int
    tries: int
    time_ms: int
    by: str
    reason: str
    size: int = 0
    error: str = ""
    failures: int = 0
    traceparent: str = ""  # a trailing field: not in FIELDS, nor in as_row

    @classmethod
    def from_entry(cls, stream_id: bytes | str, fields: Mapping[bytes, bytes]) -> Event:
        """Parse one XRANGE/XREAD entry, of this schema or of one before ``LATER_FIELDS``;
        raises :class:`MalformedEvent` if it does not fit."""
        sid = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
        names = {k.decode(errors="replace") for k in fields}
        missing = set(FIELDS) - names
        extra = names - set(FIELDS) - set(TRAILING_FIELDS)
        if extra or (missing and missing != set(LATER_FIELDS)):
            raise MalformedEvent(f"entry {sid}: missing {sorted(missing)}, "
                                 f"unexpected {sorted(extra)}")
        values: dict[str, int | str] = {}
        for name in FIELDS:
            raw = fields.get(name.encode())
            if raw is None:
                values[name] = LATER_DEFAULTS[name]
                continue
            try:
                text = raw.decode(errors="replace" if name in _CLIENT_TEXT else "strict")
                values[name] = int(text) if name in INT_FIELDS else text
            except (UnicodeDecodeError, ValueError) as exc:
                raise MalformedEvent(f"entry {sid}: bad {name} {raw!r}") from exc
        if values["event"] not in _NAMES:
            raise MalformedEvent(f"entry {sid}: unknown event {values['event']!r}")
        for name in TRAILING_FIELDS:
            raw = fields.get(name.encode())
            if raw is not None:
                try:
                    values[name] = raw.decode("ascii")  # put-with checked it: W3C, ASCII
                except UnicodeDecodeError as exc:
                    raise MalformedEvent(f"entry {sid}: bad {name} {raw!r}") from exc
        return cls(stream_id=sid, **values)  # type: ignore[arg-type]

    def as_row(self) -> tuple[int | str, ...]:
        """The event as a tuple in ``SPARK_DDL`` column order."""
        return (self.stream_id, *(getattr(self, name) for name in FIELDS))


_NAMES: Final = frozenset(e.value for e in EventName)
# Fields whose text a client chose byte for byte (not a name tubeq checked): decoded leniently.
_CLIENT_TEXT: Final = frozenset({"error"})
