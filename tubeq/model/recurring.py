"""Recurring jobs (schedule-add): when a schedule's ticks fall due, computed in Python.

Owns the two kinds of schedule (a cron expression, or a fixed interval in ms), their validation,
and the one rule that turns a tick into the next: Lua cannot run a cron library, so the caller
computes the next due time and hands it to ``schedule_tick.lua``, which puts the tick's job and
stores that next due time in one step, refusing if the schedule's due time is no longer the one
the caller read. Two processes racing a tick therefore put one job, and a crash between two
ticks loses or doubles none: the tick either happened (job and next due stored) or did not.

Rules:

* Cron expressions are the five standard fields (minute hour day-of-month month day-of-week,
  as croniter reads them: names like ``MON`` and ``JAN``, ranges, steps, lists) or one of the
  ``@hourly``-style aliases, evaluated in UTC. On the wire the fields are joined by ``_``
  (``cron=*/5_*_*_*_*``), since a space separates options; ``_`` occurs in no cron field.
* Missed ticks (every process down at the time) run once: the first process back puts one job
  for the oldest missed tick, then the schedule continues at its next tick after now. A tick is
  never run twice and a backlog of ticks is never put at once.
* Intervals are aligned on the schedule's first due time (now + interval when added): tick
  ``n`` is due at ``first + n * interval`` however late each ran, so they do not drift.

Imports neither asyncio nor redis; the parser uses :func:`cron_expression`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

CRON: Final = "cron"
EVERY_MS: Final = "every-ms"

# The shortest interval: a schedule is for periodic work, not a stream of jobs (put those); each
# tick costs one script call per process that races it, so 10 ticks/s per schedule at most.
MIN_EVERY_MS: Final = 100

_ALIASES: Final = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily",
                             "@midnight", "@hourly"})


class BadSchedule(ValueError):
    """A cron expression that does not parse, or one with no future tick (``0 0 30 2 *``)."""


def cron_expression(wire: str) -> str:
    """The cron expression a wire value stands for (fields joined by ``_``), validated.

    Raises :class:`BadSchedule` when it is not five fields croniter accepts or an alias.
    """
    expression = wire.replace("_", " ")
    fields = expression.split(" ")
    if not (len(fields) == 5 and all(fields)) and expression not in _ALIASES:
        raise BadSchedule(f"not a 5-field cron expression: {expression!r}")
    from croniter import croniter  # here: importing it costs every start ~20 ms

    if not croniter.is_valid(expression):
        raise BadSchedule(f"not a cron expression: {expression!r}")
    return expression


def _next_cron(expression: str, after_ms: int) -> int:
    """The first tick of ``expression`` strictly after ``after_ms`` (UTC), in ms."""
    from croniter import CroniterBadCronError, CroniterBadDateError, croniter

    start = datetime.fromtimestamp(after_ms / 1000, UTC)
    try:
        return int(croniter(expression, start).get_next(float) * 1000)
    except (CroniterBadDateError, CroniterBadCronError) as exc:
        raise BadSchedule(f"{expression!r} has no next tick") from exc


def first_due(kind: str, spec: str, now_ms: int) -> int:
    """When a schedule added at ``now_ms`` first ticks."""
    if kind == EVERY_MS:
        return now_ms + int(spec)
    return _next_cron(spec, now_ms)


def next_due(kind: str, spec: str, due_ms: int, now_ms: int) -> int:
    """The tick after the one due at ``due_ms``, run at ``now_ms``: the first one after both
    (ticks missed meanwhile are skipped; the one being run stands for them)."""
    if kind == EVERY_MS:
        every = int(spec)
        behind = max(0, now_ms - due_ms)
        return due_ms + every * (behind // every + 1)
    return _next_cron(spec, max(due_ms, now_ms))


@dataclass(frozen=True, slots=True)
class DueTick:
    """A schedule whose tick is due, as schedule_due.lua reads it."""

    tube: str
    name: str
    generation: int
    due_ms: int
    kind: str
    spec: str
    delay_ms: int  # of the job a tick puts


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as schedule-list shows it."""

    name: str
    kind: str
    spec: str
    pri: int
    ttr: int
    delay_ms: int
    size: int
    next_ms: int
    ticks: int
    last_tick_ms: int
    last_job: int


def list_yaml(schedules: list[ScheduleInfo]) -> bytes:
    """schedule-list's document: a YAML sequence of one mapping per schedule (``[]`` if none).

    The cron expression is shown with spaces and double-quoted (it may start with ``*`` or
    ``@``, which YAML would read otherwise); nothing else needs quoting.
    """
    if not schedules:
        return b"--- []\n"
    lines = ["---"]
    for s in schedules:
        cron = f'"{s.spec}"' if s.kind == CRON else '""'
        every = int(s.spec) if s.kind == EVERY_MS else 0
        lines += [f"- name: {s.name}", f"  cron: {cron}", f"  every-ms: {every}",
                  f"  pri: {s.pri}", f"  ttr: {s.ttr}", f"  delay-ms: {s.delay_ms}",
                  f"  bytes: {s.size}", f"  next-ms: {s.next_ms}", f"  ticks: {s.ticks}",
                  f"  last-tick-ms: {s.last_tick_ms}", f"  last-job: {s.last_job}"]
    return ("\n".join(lines) + "\n").encode()
