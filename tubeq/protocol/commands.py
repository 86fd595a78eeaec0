"""The commands a client can send, as frozen dataclasses: the parser's output, the server's input.

Owns: the command vocabulary. Each class carries ``word``, the command word a line starts with
(with its space when arguments must follow; ``None`` for what a line or a put's body turns into
without a word of its own: a refusal, a put's bad ending), and ``stat``, the name of the
beanstalkd ``cmd-*`` counter the command increments (``None`` for commands beanstalkd does not
count: reserve-job, kick-job, quit). A command is counted once it has parsed, whatever its outcome
(NOT_FOUND, TIMED_OUT ... included).

Rules: :data:`COMMANDS` is the one list of commands, in the one order every registry of them
follows: beanstalkd's (doc/protocol.txt's order), then tubeq's extensions by feature. The
grammar's word tables are built from it (tubeq.protocol.grammar) and tests check that the
server's handler table follows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from tubeq.model.options import Options


@dataclass(frozen=True, slots=True)
class Command:
    word: ClassVar[bytes | None] = None
    stat: ClassVar[str | None] = None


@dataclass(frozen=True, slots=True)
class Put(Command):
    """A complete put (body and CRLF arrived); ``ttr`` as sent: the server raises 0 to 1."""

    word: ClassVar[bytes | None] = b"put "
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
    word: ClassVar[bytes | None] = b"use "
    stat: ClassVar[str | None] = "use"
    tube: str


@dataclass(frozen=True, slots=True)
class Reserve(Command):
    word: ClassVar[bytes | None] = b"reserve"
    stat: ClassVar[str | None] = "reserve"


@dataclass(frozen=True, slots=True)
class ReserveWithTimeout(Command):
    """``seconds`` < 0 waits forever (beanstalkd 1.12's strtol-and-truncate semantics)."""

    word: ClassVar[bytes | None] = b"reserve-with-timeout "
    stat: ClassVar[str | None] = "reserve-with-timeout"
    seconds: int


@dataclass(frozen=True, slots=True)
class ReserveJob(Command):
    word: ClassVar[bytes | None] = b"reserve-job "
    id: int


@dataclass(frozen=True, slots=True)
class Delete(Command):
    word: ClassVar[bytes | None] = b"delete "
    stat: ClassVar[str | None] = "delete"
    id: int


@dataclass(frozen=True, slots=True)
class Release(Command):
    word: ClassVar[bytes | None] = b"release "
    stat: ClassVar[str | None] = "release"
    id: int
    pri: int
    delay: int


@dataclass(frozen=True, slots=True)
class Bury(Command):
    word: ClassVar[bytes | None] = b"bury "
    stat: ClassVar[str | None] = "bury"
    id: int
    pri: int


@dataclass(frozen=True, slots=True)
class Touch(Command):
    word: ClassVar[bytes | None] = b"touch "
    stat: ClassVar[str | None] = "touch"
    id: int


@dataclass(frozen=True, slots=True)
class Watch(Command):
    word: ClassVar[bytes | None] = b"watch "
    stat: ClassVar[str | None] = "watch"
    tube: str


@dataclass(frozen=True, slots=True)
class Ignore(Command):
    word: ClassVar[bytes | None] = b"ignore "
    stat: ClassVar[str | None] = "ignore"
    tube: str


@dataclass(frozen=True, slots=True)
class Peek(Command):
    word: ClassVar[bytes | None] = b"peek "
    stat: ClassVar[str | None] = "peek"
    id: int


@dataclass(frozen=True, slots=True)
class PeekReady(Command):
    word: ClassVar[bytes | None] = b"peek-ready"
    stat: ClassVar[str | None] = "peek-ready"


@dataclass(frozen=True, slots=True)
class PeekDelayed(Command):
    word: ClassVar[bytes | None] = b"peek-delayed"
    stat: ClassVar[str | None] = "peek-delayed"


@dataclass(frozen=True, slots=True)
class PeekBuried(Command):
    word: ClassVar[bytes | None] = b"peek-buried"
    stat: ClassVar[str | None] = "peek-buried"


@dataclass(frozen=True, slots=True)
class Kick(Command):
    word: ClassVar[bytes | None] = b"kick "
    stat: ClassVar[str | None] = "kick"
    bound: int


@dataclass(frozen=True, slots=True)
class KickJob(Command):
    word: ClassVar[bytes | None] = b"kick-job "
    id: int


@dataclass(frozen=True, slots=True)
class StatsJob(Command):
    word: ClassVar[bytes | None] = b"stats-job "
    stat: ClassVar[str | None] = "stats-job"
    id: int


@dataclass(frozen=True, slots=True)
class StatsTube(Command):
    word: ClassVar[bytes | None] = b"stats-tube "
    stat: ClassVar[str | None] = "stats-tube"
    tube: str


@dataclass(frozen=True, slots=True)
class Stats(Command):
    word: ClassVar[bytes | None] = b"stats"
    stat: ClassVar[str | None] = "stats"


@dataclass(frozen=True, slots=True)
class ListTubes(Command):
    word: ClassVar[bytes | None] = b"list-tubes"
    stat: ClassVar[str | None] = "list-tubes"


@dataclass(frozen=True, slots=True)
class ListTubeUsed(Command):
    word: ClassVar[bytes | None] = b"list-tube-used"
    stat: ClassVar[str | None] = "list-tube-used"


@dataclass(frozen=True, slots=True)
class ListTubesWatched(Command):
    word: ClassVar[bytes | None] = b"list-tubes-watched"
    stat: ClassVar[str | None] = "list-tubes-watched"


@dataclass(frozen=True, slots=True)
class Quit(Command):
    """Any line starting with ``quit``: no reply, the connection closes."""

    word: ClassVar[bytes | None] = b"quit"


@dataclass(frozen=True, slots=True)
class PauseTube(Command):
    word: ClassVar[bytes | None] = b"pause-tube"
    stat: ClassVar[str | None] = "pause-tube"
    tube: str
    delay: int


# -- tubeq's extensions (protocol.md, "Extensions"): words beanstalkd answers UNKNOWN_COMMAND ---


@dataclass(frozen=True, slots=True)
class Push(Command):
    """tubeq's push extension: deliver ready jobs unasked, up to ``credits`` outstanding;
    ``cancels``: also tell at once of a held job cancelled (``CANCELLED <id>`` frames);
    ``quiet``: also tell when the server asks its consumers to stop taking jobs (``QUIET``)."""

    word: ClassVar[bytes | None] = b"push "
    credits: int
    cancels: bool = False
    quiet: bool = False


@dataclass(frozen=True, slots=True)
class Quiet(Command):
    """tubeq's ``quiet``: ask push consumers to stop taking jobs, on every process: all of the
    namespace's (``scope`` "all"), those watching a tube ("tube", the name), or one
    connection ("conn", its token)."""

    word: ClassVar[bytes | None] = b"quiet "
    scope: str
    target: str = ""


@dataclass(frozen=True, slots=True)
class Extensions(Command):
    """tubeq's ``extensions``: list the extension words; the connection then sees extra keys."""

    word: ClassVar[bytes | None] = b"extensions"


@dataclass(frozen=True, slots=True)
class TubeSet(Command):
    """tubeq's ``tube-set``: change a tube's settings (tubeq.model.options.TUBE_SETTINGS)."""

    word: ClassVar[bytes | None] = b"tube-set "
    tube: str
    settings: Options


# -- recurring jobs ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleAdd(Command):
    """tubeq's ``schedule-add``: a tube's recurring schedule (created, or replaced by name).

    ``kind`` is ``cron`` (``spec``: the expression, fields joined by spaces) or ``every-ms``
    (``spec``: the interval in ms, as digits); the rest is what each tick puts."""

    word: ClassVar[bytes | None] = b"schedule-add "
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

    word: ClassVar[bytes | None] = b"schedule-list "
    tube: str


@dataclass(frozen=True, slots=True)
class ScheduleRemove(Command):
    """tubeq's ``schedule-remove``: stop one of a tube's schedules."""

    word: ClassVar[bytes | None] = b"schedule-remove "
    tube: str
    name: str


# -- admin verbs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClearTube(Command):
    """tubeq's ``clear-tube``: delete a tube's jobs in ``states`` (never reserved ones)."""

    word: ClassVar[bytes | None] = b"clear-tube "
    tube: str
    states: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ListJobs(Command):
    """tubeq's ``list-jobs``: a page of up to ``count`` jobs of one state after ``cursor``
    (``None``: from the start; else the (score, id) of the last job seen)."""

    word: ClassVar[bytes | None] = b"list-jobs "
    tube: str
    state: str
    cursor: tuple[int, int] | None
    count: int


@dataclass(frozen=True, slots=True)
class ChangePri(Command):
    """tubeq's ``change-pri``: a job's new priority, in any state."""

    word: ClassVar[bytes | None] = b"change-pri "
    id: int
    pri: int


@dataclass(frozen=True, slots=True)
class ChangeDelay(Command):
    """tubeq's ``change-delay``: a delayed job becomes due ``delay_ms`` from now."""

    word: ClassVar[bytes | None] = b"change-delay "
    id: int
    delay_ms: int


@dataclass(frozen=True, slots=True)
class TubePause(Command):
    """tubeq's ``tube-pause``: pause a tube with no end."""

    word: ClassVar[bytes | None] = b"tube-pause "
    tube: str


@dataclass(frozen=True, slots=True)
class TubeResume(Command):
    """tubeq's ``tube-resume``: end a tube's pause, with or without an end."""

    word: ClassVar[bytes | None] = b"tube-resume "
    tube: str


# -- batches: put-many, reserve-many, delete-many ----------------------------------------------


@dataclass(frozen=True, slots=True)
class PutEntry:
    """One job of a put-many, complete (body and CRLF arrived); ``ttr`` as sent; ``group``
    its group= and ``traceparent`` its traceparent= ("" for none)."""

    pri: int
    delay: int
    ttr: int
    body: bytes
    group: str = ""
    traceparent: str = ""


@dataclass(frozen=True, slots=True)
class PutMany(Command):
    """tubeq's ``put-many``: per entry, a job to insert or the reply of a refused entry
    (JOB_TOO_BIG, EXPECTED_CRLF, BAD_FORMAT), in the order sent.

    A long batch reaches the handler in parts, as its entries arrive
    (tubeq.protocol.batch_framing.PUT_MANY_PART): ``more`` says that further entries of the
    same command follow in the next PutMany; the command's one reply comes with the last."""

    word: ClassVar[bytes | None] = b"put-many "
    entries: tuple[PutEntry | bytes, ...]
    more: bool = False


@dataclass(frozen=True, slots=True)
class ReserveMany(Command):
    """tubeq's ``reserve-many``: up to ``count`` jobs once at least one is reservable, waiting
    at most ``seconds``."""

    word: ClassVar[bytes | None] = b"reserve-many "
    count: int
    seconds: int


@dataclass(frozen=True, slots=True)
class DeleteMany(Command):
    """tubeq's ``delete-many``: delete each id, in the order given."""

    word: ClassVar[bytes | None] = b"delete-many "
    ids: tuple[int, ...]


# -- job policies and deduplicated put ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PutWith(Command):
    """tubeq's ``put-with``: a put with options (tubeq.model.options.PUT_OPTIONS), as parsed."""

    word: ClassVar[bytes | None] = b"put-with "
    pri: int
    delay: int
    ttr: int
    body: bytes
    options: Options


@dataclass(frozen=True, slots=True)
class PeekKey(Command):
    """tubeq's ``peek-key``: the living job put with a dedupe key."""

    word: ClassVar[bytes | None] = b"peek-key "
    key: str


# -- namespaces (tubeq.server.access) ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finish(Command):
    """tubeq's ``finish``: the holder of a reserved job deletes it with a result to keep."""

    word: ClassVar[bytes | None] = b"finish "
    id: int
    result: bytes


@dataclass(frozen=True, slots=True)
class Fail(Command):
    """tubeq's ``fail``: the holder of a reserved job says it failed, with an error text;
    ``options``: its retry policy where the job and its tube have none (FAIL_OPTIONS)."""

    word: ClassVar[bytes | None] = b"fail "
    id: int
    error: bytes
    options: Options = ()


@dataclass(frozen=True, slots=True)
class ReportProgress(Command):
    """tubeq's ``progress``: the holder of a reserved job reports its progress (and so touches
    it)."""

    word: ClassVar[bytes | None] = b"progress "
    id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class HandBack(Command):
    """tubeq's ``hand-back``: the holder gives a reserved job back because it is shutting
    down: ready at once, its try not counted."""

    word: ClassVar[bytes | None] = b"hand-back "
    id: int


@dataclass(frozen=True, slots=True)
class Cancel(Command):
    """tubeq's ``cancel``: the job is not to run (again)."""

    word: ClassVar[bytes | None] = b"cancel "
    id: int


@dataclass(frozen=True, slots=True)
class Wait(Command):
    """tubeq's ``wait`` (and ``wait-ms``): block until a job ends, at most ``timeout_ms``."""

    word: ClassVar[bytes | None] = b"wait "
    id: int
    timeout_ms: int
    progress_after: int | None = None  # progress=N: answer a progress past the N-th too


@dataclass(frozen=True, slots=True)
class WaitMs(Wait):
    """``wait-ms``: ``wait`` with its timeout in milliseconds; handled as a ``Wait``."""

    word: ClassVar[bytes | None] = b"wait-ms "


@dataclass(frozen=True, slots=True)
class Auth(Command):
    """tubeq's ``auth <token>``: enter the namespace the token maps to (tubeq.server.access)."""

    word: ClassVar[bytes | None] = b"auth "
    token: str


# -- the one list ------------------------------------------------------------------------------

# beanstalkd's commands: a put and what a put line may end in instead (its body too big, or not
# ended by CRLF), a refused line, then the others in the order doc/protocol.txt describes them.
BEANSTALKD_COMMANDS: Final[tuple[type[Command], ...]] = (
    Put, PutExpectedCrlf, PutTooBig, Rejected, Use, Reserve, ReserveWithTimeout, ReserveJob,
    Delete, Release, Bury, Touch, Watch, Ignore, Peek, PeekReady, PeekDelayed, PeekBuried, Kick,
    KickJob, StatsJob, StatsTube, Stats, ListTubes, ListTubeUsed, ListTubesWatched, Quit,
    PauseTube,
)
# tubeq's own, by feature: push and quiet, extensions, tube settings; recurring jobs; admin verbs;
# batches; job policies and deduplicated put; ends; namespaces.
EXTENSION_COMMANDS: Final[tuple[type[Command], ...]] = (
    Push, Quiet, Extensions, TubeSet,
    ScheduleAdd, ScheduleList, ScheduleRemove,
    ClearTube, ListJobs, ChangePri, ChangeDelay, TubePause, TubeResume,
    PutMany, ReserveMany, DeleteMany,
    PutWith, PeekKey,
    Finish, Fail, ReportProgress, HandBack, Cancel, Wait, WaitMs,
    Auth,
)
# Every command a client's bytes can parse into, in the order of the classes above.
COMMANDS: Final = BEANSTALKD_COMMANDS + EXTENSION_COMMANDS
