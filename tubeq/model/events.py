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
    DELETED = "deleted"  # gone for good
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
)

# The fields that hold integers; the rest are strings.
INT_FIELDS: Final = frozenset({"id", "pri", "delay_ms", "ttr_ms", "due_ms", "tries", "time_ms"})

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

    @classmethod
    def from_entry(cls, stream_id: bytes | str, fields: Mapping[bytes, bytes]) -> Event:
        """Parse one XRANGE/XREAD entry; raises :class:`MalformedEvent` if it does not fit."""
        sid = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
        names = {k.decode(errors="replace") for k in fields}
        if names != set(FIELDS):
            missing = sorted(set(FIELDS) - names)
            extra = sorted(names - set(FIELDS))
            raise MalformedEvent(f"entry {sid}: missing {missing}, unexpected {extra}")
        values: dict[str, int | str] = {}
        for name in FIELDS:
            raw = fields[name.encode()]
            try:
                text = raw.decode()
                values[name] = int(text) if name in INT_FIELDS else text
            except (UnicodeDecodeError, ValueError) as exc:
                raise MalformedEvent(f"entry {sid}: bad {name} {raw!r}") from exc
        if values["event"] not in _NAMES:
            raise MalformedEvent(f"entry {sid}: unknown event {values['event']!r}")
        return cls(stream_id=sid, **values)  # type: ignore[arg-type]

    def as_row(self) -> tuple[int | str, ...]:
        """The event as a tuple in ``SPARK_DDL`` column order."""
        return (self.stream_id, *(getattr(self, name) for name in FIELDS))


_NAMES: Final = frozenset(e.value for e in EventName)
