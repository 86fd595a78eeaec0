"""The beanstalkd wire protocol, sans-IO: bytes in, commands out.

Owns framing (CRLF-terminated lines, the line limit and the recovery from overlong lines), command
recognition, the argument grammar, and the ``put`` body phase, including swallowing oversize bodies
in step as they arrive (beanstalkd's bit bucket).

Rules:

* No I/O and no clock: this module imports neither asyncio nor redis. The connection feeds it bytes
  and takes :mod:`tubeq.protocol.commands` dataclasses out; replies are built in
  :mod:`tubeq.protocol.replies`.
* Client input never raises. Every bad line becomes a ``Rejected`` (or ``PutTooBig`` /
  ``PutExpectedCrlf``) and parsing resumes with the next line.
* Memory is bounded. Once ``next_command`` has returned ``None`` the parser holds less than one line
  (``LINE_MAX``; ``EXT_LINE_MAX`` for a line that starts with an extension word) or less than one
  body (``max_job_size + 2``); an overlong line and a too-big body are discarded as they arrive,
  never buffered whole. A put-many also keeps the bodies of its entries read so far, at most
  ``max_batch_bytes`` (tubeq.protocol.batch_framing owns the entries' framing).
* Outcomes follow beanstalkd 1.12 (``prot.c``: ``which_cmd``, ``dispatch_cmd``, ``read_u32``,
  ``read_tube_name``), checked against a real 1.12 over loopback, including its quirks: the
  prefix matching of command words, ``quit`` and ``pause-tube`` matched without a space, ``strtol``
  for reserve-with-timeout, ``strtoul`` for kick, the put check order, and which rejected lines
  still count in a ``cmd-*`` stat.
"""

# Two beanstalkd 1.12 accidents tubeq deliberately does NOT copy (both only touch malformed input):
#
# (a) 1.12 examines only the first CR in its read buffer (scan_line_end: one memchr). A stray CR
#     before the real CRLF hides the line end: the server keeps reading until 224 bytes have piled
#     up, then discards up to a CRLF and answers one BAD_FORMAT, losing the commands in between.
#     tubeq ends a line at the first CRLF wherever it is; a stray CR is an ordinary line byte.
#
# (b) In 1.12 a line of exactly 225 bytes (223 + CRLF) gets no reply: its CR is the last byte of
#     the full 224-byte buffer, which memchr never scans, so the line end is missed and the *next*
#     line is swallowed and answered with BAD_FORMAT (so is any length = 223 mod 224, plus CRLF).
#     tubeq treats every line longer than LINE_MAX the same way: discard up to the CRLF, answer one
#     BAD_FORMAT, parse the next line normally.

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

from tubeq.model import options, recurring
from tubeq.protocol import replies
from tubeq.protocol.batch_framing import (
    DEFAULT_MAX_BATCH_BYTES,
    PUT_MANY_MAX,
    PutManyHeader,
    PutManyReader,
)
from tubeq.protocol.commands import (
    BEANSTALKD_COMMANDS,
    EXTENSION_COMMANDS,
    Auth,
    Bury,
    ChangeDelay,
    ChangePri,
    ClearTube,
    Command,
    Delete,
    DeleteMany,
    Extensions,
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
    PutExpectedCrlf,
    PutMany,
    PutTooBig,
    PutWith,
    Quit,
    Rejected,
    Release,
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
    Watch,
)

__all__ = [
    "COMMAND_WORDS",
    "CRLF",
    "C_LONG_MAX",
    "C_LONG_MIN",
    "C_ULONG_MAX",
    "DEFAULT_MAX_JOB_SIZE",
    "EXTENSION_NAMES",
    "EXT_LINE_MAX",
    "LINE_MAX",
    "LIST_JOBS_MAX",
    "MAX_TUBE_NAME",
    "TUBE_NAME_CHARS",
    "U32_MAX",
    "U64_MAX",
    "Parser",
]

# ---------------------------------------------------------------------------------------------
# The wire vocabulary
# ---------------------------------------------------------------------------------------------

# A line ends at exactly CR LF; a lone CR or LF is an ordinary byte of the line.
CRLF: Final = b"\r\n"

# The longest tube name: beanstalkd's MAX_TUBE_NAME_LEN is 201 including the C string's NUL, so
# 200 is what 1.12 accepts (201 is BAD_FORMAT), and LINE_MAX below is sized to carry it.
MAX_TUBE_NAME: Final = 200

# The longest command line, CRLF included. It is beanstalkd's LINE_BUF_SIZE (11 + 201 + 12), just
# enough for the longest legal line: len(b"pause-tube " + b"x" * 200 + b" 4294967295\r\n") == 224.
LINE_MAX: Final = 224

# The longest line of a tubeq extension command (protocol.md, "Extensions"), CRLF included:
# room for options (a dedupe key of up to 200 bytes, several key=value pairs) and for a batch
# of job ids (about 780 ids of 20 digits). Only a line that starts with an extension word may
# pass LINE_MAX, so every beanstalkd line keeps beanstalkd's limit and its BAD_FORMAT.
EXT_LINE_MAX: Final = 16384

# The bytes a tube name is made of (beanstalkd's NAME_CHARS); a name may not start with "-".
TUBE_NAME_CHARS: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-+/;.$_()"

# pri, delay, ttr, body size and pause delay are C uint32 in beanstalkd: 1.12 answers BAD_FORMAT
# above this, so tubeq does too, and the server can rely on every value fitting 32 bits.
U32_MAX: Final = 2**32 - 1

# Job ids are C uint64 in beanstalkd: the largest id a client may name (one more is BAD_FORMAT).
U64_MAX: Final = 2**64 - 1

# beanstalkd's default max-job-size (JOB_DATA_SIZE_LIMIT_DEFAULT, its `-z` flag), so clients see
# JOB_TOO_BIG at the same size: a body of exactly this many bytes is accepted, one more is not.
DEFAULT_MAX_JOB_SIZE: Final = 65535

# reserve-with-timeout is read with strtol and kick with strtoul; on the reference build (Debian,
# x86-64, LP64) `long` is 64 bits, so these are the ranges past which they fail with ERANGE.
C_LONG_MIN: Final = -(2**63)
C_LONG_MAX: Final = 2**63 - 1
C_ULONG_MAX: Final = 2**64 - 1

# C isspace() in the "C" locale: what strtol/strtoul skip before the number.
_C_SPACE: Final = b" \t\n\v\f\r"

_BAD_FORMAT: Final = Rejected(reply=replies.BAD_FORMAT)
_UNKNOWN_COMMAND: Final = Rejected(reply=replies.UNKNOWN_COMMAND)
# An extension's body (schedule-add) too big or not ended by CRLF: put's replies, but no cmd-put
# counted and no job id used up (beanstalkd's put does both; nothing else has a body there).
_JOB_TOO_BIG: Final = Rejected(reply=replies.JOB_TOO_BIG)
_EXPECTED_CRLF: Final = Rejected(reply=replies.EXPECTED_CRLF)

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


def _options(text: bytes, specs: Mapping[str, options.Spec]) -> options.Options:
    """The ``name=value`` options ending an extension line (tubeq.model.options)."""
    try:
        return options.parse(text, specs)
    except options.BadFormat:
        raise _BadFormat from None
    except options.BadOption as refused:
        raise _Refused(replies.bad_option(refused.name)) from None


_NAME_RUN: Final = b"[" + re.escape(TUBE_NAME_CHARS) + b"]"
# A valid tube name, matched against the whole of its text.
_TUBE_NAME: Final = re.compile(b"(?!-)" + _NAME_RUN + b"{1,%d}" % MAX_TUBE_NAME)
# read_u32 / read_u64: skip spaces (only spaces), then at least one decimal digit; no sign.
_UNSIGNED: Final = re.compile(rb" *+([0-9]++)")
# put's four read_u32 arguments at once.
_PUT_ARGS: Final = re.compile(rb" *+([0-9]++) *+([0-9]++) *+([0-9]++) *+([0-9]++)")
# A whole put line as clients write it (Parser._read_whole_put): one space before each number.
_WHOLE_PUT_LINE: Final = re.compile(rb"put" + rb" ([0-9]{1,10})" * 4 + rb"\r\n")
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
class _PutHeader:
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
class _BodyHeader:
    """An extension line whose body of ``size`` bytes follows; ``build(body)`` is its command.

    A line refused after its size was read still has its body swallowed (``build`` then
    returns the refusal), so a body is never parsed as commands (put's 1.12 quirk stays put's).
    """

    size: int
    build: Callable[[bytes], Command]


_Parsed: TypeAlias = Command | _PutHeader | _BodyHeader
# A line followed by a body (one tuple, built once: the check runs for every command line).
_BODY_HEADERS: Final = (_PutHeader, _BodyHeader)
_ArgParser: TypeAlias = Callable[[bytes], _Parsed]


def _put(args: bytes) -> _PutHeader:
    # The usual line in one match; anything else goes the argument-by-argument way below,
    # which finds the same values or the same error.
    match = _PUT_ARGS.match(args)
    if match is not None:
        pri, delay, ttr, size = map(int, match.groups())
        if max(pri, delay, ttr, size) <= U32_MAX:
            return _PutHeader(pri, delay, ttr, size, trailing_garbage=match.end() != len(args))
    pri, pos = _read_unsigned(args, 0, U32_MAX)
    delay, pos = _read_unsigned(args, pos, U32_MAX)
    ttr, pos = _read_unsigned(args, pos, U32_MAX)
    size, pos = _read_unsigned(args, pos, U32_MAX)
    # Trailing garbage is judged later: 1.12 checks the size limit first (see Parser._begin_body).
    return _PutHeader(pri, delay, ttr, size, trailing_garbage=pos != len(args))


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
    return Push(_read_last_unsigned(args, 0, U32_MAX))


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


def _schedule_add(args: bytes) -> _BodyHeader:
    match = _SCHEDULE_ADD.match(args)
    if match is None:
        raise _BadFormat
    size = int(match[3])
    if size > U32_MAX:
        raise _BadFormat
    try:
        command = _schedule(match[1], match[2], args[match.end():])
    except _BadFormat:
        return _BodyHeader(size, lambda _: _BAD_FORMAT)
    except _Refused as refused:
        refusal = Rejected(reply=refused.reply)
        return _BodyHeader(size, lambda _: refusal)
    return _BodyHeader(size, lambda body: command(body))


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

# The most jobs one list-jobs page may ask for: a page is one script call (1,000 jobs measured
# 2-7 ms of Redis time on a loaded 2-core machine) and its reply stays under 64 KiB (about 20
# bytes a ready job, 45 a delayed one).
LIST_JOBS_MAX: Final = 1000

# What clear-tube may clear: one state, or all three a worker does not hold. Reserved jobs are
# never cleared (protocol.md, "clear-tube").
_CLEAR_STATES: Final[Mapping[bytes, tuple[str, ...]]] = {
    b"ready": ("ready",), b"delayed": ("delayed",), b"buried": ("buried",),
    b"all": ("ready", "delayed", "buried"),
}
_LIST_STATES: Final = frozenset({b"ready", b"delayed", b"buried", b"reserved"})
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


def _put_with(args: bytes) -> _PutHeader:
    # put's four numbers, then options. Once the numbers parse the size is known, so the body
    # is read (or swallowed) whatever the options: a refused option is answered after it, and
    # the body is never taken for commands (put's trailing-garbage accident is not copied).
    pri, pos = _read_unsigned(args, 0, U32_MAX)
    delay, pos = _read_unsigned(args, pos, U32_MAX)
    ttr, pos = _read_unsigned(args, pos, U32_MAX)
    size, pos = _read_unsigned(args, pos, U32_MAX)
    header = _PutHeader(pri, delay, ttr, size, trailing_garbage=False, options=())
    try:
        header.options = _options(args[pos:], options.PUT_OPTIONS)
    except _BadFormat:
        header.refusal = replies.BAD_FORMAT
    except _Refused as refused:
        header.refusal = refused.reply
    else:
        if delay and any(name == "delay-ms" for name, _ in header.options):
            header.refusal = replies.bad_option("delay-ms")  # two delays: which one?
    return header


def _peek_key(args: bytes) -> Command:
    key = options.PUT_OPTIONS["key"].convert(args)
    if not isinstance(key, str):
        raise _BadFormat
    return PeekKey(key)


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
_LONG_LINE_WORDS: Final = tuple(EXTENSION_WORDS)

_SPACED_WORDS: Final = {word: parse for word, parse in _ALL_WORDS.items() if word.endswith(b" ")}

# The recognition rule (above _BEANSTALKD_GRAMMAR) as one regex: alternatives are tried in
# order, so longest first wins.
_COMMAND_WORD: Final = re.compile(
    b"|".join(re.escape(word) for word in sorted(_ALL_WORDS, key=len, reverse=True))
)


def _parse_line(line: bytes) -> _Parsed:
    """One command line (CRLF removed) to a command, a rejection, or a put header."""
    if b"\0" in line:
        return _BAD_FORMAT  # 1.12 checks strlen() against the line length before anything else
    space = line.find(b" ")
    # No word contains a space inside, so a word that ends with one and matches up to the
    # line's first space is the longest match, the one the regex would find.
    parse = _SPACED_WORDS.get(line[: space + 1]) if space > 0 else None
    if parse is not None:
        args = line[space + 1 :]
    else:
        word = _COMMAND_WORD.match(line)
        if word is None:
            return _UNKNOWN_COMMAND
        parse, args = _ALL_WORDS[word[0]], line[word.end() :]
    try:
        return parse(args)
    except _BadFormat as error:
        if error.counted_as is None:
            return _BAD_FORMAT
        return Rejected(reply=replies.BAD_FORMAT, counted_as=error.counted_as)
    except _Refused as refused:
        return Rejected(reply=refused.reply)


# ---------------------------------------------------------------------------------------------
# The parser: framing and the put body phase
# ---------------------------------------------------------------------------------------------


class _Phase(enum.Enum):
    LINE = "line"  # expecting a command line
    LONG_LINE = "long-line"  # an extension line past LINE_MAX, expecting its CRLF
    OVERLONG = "overlong"  # discarding a line longer than its limit up to its CRLF
    BODY = "body"  # expecting a put body plus its CRLF
    SKIP_BODY = "skip-body"  # swallowing the size+2 bytes of a too-big put
    BATCH = "batch"  # reading the entries of a put-many (tubeq.protocol.batch_framing)


class Parser:
    """Turns the bytes of one client connection into commands, in order."""

    # one per connection
    __slots__ = ("_batch", "_buffer", "_max_batch_bytes", "_max_job_size", "_phase", "_put",
                 "_scanned", "_skip_left", "_too_big")

    def __init__(self, max_job_size: int = DEFAULT_MAX_JOB_SIZE, *,
                 max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> None:
        """Create a parser that refuses put bodies longer than ``max_job_size`` bytes, and
        put-many entries past ``max_batch_bytes`` of bodies in one batch."""
        if not 0 <= max_job_size <= U32_MAX:
            raise ValueError(f"max_job_size must be within 0..{U32_MAX}, not {max_job_size}")
        self._max_job_size = max_job_size
        self._max_batch_bytes = max_batch_bytes
        self._batch: PutManyReader | None = None  # the put-many being read (phase BATCH)
        self._buffer = bytearray()
        self._phase = _Phase.LINE
        self._put: _PutHeader | _BodyHeader | None = None  # whose body is awaited (BODY)
        self._skip_left = 0  # bytes still to swallow (phase SKIP_BODY)
        self._scanned = 0  # bytes of a long line known to hold no CRLF (phase LONG_LINE)
        self._too_big: Command = PutTooBig()  # the answer once a too-big body is swallowed

    def feed(self, data: bytes) -> None:
        """Append received bytes; call ``next_command`` until it returns None to consume them."""
        self._buffer += data

    @property
    def buffered(self) -> int:
        """The number of received bytes held and not yet turned into a command (the bodies
        of a put-many being read included)."""
        batch = self._batch
        return len(self._buffer) + (batch.held if batch is not None else 0)

    def next_command(self) -> Command | None:
        """Return the next complete command, or None when more bytes are needed."""
        while True:
            phase = self._phase
            if phase is _Phase.LINE:
                command = self._read_line()
            elif phase is _Phase.BODY:
                command = self._read_body()
            elif phase is _Phase.SKIP_BODY:
                command = self._skip_body()
            elif phase is _Phase.LONG_LINE:
                command = self._read_long_line()
            elif phase is _Phase.BATCH:
                command = self._read_batch()
            else:
                command = self._discard_overlong()
            # A phase change without a command (a put header, an overlong line) may be followed
            # by input the new phase can already use; otherwise this is the answer.
            if command is not None or self._phase is phase:
                return command

    def _read_line(self) -> Command | None:
        buffer = self._buffer
        if buffer.startswith(b"put "):
            put = self._read_whole_put()
            if put is not None:
                return put
        end = buffer.find(CRLF, 0, LINE_MAX)
        if end < 0:
            if len(buffer) >= LINE_MAX:  # LINE_MAX bytes and no CRLF: too long, unless ...
                if buffer.startswith(_LONG_LINE_WORDS):  # ... an extension line
                    self._scanned = LINE_MAX - 1  # a CR there may still end the line
                    self._phase = _Phase.LONG_LINE
                else:
                    self._phase = _Phase.OVERLONG
            return None
        return self._take_line(end)

    def _read_whole_put(self) -> Put | None:
        """The usual put, whole in the buffer, in one step: a line of four numbers with one
        space before each, its body and CRLF. Anything else (more spaces, a number past
        U32_MAX, a body too big or not yet arrived, no CRLF after it) returns None and goes
        the general way, line then body, which parses the same bytes to the same command."""
        buffer = self._buffer
        match = _WHOLE_PUT_LINE.match(buffer)
        if match is None:
            return None
        pri, delay, ttr, size = map(int, match.groups())
        start = match.end()
        end = start + size
        if (size > self._max_job_size or max(pri, delay, ttr) > U32_MAX
                or buffer[end : end + len(CRLF)] != CRLF):
            return None
        body = bytes(buffer[start:end])
        del buffer[: end + len(CRLF)]
        return Put(pri, delay, ttr, body)

    def _read_long_line(self) -> Command | None:
        buffer = self._buffer
        end = buffer.find(CRLF, self._scanned, EXT_LINE_MAX)
        if end < 0:
            if len(buffer) >= EXT_LINE_MAX:
                self._phase = _Phase.OVERLONG
            else:  # scanned once: a trickling client costs linear time, not quadratic
                self._scanned = max(len(buffer) - 1, self._scanned)
            return None
        self._phase = _Phase.LINE
        return self._take_line(end)

    def _take_line(self, end: int) -> Command | None:
        buffer = self._buffer
        line = bytes(buffer[:end])
        del buffer[: end + len(CRLF)]
        parsed = _parse_line(line)
        if isinstance(parsed, _BODY_HEADERS):
            return self._begin_body(parsed)
        if isinstance(parsed, PutManyHeader):
            return self._begin_batch(parsed)
        return parsed

    def _begin_batch(self, header: PutManyHeader) -> Command | None:
        if header.count == 0:
            return PutMany(())
        self._batch = PutManyReader(header.count, max_job_size=self._max_job_size,
                                    max_bytes=self._max_batch_bytes, line_max=EXT_LINE_MAX)
        self._phase = _Phase.BATCH
        return None

    def _read_batch(self) -> Command | None:
        assert self._batch is not None
        command = self._batch.read(self._buffer)
        if command is not None and not (type(command) is PutMany and command.more):
            self._batch = None
            self._phase = _Phase.LINE
        return command

    def _begin_body(self, header: _PutHeader | _BodyHeader) -> Command | None:
        # 1.12's order: the size limit first (its body is swallowed even if the line also has
        # trailing garbage), then trailing garbage (BAD_FORMAT, the body is then read as commands;
        # cmd-put was already counted), then the body itself.
        if header.size > self._max_job_size:
            self._skip_left = header.size + len(CRLF)
            self._phase = _Phase.SKIP_BODY
            self._too_big = _JOB_TOO_BIG if isinstance(header, _BodyHeader) else PutTooBig()
            return None
        if isinstance(header, _PutHeader) and header.trailing_garbage:
            return Rejected(reply=replies.BAD_FORMAT, counted_as=Put.stat)
        self._put = header
        self._phase = _Phase.BODY
        return None

    def _read_body(self) -> Command | None:
        header = self._put
        assert header is not None
        size = header.size
        if len(self._buffer) < size + len(CRLF):
            return None
        body = bytes(self._buffer[:size])
        terminated = self._buffer[size : size + len(CRLF)] == CRLF
        del self._buffer[: size + len(CRLF)]  # exactly size+2 bytes, whatever they are
        self._put = None
        self._phase = _Phase.LINE
        if isinstance(header, _BodyHeader):  # an extension's body (schedule-add): no id burnt
            return header.build(body) if terminated else _EXPECTED_CRLF
        if header.options is not None:  # put-with: a refused line still had its body read
            if header.refusal is not None:
                return Rejected(reply=header.refusal)
            if not terminated:
                return PutExpectedCrlf()
            return PutWith(header.pri, header.delay, header.ttr, body, header.options)
        if not terminated:
            return PutExpectedCrlf()
        return Put(header.pri, header.delay, header.ttr, body)

    def _skip_body(self) -> Command | None:
        taken = min(self._skip_left, len(self._buffer))
        del self._buffer[:taken]
        self._skip_left -= taken
        if self._skip_left:
            return None
        self._phase = _Phase.LINE
        return self._too_big

    def _discard_overlong(self) -> Command | None:
        buffer = self._buffer
        end = buffer.find(CRLF)
        if end < 0:
            # Keep a final CR: its LF may be the first byte of the next feed.
            del buffer[: len(buffer) - 1 if buffer.endswith(b"\r") else len(buffer)]
            return None
        del buffer[: end + len(CRLF)]
        self._phase = _Phase.LINE
        return _BAD_FORMAT
