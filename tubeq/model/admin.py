"""The admin verbs and the statistics beanstalkd lacks: their limits, the documents they answer
with, and tubeq's own stats-tube figures.

Owns the vocabulary the store and the handlers share for clear-tube, list-jobs and the figures
appended to stats-tube for extended connections: the batch and page limits (each with why), the
delay histogram's buckets, the list-jobs YAML document. Pure: no I/O, no clock (``now`` is an
argument), so it is tested without Redis; the Lua scripts (``clear_tube``, ``list_jobs``,
``tube_figures``) do the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# clear-tube deletes at most this many jobs per script call and calls again until the states
# are empty, so one call never holds Redis's single thread for long. Deleting a job (its hash,
# its event) costs more than promoting one: 1,000 jobs measured 30-60 ms of Redis time on a
# loaded 2-core machine, so a batch is 200 (a few ms); clearing is rare, the extra round trips
# do not matter.
CLEAR_BATCH: Final = 200

# list-jobs of reserved jobs walks the one index of every tube's reserved jobs and keeps the
# tube's own: one page examines at most this many entries (the same bound as a page of jobs).
LIST_SCAN_BUDGET: Final = 1000

# stats-tube's oldest-ready-age-ms visits the first job of each distinct priority of the
# tube's ready jobs (one ZRANGE and one HGET each); real tubes use a handful of priorities
# (5 levels and the histogram measured ~0.2 ms of Redis time), and 100 levels bound the cost
# of a tube that uses many, whatever the tube holds.
OLDEST_READY_LEVELS: Final = 100

_MINUTE: Final = 60_000
_HOUR: Final = 60 * _MINUTE
_DAY: Final = 24 * _HOUR

# The delay histogram of stats-tube: each key counts the tube's delayed jobs whose time left
# until due is below its bound (ms) and at least the previous key's; the last key has no bound.
DELAY_BUCKETS: Final[tuple[tuple[str, int | None], ...]] = (
    ("delayed-under-1m", _MINUTE),
    ("delayed-1m-10m", 10 * _MINUTE),
    ("delayed-10m-30m", 30 * _MINUTE),
    ("delayed-30m-1h", _HOUR),
    ("delayed-1h-6h", 6 * _HOUR),
    ("delayed-6h-1d", _DAY),
    ("delayed-1d-7d", 7 * _DAY),
    ("delayed-7d-30d", 30 * _DAY),
    ("delayed-over-30d", None),
)
DELAY_BOUNDS_MS: Final = tuple(bound for _, bound in DELAY_BUCKETS if bound is not None)

# The extra stats-tube keys of this module, in the order they follow the tube's settings.
FIGURE_KEYS: Final = (*(name for name, _ in DELAY_BUCKETS), "oldest-ready-age-ms")


@dataclass(frozen=True, slots=True)
class TubeFigures:
    """What tube_figures.lua read: delayed jobs per bucket, the oldest ready job's put time."""

    delayed: tuple[int, ...]
    oldest_ready_ms: int | None

    def stats_keys(self, now_ms: int) -> list[tuple[str, object]]:
        """The extra stats-tube keys: the histogram, then the oldest ready job's age in ms (0
        when the tube has no ready job)."""
        age = 0 if self.oldest_ready_ms is None else max(0, now_ms - self.oldest_ready_ms)
        return [*zip(FIGURE_KEYS, self.delayed, strict=False), ("oldest-ready-age-ms", age)]


# A tube's groups (put-with group=) as stats-tube, the HTTP API and the dashboard show them: how
# many have ready jobs, and the busiest by ready jobs. Five name who crowds a tube; the groups
# looked at are bounded (one ZCARD each, ~1 us of Redis): a tube of more groups than that shows
# the busiest of a sample of that many (lua/group_stats.lua).
BUSIEST_GROUPS: Final = 5
GROUP_SCAN_BUDGET: Final = 1000

# The extra stats-tube keys of a tube's groups, after the figures above.
GROUP_KEYS: Final = ("groups", "groups-busiest")


@dataclass(frozen=True, slots=True)
class GroupLoad:
    """One group of a tube: its ready jobs, and its reserved ones while the tube has group
    limits (0 otherwise: they are counted only then)."""

    group: str
    ready: int
    reserved: int


@dataclass(frozen=True, slots=True)
class TubeGroups:
    """What group_stats.lua read: the tube's groups with ready jobs, the busiest first."""

    count: int
    busiest: tuple[GroupLoad, ...]

    def stats_keys(self) -> list[tuple[str, object]]:
        """The extra stats-tube keys: the number of groups, then the busiest as one YAML
        double-quoted string of ``<group> <ready> <reserved>`` entries joined by ``, `` (a
        group key is spelled as a tube name: nothing in it needs escaping)."""
        busiest = ", ".join(f"{g.group} {g.ready} {g.reserved}" for g in self.busiest)
        return [("groups", self.count), ("groups-busiest", f'"{busiest}"')]


@dataclass(frozen=True, slots=True)
class ListedJob:
    id: int
    pri: int
    due_ms: int  # delayed: when it becomes ready; reserved: its TTR deadline; else 0


@dataclass(frozen=True, slots=True)
class JobPage:
    """One list-jobs page and the cursor of the next (None: the walk is over)."""

    jobs: tuple[ListedJob, ...]
    next: tuple[int, int] | None


def cursor_text(cursor: tuple[int, int] | None) -> str:
    """A cursor as the wire carries it: ``0`` for none, else ``<score>-<id>``."""
    return "0" if cursor is None else f"{cursor[0]}-{cursor[1]}"


# The key holding a job's due time in the list-jobs document, per state.
_DUE_KEYS: Final = {"delayed": "due-ms", "reserved": "deadline-ms"}


def jobs_yaml(tube: str, state: str, page: JobPage) -> bytes:
    """list-jobs' document: the tube, the state, the next cursor, then a block list of jobs."""
    lines = ["---", f"tube: {tube}", f"state: {state}", f"cursor: {cursor_text(page.next)}"]
    due_key = _DUE_KEYS.get(state)
    if not page.jobs:
        lines.append("jobs: []")
    else:
        lines.append("jobs:")
        for job in page.jobs:
            lines += [f"- id: {job.id}", f"  pri: {job.pri}"]
            if due_key is not None:
                lines.append(f"  {due_key}: {job.due_ms}")
    return ("\n".join(lines) + "\n").encode()


def job_page(raw: Sequence[bytes | int]) -> JobPage:
    """list_jobs.lua's answer after its leading 1: next score, next id, then (id, pri, due)."""
    next_score, next_id = raw[0], raw[1]
    cursor = None if next_score in (b"", "") else (int(next_score), int(next_id))
    jobs = tuple(ListedJob(int(raw[i]), int(raw[i + 1]), int(raw[i + 2]))
                 for i in range(2, len(raw), 3))
    return JobPage(jobs, cursor)
