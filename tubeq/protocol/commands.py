"""The commands a client can send, as frozen dataclasses: the parser's output, the server's input.

Each class carries ``stat``: the name of the beanstalkd ``cmd-*`` counter the command increments
(``None`` for commands beanstalkd does not count: reserve-job, kick-job, quit). A command is counted
once it has parsed, whatever its outcome (NOT_FOUND, TIMED_OUT ... included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tubeq.model.options import Options


@dataclass(frozen=True, slots=True)
class Command:
    stat: ClassVar[str | None] = None


@dataclass(frozen=True, slots=True)
class Put(Command):
    """A complete put (body and CRLF arrived); ``ttr`` as sent: the server raises 0 to 1."""

    stat: ClassVar[str | None] = "put"
    pri: int
    delay: int
    ttr: int
    body: bytes


@dataclass(frozen=True, slots=True)
class PutExpectedCrlf(Command):
    """A put whose ``bytes+2`` bytes did not end in CRLF: they were consumed; an id is used up."""

    stat: ClassVar[str | None] = "put"


@dataclass(frozen=True, slots=True)
class PutTooBig(Command):
    """A put larger than max-job-size: its ``bytes+2`` bytes were swallowed; no id is used."""

    stat: ClassVar[str | None] = "put"


@dataclass(frozen=True, slots=True)
class Rejected(Command):
    """A line the parser refused: ``reply`` is BAD_FORMAT or UNKNOWN_COMMAND.

    ``counted_as`` names a counter the line still increments, else ``None``: beanstalkd 1.12
    counts ``cmd-pause-tube`` before it validates the tube name, and ``cmd-put`` before it
    rejects trailing text after the four numbers.
    """

    reply: bytes
    counted_as: str | None = None


@dataclass(frozen=True, slots=True)
class Use(Command):
    stat: ClassVar[str | None] = "use"
    tube: str


@dataclass(frozen=True, slots=True)
class Reserve(Command):
    stat: ClassVar[str | None] = "reserve"


@dataclass(frozen=True, slots=True)
class ReserveWithTimeout(Command):
    """``seconds`` < 0 waits forever (beanstalkd 1.12's strtol-and-truncate semantics)."""

    stat: ClassVar[str | None] = "reserve-with-timeout"
    seconds: int


@dataclass(frozen=True, slots=True)
class ReserveJob(Command):
    id: int


@dataclass(frozen=True, slots=True)
class Delete(Command):
    stat: ClassVar[str | None] = "delete"
    id: int


@dataclass(frozen=True, slots=True)
class Release(Command):
    stat: ClassVar[str | None] = "release"
    id: int
    pri: int
    delay: int


@dataclass(frozen=True, slots=True)
class Bury(Command):
    stat: ClassVar[str | None] = "bury"
    id: int
    pri: int


@dataclass(frozen=True, slots=True)
class Touch(Command):
    stat: ClassVar[str | None] = "touch"
    id: int


@dataclass(frozen=True, slots=True)
class Watch(Command):
    stat: ClassVar[str | None] = "watch"
    tube: str


@dataclass(frozen=True, slots=True)
class Ignore(Command):
    stat: ClassVar[str | None] = "ignore"
    tube: str


@dataclass(frozen=True, slots=True)
class Peek(Command):
    stat: ClassVar[str | None] = "peek"
    id: int


@dataclass(frozen=True, slots=True)
class PeekReady(Command):
    stat: ClassVar[str | None] = "peek-ready"


@dataclass(frozen=True, slots=True)
class PeekDelayed(Command):
    stat: ClassVar[str | None] = "peek-delayed"


@dataclass(frozen=True, slots=True)
class PeekBuried(Command):
    stat: ClassVar[str | None] = "peek-buried"


@dataclass(frozen=True, slots=True)
class Kick(Command):
    stat: ClassVar[str | None] = "kick"
    bound: int


@dataclass(frozen=True, slots=True)
class KickJob(Command):
    id: int


@dataclass(frozen=True, slots=True)
class StatsJob(Command):
    stat: ClassVar[str | None] = "stats-job"
    id: int


@dataclass(frozen=True, slots=True)
class StatsTube(Command):
    stat: ClassVar[str | None] = "stats-tube"
    tube: str


@dataclass(frozen=True, slots=True)
class Stats(Command):
    stat: ClassVar[str | None] = "stats"


@dataclass(frozen=True, slots=True)
class ListTubes(Command):
    stat: ClassVar[str | None] = "list-tubes"


@dataclass(frozen=True, slots=True)
class ListTubeUsed(Command):
    stat: ClassVar[str | None] = "list-tube-used"


@dataclass(frozen=True, slots=True)
class ListTubesWatched(Command):
    stat: ClassVar[str | None] = "list-tubes-watched"


@dataclass(frozen=True, slots=True)
class PauseTube(Command):
    stat: ClassVar[str | None] = "pause-tube"
    tube: str
    delay: int


@dataclass(frozen=True, slots=True)
class Push(Command):
    """tubeq's push extension: deliver ready jobs unasked, up to ``credits`` outstanding."""

    credits: int


@dataclass(frozen=True, slots=True)
class Extensions(Command):
    """tubeq's ``extensions``: list the extension words; the connection then sees extra keys."""


@dataclass(frozen=True, slots=True)
class TubeSet(Command):
    """tubeq's ``tube-set``: change a tube's settings (tubeq.model.options.TUBE_SETTINGS)."""

    tube: str
    settings: Options


# -- job policies and deduplicated put ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PutWith(Command):
    """tubeq's ``put-with``: a put with options (tubeq.model.options.PUT_OPTIONS), as parsed."""

    pri: int
    delay: int
    ttr: int
    body: bytes
    options: Options


@dataclass(frozen=True, slots=True)
class PeekKey(Command):
    """tubeq's ``peek-key``: the living job put with a dedupe key."""

    key: str


@dataclass(frozen=True, slots=True)
class Auth(Command):
    """tubeq's ``auth <token>``: enter the namespace the token maps to (tubeq.server.access)."""

    token: str
# -- admin verbs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClearTube(Command):
    """tubeq's ``clear-tube``: delete a tube's jobs in ``states`` (never reserved ones)."""

    tube: str
    states: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ListJobs(Command):
    """tubeq's ``list-jobs``: a page of up to ``count`` jobs of one state after ``cursor``
    (``None``: from the start; else the (score, id) of the last job seen)."""

    tube: str
    state: str
    cursor: tuple[int, int] | None
    count: int


@dataclass(frozen=True, slots=True)
class ChangePri(Command):
    """tubeq's ``change-pri``: a job's new priority, in any state."""

    id: int
    pri: int


@dataclass(frozen=True, slots=True)
class ChangeDelay(Command):
    """tubeq's ``change-delay``: a delayed job becomes due ``delay_ms`` from now."""

    id: int
    delay_ms: int


@dataclass(frozen=True, slots=True)
class TubePause(Command):
    """tubeq's ``tube-pause``: pause a tube with no end."""

    tube: str


@dataclass(frozen=True, slots=True)
class TubeResume(Command):
    """tubeq's ``tube-resume``: end a tube's pause, with or without an end."""

    tube: str


# -- recurring jobs -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleAdd(Command):
    """tubeq's ``schedule-add``: a tube's recurring schedule (created, or replaced by name).

    ``kind`` is ``cron`` (``spec``: the expression, fields joined by spaces) or ``every-ms``
    (``spec``: the interval in ms, as digits); the rest is what each tick puts."""

    tube: str
    name: str
    kind: str
    spec: str
    pri: int
    ttr: int
    delay_ms: int
    body: bytes


@dataclass(frozen=True, slots=True)
class ScheduleList(Command):
    """tubeq's ``schedule-list``: a tube's schedules."""

    tube: str


@dataclass(frozen=True, slots=True)
class ScheduleRemove(Command):
    """tubeq's ``schedule-remove``: stop one of a tube's schedules."""

    tube: str
    name: str


@dataclass(frozen=True, slots=True)
class Quit(Command):
    """Any line starting with ``quit``: no reply, the connection closes."""


# -- batches: put-many, reserve-many, delete-many -----------------------------------------------


@dataclass(frozen=True, slots=True)
class PutEntry:
    """One job of a put-many, complete (body and CRLF arrived); ``ttr`` as sent."""

    pri: int
    delay: int
    ttr: int
    body: bytes


@dataclass(frozen=True, slots=True)
class PutMany(Command):
    """tubeq's ``put-many``: per entry, a job to insert or the reply of a refused entry
    (JOB_TOO_BIG, EXPECTED_CRLF, BAD_FORMAT), in the order sent."""

    entries: tuple[PutEntry | bytes, ...]


@dataclass(frozen=True, slots=True)
class ReserveMany(Command):
    """tubeq's ``reserve-many``: up to ``count`` jobs once at least one is reservable, waiting
    at most ``seconds``."""

    count: int
    seconds: int


@dataclass(frozen=True, slots=True)
class DeleteMany(Command):
    """tubeq's ``delete-many``: delete each id, in the order given."""

    ids: tuple[int, ...]
