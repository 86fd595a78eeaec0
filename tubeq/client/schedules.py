"""Recurring jobs in the client (tubeq's schedule-add, schedule-list, schedule-remove).

Owns :class:`Schedule` (one row of schedule-list) and the reading of schedule-list's document:
a YAML sequence of flat mappings (``--- []`` when the tube has none), the cron expression
double-quoted. Nothing else of YAML is understood. No I/O: :class:`~tubeq.client.Client`
sends the commands.
"""

from __future__ import annotations

from dataclasses import dataclass

from tubeq.client.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Schedule:
    """One of a tube's recurring schedules, as the server reports it.

    Exactly one of ``cron`` (the expression, fields separated by spaces, UTC) and ``every_ms``
    is set; times are ms since the epoch; ``last_tick_ms`` and ``last_job`` are 0 before the
    first tick."""

    name: str
    cron: str | None
    every_ms: int | None
    pri: int
    ttr: int
    delay_ms: int
    bytes: int
    next_ms: int
    ticks: int
    last_tick_ms: int
    last_job: int


_INT_KEYS = ("every-ms", "pri", "ttr", "delay-ms", "bytes", "next-ms", "ticks", "last-tick-ms",
             "last-job")


def cron_on_the_wire(expression: str) -> str:
    """A cron expression as schedule-add takes it: its fields joined by ``_``."""
    fields = expression.split()
    if not fields or any("_" in f for f in fields):
        raise ValueError(f"not a cron expression: {expression!r}")
    return "_".join(fields)


def parse_schedule_list(data: bytes) -> list[Schedule]:
    """schedule-list's document as :class:`Schedule` rows, in the server's (name) order."""
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()
    if not lines or not lines[0].startswith("---"):
        raise ProtocolError(f"schedule-list: not a YAML document: {text[:60]!r}")
    if lines[0].strip() == "--- []":
        return []
    rows: list[dict[str, str]] = []
    for line in lines[1:]:
        if line.startswith("- "):
            rows.append({})
            line = "  " + line[2:]
        if not rows or not line.startswith("  ") or ": " not in line:
            raise ProtocolError(f"schedule-list: unexpected line {line[:60]!r}")
        key, _, value = line[2:].partition(": ")
        rows[-1][key] = value
    try:
        return [_schedule(row) for row in rows]
    except (KeyError, ValueError) as exc:
        raise ProtocolError(f"schedule-list: bad entry ({exc})") from exc


def _schedule(row: dict[str, str]) -> Schedule:
    n = {key: int(row[key]) for key in _INT_KEYS}
    cron = row["cron"].strip('"')
    return Schedule(row["name"], cron or None, n["every-ms"] or None, n["pri"], n["ttr"],
                    n["delay-ms"], n["bytes"], n["next-ms"], n["ticks"], n["last-tick-ms"],
                    n["last-job"])
