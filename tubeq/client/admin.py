"""The admin verbs' side of the client (tubeq extensions, protocol.md "Admin verbs"): the
list-jobs document as :class:`JobPage`, and what each verb accepts before it is sent.

Sans-IO, as :mod:`tubeq.client.parser`: bytes in, values out. :class:`~tubeq.client.Client`
sends the commands (``clear_tube``, ``list_jobs``, ``iter_jobs``, ``change_pri``,
``change_delay``, ``tube_pause``, ``tube_resume``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from tubeq.client.errors import ProtocolError

# The states clear-tube takes (never "reserved": a worker holds those) and list-jobs takes.
CLEAR_STATES: Final = ("all", "ready", "delayed", "buried")
LIST_STATES: Final = ("ready", "delayed", "buried", "reserved")
# The most jobs a list-jobs page may ask for (the server's LIST_JOBS_MAX).
LIST_JOBS_MAX: Final = 1000
# The cursor of a first page, and of the page after the last.
START: Final = "0"
_CURSOR = re.compile(r"0|[0-9]{1,16}-[0-9]{1,20}")


@dataclass(frozen=True, slots=True)
class ListedJob:
    """A job as list-jobs shows it; ``due_ms`` is a delayed job's due time or a reserved job's
    TTR deadline (ms since the epoch), None for ready and buried jobs."""

    id: int
    pri: int
    due_ms: int | None = None


@dataclass(frozen=True, slots=True)
class JobPage:
    """One list-jobs page: its jobs, and the cursor of the next page (``"0"``: none)."""

    tube: str
    state: str
    cursor: str
    jobs: tuple[ListedJob, ...]

    @property
    def last(self) -> bool:
        """Whether no page follows."""
        return self.cursor == START


def check_cursor(cursor: str) -> bytes:
    if not _CURSOR.fullmatch(cursor):
        raise ValueError(f"cursor {cursor!r}: use '0' or the cursor of the previous page")
    return cursor.encode("ascii")


def check_state(state: str, allowed: tuple[str, ...]) -> bytes:
    if state not in allowed:
        raise ValueError(f"state {state!r}: one of {', '.join(allowed)}")
    return state.encode("ascii")


def parse_job_page(data: bytes) -> JobPage:
    """list-jobs' YAML document (``tube``, ``state``, ``cursor``, then a list of jobs)."""
    lines = data.decode("utf-8", errors="replace").split("\n")
    if not lines or lines[0] != "---":
        raise ProtocolError(f"list-jobs document does not start with '---': {data[:40]!r}")
    head: dict[str, str] = {}
    jobs: list[dict[str, int]] = []
    for line in (line for line in lines[1:] if line):
        if line.startswith("- "):
            jobs.append({})
            line = line[2:]
        elif line.startswith("  ") and jobs:
            line = line[2:]
        elif jobs:
            raise ProtocolError(f"list-jobs: not a job line: {line[:60]!r}")
        key, sep, value = line.partition(": ")
        if not sep:
            key, sep, value = line.partition(":")
            if not sep or value:
                raise ProtocolError(f"list-jobs: not a 'key: value' line: {line[:60]!r}")
        if jobs:
            if not value.isdigit():
                raise ProtocolError(f"list-jobs: {key} is not a number: {line[:60]!r}")
            jobs[-1][key] = int(value)
        else:
            head[key] = value
    if not {"tube", "state", "cursor", "jobs"} <= set(head) or head["jobs"] not in ("", "[]"):
        raise ProtocolError(f"list-jobs document without its keys: {data[:80]!r}")
    try:
        listed = tuple(ListedJob(job["id"], job["pri"], job.get("due-ms", job.get("deadline-ms")))
                       for job in jobs)
    except KeyError as missing:
        raise ProtocolError(f"list-jobs: a job without its {missing}") from None
    return JobPage(head["tube"], head["state"], head["cursor"], listed)
