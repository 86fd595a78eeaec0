"""The beanstalkd command grammar, sans-IO: one command line (its CRLF removed) in, a command
out (tubeq.protocol.commands), or the rejection beanstalkd 1.12 answers it with.

Owns command recognition (the word tables, beanstalkd's prefix matching and its order), the
argument grammar of every command and extension, and the headers of the lines a body follows
(put, put-with, schedule-add). The framing around it (lines, bodies, batches) is
tubeq.protocol.parser's; the numbers it checks against are tubeq.protocol.limits'.

Rules: no I/O; client input never raises out of :func:`parse_line` (every bad line becomes a
``Rejected``); outcomes follow beanstalkd 1.12's ``prot.c`` (``which_cmd``, ``dispatch_cmd``,
``read_u32``, ``read_tube_name``), quirks included: see tubeq.protocol.parser's header.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

from tubeq.model import options, recurring
from tubeq.protocol import replies
from tubeq.protocol.batch_framing import PUT_MANY_MAX, PutManyHeader
from tubeq.protocol.commands import (
    BEANSTALKD_COMMANDS,
    EXTENSION_COMMANDS,
    Auth,
    Bury,
    Cancel,
    ChangeDelay,
    ChangePri,
    ClearTube,
    Command,
    Delete,
    DeleteMany,
    Extensions,
    Fail,
    Finish,
    HandBack,
    Ignore,
    Kick,
    KickJob,
    ListJobs,
    ListTubes,
    ListTubesWatched,
    ListTubeUsed,
    PauseTube,
    Peek,
    PeekBuried,
    PeekDelayed,
    PeekKey,
    PeekReady,
    Push,
    Put,
    PutMany,
    PutWith,
    Quiet,
    Quit,
    Rejected,
    Release,
    ReportProgress,
    Reserve,
    ReserveJob,
    ReserveMany,
    ReserveWithTimeout,
    ScheduleAdd,
    ScheduleList,
    ScheduleRemove,
    Stats,
    StatsJob,
    StatsTube,
    Touch,
    TubePause,
    TubeResume,
    TubeSet,
    Use,
    Wait,
    WaitMs,
    Watch,
)
from tubeq.protocol.limits import (
    C_LONG_MAX,
    C_LONG_MIN,
    C_ULONG_MAX,
    LIST_JOBS_MAX,
    MAX_TUBE_NAME,
    TUBE_NAME_CHARS,
    U32_MAX,
    U64_MAX,
)

# C isspace() in the "C" locale: what strtol/strtoul skip before the number.
_C_SPACE: Final = b" \t\n\v\f\r"

REJECT_BAD_FORMAT: Final = Rejected(reply=replies.BAD_FORMAT)
REJECT_UNKNOWN_COMMAND: Final = Rejected(reply=replies.UNKNOWN_COMMAND)
# An extension's body (schedule-add) too big or not ended by CRLF: put's replies, but no cmd-put
# counted and no job id used up (beanstalkd's put does both; nothing else has a body there).
REJECT_JOB_TOO_BIG: Final = Rejected(reply=replies.JOB_TOO_BIG)
REJECT_EXPECTED_CRLF: Final = Rejected(reply=replies.EXPECTED_CRLF)

# ---------------------------------------------------------------------------------------------
# The argument grammar
# ---------------------------------------------------------------------------------------------


class _BadFormat(Exception):
    """An argument failed to parse; ``counted_as`` is the stat beanstalkd still counted for it."""

    def __init__(self, counted_as: str | None = None) -> None:
        super().__init__(counted_as)
        self.counted_as = counted_as


class _Refused(Exception):
    """A line that parsed but is refused with its own reply (an extension's BAD_OPTION)."""

    def __init__(self, reply: bytes) -> None:
        super().__init__(reply)
        self.reply = reply


# Option texts parsed lately, by the specs they were parsed for: a client sends the same few
# again and again (a call's ``tube=... notify-ms=...``), and an Options is immutable. At most
# _OPTIONS_SEEN_MAX texts of at most _OPTIONS_SEEN_BYTES (then forgotten all at once: ~300 KiB);
# refused texts are not kept, nor texts that name one job (a dedupe key, a traceparent, its
# parents: they seldom come twice, and would push out the ones that do). ``specs`` are
# module constants: their id() names them.
_OPTIONS_SEEN: dict[tuple[bytes, int], options.Options] = {}
_OPTIONS_SEEN_MAX: Final = 1024
_OPTIONS_SEEN_BYTES: Final = 200


def _options(text: bytes, specs: Mapping[str, options.Spec]) -> options.Options:
    """The ``name=value`` options ending an extension line (tubeq.model.options)."""
    key = (text, id(specs))
    seen = _OPTIONS_SEEN.get(key)
    if seen is not None:
        return seen
    try:
        parsed = options.parse(text, specs)
    except options.BadFormat:
        raise _BadFormat from None
    except options.BadOption as refused:
        raise _Refused(replies.bad_option(refused.name)) from None
    if len(text) <= _OPTIONS_SEEN_BYTES and b"key=" not in text \
            and b"traceparent=" not in text and b"after=" not in text:
        if len(_OPTIONS_SEEN) >= _OPTIONS_SEEN_MAX:
            _OPTIONS_SEEN.clear()
        _OPTIONS_SEEN[key] = parsed
    return parsed


_NAME_RUN: Final = b"[" + re.escape(TUBE_NAME_CHARS) + b"]"
# A valid tube name, matched against the whole of its text.
_TUBE_NAME: Final = re.compile(b"(?!-)" + _NAME_RUN + b"{1,%d}" % MAX_TUBE_NAME)
# read_u32 / read_u64: skip spaces (only spaces), then at least one decimal digit; no sign.
_UNSIGNED: Final = re.compile(rb" *+([0-9]++)")
# put's four read_u32 arguments at once.
_PUT_ARGS: Final = re.compile(rb" *+([0-9]++) *+([0-9]++) *+([0-9]++) *+([0-9]++)")
# A whole put line as clients write it (Parser._read_whole_put): one space before each number.
WHOLE_PUT_LINE: Final = re.compile(rb"put" + rb" ([0-9]{1,10})" * 4 + rb"\r\n")
# read_tube_name (pause-tube only): skip spaces, then the longest run of name bytes.
_NAME_TOKEN: Final = re.compile(rb" *+(" + _NAME_RUN + rb"++)")
# strtol / strtoul in base 10: C whitespace, an optional sign, then digits (maybe none).
_C_INTEGER: Final = re.compile(b"[" + re.escape(_C_SPACE) + rb"]*+([+-]?)([0-9]*+)")


def _read_unsigned(text: bytes, pos: int, maximum: int) -> tuple[int, int]:
    """Read a u32/u64 at ``pos`` as beanstalkd's read_u32 does; return it and where it ended."""
    match = _UNSIGNED.match(text, pos)
    if match is None:
        raise _BadFormat
    value = int(match[1])
    if value > maximum:
        raise _BadFormat
    return value, match.end()


def _expect_end(text: bytes, pos: int) -> None:
    """The last argument must end the line: no trailing space or garbage."""
    if pos != len(text):
        raise _BadFormat


def _read_last_unsigned(text: bytes, pos: int, maximum: int) -> int:
    value, end = _read_unsigned(text, pos, maximum)
    _expect_end(text, end)
    return value


def _tube_name(text: bytes) -> str:
    """The whole of ``text`` as a tube name: 1-200 name bytes, not starting with '-'."""
    if _TUBE_NAME.fullmatch(text) is None:
        raise _BadFormat
    return text.decode("ascii")


def _c_integer(text: bytes) -> tuple[bool, int | None]:
    """strtol/strtoul's view of ``text``: (negative sign?, magnitude or None if no digits)."""
    match = _C_INTEGER.match(text)
    assert match is not None  # every part of the pattern may match empty
    sign, digits = match.groups()
    return sign == b"-", int(digits) if digits else None


# ---------------------------------------------------------------------------------------------
# One parser per command word. Each takes the rest of the line after the word.
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)  # not frozen: one per put, and a frozen __init__ costs 4x (0.45 us)
class PutHeader:
    """A parsed ``put`` line; what happens next depends on the parser's max job size."""

    pri: int
    delay: int
    ttr: int
    size: int
    trailing_garbage: bool
    # put-with: its options (None for a put), and the reply refusing them once the body is read
    options: options.Options | None = None
    refusal: bytes | None = None


@dataclass(slots=True)
class BodyHeader:
    """An extension line whose body of ``size`` bytes follows; ``build(body)`` is its command.

    A line refused after its size was read still has its body swallowed (``build`` then
    returns the refusal), so a body is never parsed as commands (put's 1.12 quirk stays put's).
    """

    size: int
    build: Callable[[bytes], Command]


Parsed: TypeAlias = Command | PutHeader | BodyHeader
# A line followed by a body (one tuple, built once: the check runs for every command line).
BODY_HEADERS: Final = (PutHeader, BodyHeader)
_ArgParser: TypeAlias = Callable[[bytes], Parsed]


def _put(args: bytes) -> PutHeader:
    # The usual line in one match; anything else goes the argument-by-argument way below,
    # which finds the same values or the same error.
    match = _PUT_ARGS.match(args)
    if match is not None:
        pri, delay, ttr, size = map(int, match.groups())
        if max(pri, delay, ttr, size) <= U32_MAX:
            return PutHeader(pri, delay, ttr, size, trailing_garbage=match.end() != len(args))
    pri, pos = _read_unsigned(args, 0, U32_MAX)
    delay, pos = _read_unsigned(args, pos, U32_MAX)
    ttr, pos = _read_unsigned(args, pos, U32_MAX)
    size, pos = _read_unsigned(args, pos, U32_MAX)
    # Trailing garbage is judged later: 1.12 checks the size limit first (see Parser._begin_body).
    return PutHeader(pri, delay, ttr, size, trailing_garbage=pos != len(args))


def _no_args(command: Callable[[], Command]) -> _ArgParser:
    """A command word that must end the line, e.g. ``stats`` (``stats `` is BAD_FORMAT)."""

    def parse(args: bytes) -> Command:
        _expect_end(args, 0)
        return command()

    return parse


def _job_id(command: Callable[[int], Command]) -> _ArgParser:
    """A command whose one argument is a job id (u64) that ends the line."""

    def parse(args: bytes) -> Command:
        return command(_read_last_unsigned(args, 0, U64_MAX))

    return parse


def _tube(command: Callable[[str], Command]) -> _ArgParser:
    """A command whose argument is the whole rest of the line, a tube name."""

    def parse(args: bytes) -> Command:
        return command(_tube_name(args))

    return parse


def _release(args: bytes) -> Command:
    job_id, pos = _read_unsigned(args, 0, U64_MAX)
    pri, pos = _read_unsigned(args, pos, U32_MAX)
    return Release(job_id, pri, _read_last_unsigned(args, pos, U32_MAX))


def _bury(args: bytes) -> Command:
    job_id, pos = _read_unsigned(args, 0, U64_MAX)
    return Bury(job_id, _read_last_unsigned(args, pos, U32_MAX))


@functools.lru_cache(maxsize=256)  # workers repeat the same timeout line by line
def _reserve_with_timeout(args: bytes) -> Command:
    # 1.12 reads the timeout with strtol into an int: no digits is 0, trailing text is ignored,
    # only overflowing `long` fails; the cast keeps the low 32 bits, so 4294967296 is 0 and a
    # negative result means wait forever.
    negative, magnitude = _c_integer(args)
    value = 0 if magnitude is None else -magnitude if negative else magnitude
    if not C_LONG_MIN <= value <= C_LONG_MAX:
        raise _BadFormat
    return ReserveWithTimeout((value + 2**31) % 2**32 - 2**31)


def _kick(args: bytes) -> Command:
    # kick reads its bound with strtoul, cast to unsigned int: no digits fails, trailing text is
    # ignored, a magnitude past unsigned long fails, a '-' negates modulo 2**64 (so -1 kicks all),
    # and the cast keeps the low 32 bits (4294967297 kicks 1).
    negative, magnitude = _c_integer(args)
    if magnitude is None or magnitude > C_ULONG_MAX:
        raise _BadFormat
    return Kick((-magnitude if negative else magnitude) % 2**32)


def _pause_tube(args: bytes) -> Command:
    # pause-tube tokenizes with read_tube_name: optional spaces, the longest run of name bytes,
    # then a u32 delay that ends the line. 1.12 increments cmd-pause-tube after that and only
    # then validates the name (length, leading '-'), so those failures still count.
    token = _NAME_TOKEN.match(args)
    if token is None:
        raise _BadFormat
    delay = _read_last_unsigned(args, token.end(), U32_MAX)
    try:
        tube = _tube_name(token[1])
    except _BadFormat:
        raise _BadFormat(counted_as=PauseTube.stat) from None
    return PauseTube(tube, delay)


def _quit(args: bytes) -> Command:
    return Quit()  # 1.12 closes on any line that starts with "quit"


# Every beanstalkd command's argument parser; its word is the command's (``word``, in
# tubeq.protocol.commands, whose COMMANDS order the word tables below follow). Recognition rule
# (reproduces beanstalkd 1.12's which_cmd, an ordered case-sensitive prefix match): a line belongs
# to the LONGEST word it starts with, and the rest of the line goes to that word's parser; no word
# at all is UNKNOWN_COMMAND.
# Longest-first is 1.12's order wherever two words are prefixes of each other (reserve-job,
# reserve-with-timeout before reserve; stats-job, stats-tube before stats; list-tubes-watched
# before list-tubes). So a word spelled with its space ("put ") needs the space, a word without
# ("stats", "reserve", "pause-tube", "quit") also claims longer lines, which its parser rejects with
# BAD_FORMAT (or, for quit and pause-tube, accepts: "quitnow" quits, "pause-tubefoo 0" pauses foo).
_BEANSTALKD_GRAMMAR: Final[Mapping[type[Command], _ArgParser]] = {
    Put: _put,
    Use: _tube(Use),
    Reserve: _no_args(Reserve),
    ReserveWithTimeout: _reserve_with_timeout,
    ReserveJob: _job_id(ReserveJob),
    Delete: _job_id(Delete),
    Release: _release,
    Bury: _bury,
    Touch: _job_id(Touch),
    Watch: _tube(Watch),
    Ignore: _tube(Ignore),
    Peek: _job_id(Peek),
    PeekReady: _no_args(PeekReady),
    PeekDelayed: _no_args(PeekDelayed),
    PeekBuried: _no_args(PeekBuried),
    Kick: _kick,
    KickJob: _job_id(KickJob),
    StatsJob: _job_id(StatsJob),
    StatsTube: _tube(StatsTube),
    Stats: _no_args(Stats),
    ListTubes: _no_args(ListTubes),
    ListTubeUsed: _no_args(ListTubeUsed),
    ListTubesWatched: _no_args(ListTubesWatched),
    Quit: _quit,
    PauseTube: _pause_tube,
}


# -- tubeq's extensions: push, tube-set (protocol.md, "Extensions") ---------------------------


def _push(args: bytes) -> Command:
    credits, end = _read_unsigned(args, 0, U32_MAX)
    given = dict(_options(args[end:], options.PUSH_OPTIONS))
    return Push(credits, cancels=bool(given.get("cancels", 0)),
                quiet=bool(given.get("quiet", 0)))


# A connection's token in ``quiet conn <token>``: '<instance id>:<number>', printable ASCII.
_CONN_TOKEN: Final = re.compile(rb"[!-~]{1,200}")


def _quiet(args: bytes) -> Command:
    """``all``, ``tube <name>`` or ``conn <token>``."""
    if args == b"all":
        return Quiet("all")
    scope, _, target = args.partition(b" ")
    if scope == b"tube":
        return Quiet("tube", _tube_name(target))
    if scope == b"conn" and _CONN_TOKEN.fullmatch(target) is not None:
        return Quiet("conn", target.decode("ascii"))
    raise _BadFormat


# A tube name token inside a line (then a space or the end): the longest run of name bytes.
_TUBE_TOKEN: Final = re.compile(_NAME_RUN + b"++")


def _tube_set(args: bytes) -> Command:
    token = _TUBE_TOKEN.match(args)
    if token is None:
        raise _BadFormat
    settings = _options(args[token.end():], options.TUBE_SETTINGS)
    if not settings:
        raise _BadFormat  # nothing to set
    return TubeSet(_tube_name(token[0]), settings)


# -- recurring jobs ----------------------------------------------------------------------------

# schedule-add's positional arguments: tube, schedule name, body size (options follow).
_SCHEDULE_ADD: Final = re.compile(b"(" + _NAME_RUN + b"++) (" + _NAME_RUN + b"++) ([0-9]++)")


def _schedule_add(args: bytes) -> BodyHeader:
    match = _SCHEDULE_ADD.match(args)
    if match is None:
        raise _BadFormat
    size = int(match[3])
    if size > U32_MAX:
        raise _BadFormat
    try:
        command = _schedule(match[1], match[2], args[match.end():])
    except _BadFormat:
        return BodyHeader(size, lambda _: REJECT_BAD_FORMAT)
    except _Refused as refused:
        refusal = Rejected(reply=refused.reply)
        return BodyHeader(size, lambda _: refusal)
    return BodyHeader(size, lambda body: command(body))


def _schedule(tube: bytes, name: bytes, rest: bytes) -> Callable[[bytes], ScheduleAdd]:
    """schedule-add's line, checked: a function of the body making the command."""
    tube_name, schedule_name = _tube_name(tube), _tube_name(name)
    given = dict(_options(rest, options.SCHEDULE_OPTIONS))
    cron, every = given.get("cron"), given.get("every-ms")
    if cron is None and every is None:
        raise _BadFormat  # a schedule needs one or the other
    if cron is not None and every is not None:
        raise _Refused(replies.bad_option("every-ms"))
    if cron is not None:
        try:
            kind, spec = recurring.CRON, recurring.cron_expression(str(cron))
        except recurring.BadSchedule:
            raise _Refused(replies.bad_option("cron")) from None
    else:
        if int(every or 0) < recurring.MIN_EVERY_MS:
            raise _Refused(replies.bad_option("every-ms"))
        kind, spec = recurring.EVERY_MS, str(every)
    pri = int(given.get("pri", SCHEDULE_DEFAULT_PRI))
    ttr = max(int(given.get("ttr", SCHEDULE_DEFAULT_TTR)), 1)  # as put: 0 is raised to 1
    delay_ms = int(given.get("delay-ms", 0))
    return lambda body: ScheduleAdd(tube_name, schedule_name, kind, spec, pri, ttr, delay_ms,
                                    body)


# What a schedule's jobs get when schedule-add names no pri / ttr: the bundled client's put
# defaults (tubeq.client.wire), so a scheduled job looks like a job put with that client.
SCHEDULE_DEFAULT_PRI: Final = 2**31
SCHEDULE_DEFAULT_TTR: Final = 60


def _schedule_remove(args: bytes) -> Command:
    tube, space, name = args.partition(b" ")
    if not space:
        raise _BadFormat
    return ScheduleRemove(_tube_name(tube), _tube_name(name))


# -- admin verbs: clear-tube, list-jobs, change-pri, change-delay, tube-pause,
# tube-resume. Positional arguments only, separated by spaces as beanstalkd's are.


# What clear-tube may clear: one state, or all four a worker does not hold. Reserved jobs are
# never cleared (protocol.md, "clear-tube").
_CLEAR_STATES: Final[Mapping[bytes, tuple[str, ...]]] = {
    b"ready": ("ready",), b"delayed": ("delayed",), b"buried": ("buried",), b"held": ("held",),
    b"all": ("ready", "delayed", "buried", "held"),
}
_LIST_STATES: Final = frozenset({b"ready", b"delayed", b"buried", b"reserved", b"held"})
# A list-jobs cursor: 0 (the start), or the score and id of the last job seen. '-' and not ':'
# joins them, so a YAML reader takes the cursor for a string (1024:57 is a YAML 1.1 number).
_CURSOR: Final = re.compile(rb"([0-9]{1,16})-([0-9]{1,20})")
# Scores are whole numbers below 2**53 (priorities, due times in ms, sequences): exact doubles.
_MAX_SCORE: Final = 2**53


def _tokens(args: bytes, n: int) -> list[bytes]:
    """Exactly ``n`` arguments separated by one or more spaces; none before or after."""
    if args.startswith(b" ") or args.endswith(b" "):
        raise _BadFormat
    tokens = [token for token in args.split(b" ") if token]
    if len(tokens) != n:
        raise _BadFormat
    return tokens


def _count(token: bytes, maximum: int) -> int:
    """A decimal argument from 1 to ``maximum``."""
    if not token.isdigit() or not 1 <= int(token) <= maximum:
        raise _BadFormat
    return int(token)


def _clear_tube(args: bytes) -> Command:
    tube, state = _tokens(args, 2)
    states = _CLEAR_STATES.get(state)
    if states is None:
        raise _BadFormat
    return ClearTube(_tube_name(tube), states)


def _list_jobs(args: bytes) -> Command:
    tube, state, cursor, count = _tokens(args, 4)
    if state not in _LIST_STATES:
        raise _BadFormat
    position: tuple[int, int] | None = None
    if cursor != b"0":
        match = _CURSOR.fullmatch(cursor)
        if match is None:
            raise _BadFormat
        score, job_id = int(match[1]), int(match[2])
        if score >= _MAX_SCORE or job_id > U64_MAX:
            raise _BadFormat
        position = (score, job_id)
    return ListJobs(_tube_name(tube), state.decode(), position, _count(count, LIST_JOBS_MAX))


def _change_pri(args: bytes) -> Command:
    job_id, pos = _read_unsigned(args, 0, U64_MAX)
    return ChangePri(job_id, _read_last_unsigned(args, pos, U32_MAX))


def _change_delay(args: bytes) -> Command:
    job_id, pos = _read_unsigned(args, 0, U64_MAX)
    return ChangeDelay(job_id, _read_last_unsigned(args, pos, options.MAX_MS))


# -- batches: put-many's line (its entries are tubeq.protocol.batch_framing's),
# reserve-many and delete-many.


def _put_many(args: bytes) -> Command:
    return PutManyHeader(_read_last_unsigned(args, 0, U32_MAX))


def _reserve_many(args: bytes) -> Command:
    count, pos = _read_unsigned(args, 0, U32_MAX)
    seconds = _read_last_unsigned(args, pos, U32_MAX)
    if not 1 <= count <= PUT_MANY_MAX:
        raise _BadFormat
    return ReserveMany(count, seconds)


# One job id of delete-many: 1-20 digits (any u64), ids separated by exactly one space.
_ID_TOKEN: Final = re.compile(rb"[0-9]{1,20}")


def _delete_many(args: bytes) -> Command:
    ids = []
    for token in args.split(b" "):
        if _ID_TOKEN.fullmatch(token) is None:
            raise _BadFormat
        job_id = int(token)
        if job_id > U64_MAX:
            raise _BadFormat
        ids.append(job_id)
    return DeleteMany(tuple(ids))


# -- job policies and deduplicated put (put-with, peek-key) --------------------------------------


def _put_with(args: bytes) -> PutHeader:
    # put's four numbers, then options. Once the numbers parse the size is known, so the body
    # is read (or swallowed) whatever the options: a refused option is answered after it, and
    # the body is never taken for commands (put's trailing-garbage accident is not copied).
    match = _PUT_ARGS.match(args)  # (the same values or error as four _read_unsigned)
    if match is None:
        raise _BadFormat
    pri, delay, ttr, size = map(int, match.groups())
    if max(pri, delay, ttr, size) > U32_MAX:
        raise _BadFormat
    pos = match.end()
    header = PutHeader(pri, delay, ttr, size, trailing_garbage=False, options=())
    try:
        header.options = _options(args[pos:], options.PUT_WITH_OPTIONS)
    except _BadFormat:
        header.refusal = replies.BAD_FORMAT
    except _Refused as refused:
        header.refusal = refused.reply
    else:
        names = {name for name, _ in header.options}
        if delay and "delay-ms" in names:
            header.refusal = replies.bad_option("delay-ms")  # two delays: which one?
        elif "notify-ms" in names and "wait-ms" in names:
            header.refusal = replies.bad_option("notify-ms")  # one way to hear the end
    return header


def _peek_key(args: bytes) -> Command:
    key = options.PUT_OPTIONS["key"].convert(args)
    if not isinstance(key, str):
        raise _BadFormat
    return PeekKey(key)


# -- ends: finish, wait --------------------------------------------------------------------------


def _with_body(command: Callable[[int, bytes], Command]) -> _ArgParser:
    """``<id> <bytes>`` and a body (finish's result, fail's error)."""

    def parse(args: bytes) -> BodyHeader:
        job_id, pos = _read_unsigned(args, 0, U64_MAX)
        size = _read_last_unsigned(args, pos, U32_MAX)
        return BodyHeader(size, lambda body: command(job_id, body))

    return parse


def _fail(args: bytes) -> BodyHeader:
    """``<id> <bytes>``, then FAIL_OPTIONS, and the error as the body: read whatever the
    options say (a refused one is answered after it, as put-with's)."""
    job_id, pos = _read_unsigned(args, 0, U64_MAX)
    size, pos = _read_unsigned(args, pos, U32_MAX)
    try:
        given = _options(args[pos:], options.FAIL_OPTIONS)
    except _BadFormat:
        return BodyHeader(size, lambda _: REJECT_BAD_FORMAT)
    except _Refused as refused:
        refusal = Rejected(reply=refused.reply)
        return BodyHeader(size, lambda _: refusal)
    return BodyHeader(size, lambda body: Fail(job_id, body, given))


def _wait(command: Callable[[int, int, int | None], Command], unit_ms: int,
          maximum: int) -> _ArgParser:
    """``<id> <timeout>``, the timeout in units of ``unit_ms`` up to ``maximum``, then the
    option ``progress=<n>``."""

    def parse(args: bytes) -> Command:
        job_id, pos = _read_unsigned(args, 0, U64_MAX)
        timeout, pos = _read_unsigned(args, pos, maximum)
        progress_after = dict(_options(args[pos:], options.WAIT_OPTIONS)).get("progress")
        return command(job_id, timeout * unit_ms,
                       None if progress_after is None else int(progress_after))

    return parse


# -- namespaces: auth -------------------------------------------------------------------------

# A token: printable ASCII without spaces, as long as a tube name may be.
_TOKEN: Final = re.compile(rb"[!-~]{1,200}")


def _auth(args: bytes) -> Command:
    if _TOKEN.fullmatch(args) is None:
        raise _BadFormat
    return Auth(args.decode("ascii"))


# tubeq's own commands' argument parsers (protocol.md, "Extensions").
_EXTENSION_GRAMMAR: Final[Mapping[type[Command], _ArgParser]] = {
    Push: _push,
    Quiet: _quiet,
    Extensions: _no_args(Extensions),
    TubeSet: _tube_set,
    # recurring jobs
    ScheduleAdd: _schedule_add,
    ScheduleList: _tube(ScheduleList),
    ScheduleRemove: _schedule_remove,
    # admin verbs
    ClearTube: _clear_tube,
    ListJobs: _list_jobs,
    ChangePri: _change_pri,
    ChangeDelay: _change_delay,
    TubePause: _tube(TubePause),
    TubeResume: _tube(TubeResume),
    # batches
    PutMany: _put_many,
    ReserveMany: _reserve_many,
    DeleteMany: _delete_many,
    # job policies and deduplicated put
    PutWith: _put_with,
    PeekKey: _peek_key,
    # ends
    Finish: _with_body(Finish),
    Fail: _fail,
    ReportProgress: _with_body(ReportProgress),
    HandBack: _job_id(HandBack),
    Cancel: _job_id(Cancel),
    Wait: _wait(Wait, 1000, U32_MAX),
    WaitMs: _wait(WaitMs, 1, options.MAX_MS),
    # namespaces
    Auth: _auth,
}


def _word_table(commands: tuple[type[Command], ...],
                grammar: Mapping[type[Command], _ArgParser]) -> dict[bytes, _ArgParser]:
    """Each of ``commands`` that has a word, in their order: its word and its parser. A worded
    command without a parser, or a parser of no such command, fails the import."""
    table = {command.word: grammar[command] for command in commands if command.word is not None}
    if len(table) != len(grammar):
        raise LookupError(f"parsers of unlisted commands: {set(grammar).difference(commands)}")
    return table


# The word tables: beanstalkd's words, and tubeq's own (words beanstalkd answers UNKNOWN_COMMAND,
# so a client that never sends them sees beanstalkd 1.12 exactly).
COMMAND_WORDS: Final = _word_table(BEANSTALKD_COMMANDS, _BEANSTALKD_GRAMMAR)
EXTENSION_WORDS: Final = _word_table(EXTENSION_COMMANDS, _EXTENSION_GRAMMAR)
_ALL_WORDS: Final = {**COMMAND_WORDS, **EXTENSION_WORDS}

# The extension commands by name, as the ``extensions`` command lists them.
EXTENSION_NAMES: Final = tuple(sorted(word.decode().strip() for word in EXTENSION_WORDS))

# Extension words whose lines may run past LINE_MAX, up to EXT_LINE_MAX.
LONG_LINE_WORDS: Final = tuple(EXTENSION_WORDS)

_SPACED_WORDS: Final = {word: parse for word, parse in _ALL_WORDS.items() if word.endswith(b" ")}

# The recognition rule (above _BEANSTALKD_GRAMMAR) as one regex: alternatives are tried in
# order, so longest first wins.
COMMAND_WORD: Final = re.compile(
    b"|".join(re.escape(word) for word in sorted(_ALL_WORDS, key=len, reverse=True))
)


def parse_line(line: bytes) -> Parsed:
    """One command line (CRLF removed) to a command, a rejection, or a put header."""
    if b"\0" in line:
        # 1.12 checks strlen() against the line length before anything else
        return REJECT_BAD_FORMAT
    space = line.find(b" ")
    # No word contains a space inside, so a word that ends with one and matches up to the
    # line's first space is the longest match, the one the regex would find.
    parse = _SPACED_WORDS.get(line[: space + 1]) if space > 0 else None
    if parse is not None:
        args = line[space + 1 :]
    else:
        word = COMMAND_WORD.match(line)
        if word is None:
            return REJECT_UNKNOWN_COMMAND
        parse, args = _ALL_WORDS[word[0]], line[word.end() :]
    try:
        return parse(args)
    except _BadFormat as error:
        if error.counted_as is None:
            return REJECT_BAD_FORMAT
        return Rejected(reply=replies.BAD_FORMAT, counted_as=error.counted_as)
    except _Refused as refused:
        return Rejected(reply=refused.reply)
