"""Parser unit tests: bytes in, commands out, no event loop, no server.

Every input here was replayed against a real beanstalkd 1.12 over loopback (reply class and the
cmd-put / cmd-pause-tube deltas), and agrees except for the two accidents tubeq deliberately does
not copy (stray CR, 225-byte lines; see tubeq/protocol/parser.py), whose cases say so. Each input
goes through ``check``: fed whole, fed one byte at a time, followed by a command (which must still
parse), and followed by garbage without a line end (which must stay buffered, not be misread).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tubeq.protocol import commands, grammar, replies
from tubeq.protocol.commands import (
    Bury,
    Command,
    Delete,
    Ignore,
    Kick,
    KickJob,
    ListTubes,
    ListTubesWatched,
    ListTubeUsed,
    PauseTube,
    Peek,
    PeekBuried,
    PeekDelayed,
    PeekReady,
    Push,
    Put,
    PutExpectedCrlf,
    PutTooBig,
    Quit,
    Rejected,
    Release,
    Reserve,
    ReserveJob,
    ReserveWithTimeout,
    Stats,
    StatsJob,
    StatsTube,
    Touch,
    Use,
    Watch,
)
from tubeq.protocol.limits import (
    DEFAULT_MAX_JOB_SIZE,
    EXT_LINE_MAX,
    LINE_MAX,
    MAX_TUBE_NAME,
    TUBE_NAME_CHARS,
    U32_MAX,
    U64_MAX,
)
from tubeq.protocol.parser import Parser

BAD = Rejected(reply=replies.BAD_FORMAT)
UNKNOWN = Rejected(reply=replies.UNKNOWN_COMMAND)
BAD_COUNTED_PUT = Rejected(reply=replies.BAD_FORMAT, counted_as="put")
BAD_COUNTED_PAUSE = Rejected(reply=replies.BAD_FORMAT, counted_as="pause-tube")

FOLLOWER = b"list-tube-used\r\n"
GARBAGE = b"half a line, no end"


def drain(parser: Parser) -> list[Command]:
    """Every command the parser can produce from what it holds."""
    commands = []
    while (command := parser.next_command()) is not None:
        commands.append(command)
    return commands


def bound(max_job_size: int) -> int:
    """What a drained parser may hold: less than a line, or less than a body plus CRLF."""
    return max(LINE_MAX, max_job_size + 2)


def feed_in(
    chunks: list[bytes], max_job_size: int = DEFAULT_MAX_JOB_SIZE
) -> tuple[list[Command], Parser]:
    parser = Parser(max_job_size)
    commands: list[Command] = []
    for chunk in chunks:
        parser.feed(chunk)
        commands += drain(parser)
        assert parser.buffered < bound(max_job_size)
    return commands, parser


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def check(data: bytes, expected: list[Command], max_job_size: int = DEFAULT_MAX_JOB_SIZE) -> None:
    """``data`` parses to ``expected`` however it arrives, and leaves the parser in step."""
    commands, parser = feed_in([data], max_job_size)
    assert commands == expected
    assert parser.buffered == 0
    commands, _ = feed_in(bytewise(data + FOLLOWER), max_job_size)
    assert commands == [*expected, ListTubeUsed()], "byte at a time, then a command"
    commands, _ = feed_in([data + FOLLOWER], max_job_size)
    assert commands == [*expected, ListTubeUsed()], "followed by a command"
    commands, parser = feed_in([data + GARBAGE], max_job_size)
    assert commands == expected, "followed by garbage"
    assert parser.buffered == len(GARBAGE)


def line(text: bytes) -> bytes:
    return text + b"\r\n"


def cases(*rows: tuple[bytes, Sequence[Command]]) -> pytest.MarkDecorator:
    """Parametrize ``data, expected`` with readable ids."""
    return pytest.mark.parametrize(
        ("data", "expected"), rows, ids=[repr(data)[2:-1][:60] for data, _ in rows]
    )


# --- Framing -----------------------------------------------------------------------------------


@cases(
    (line(b"stats"), [Stats()]),
    (line(b"stats") + line(b"reserve") + line(b"peek-ready"), [Stats(), Reserve(), PeekReady()]),
    (line(b""), [UNKNOWN]),
    # A lone LF or CR is part of the line, not a terminator.
    (b"list-tube-used\n" + line(b"list-tube-used"), [BAD]),
    (line(b"stats\n"), [BAD]),
    (line(b"\n"), [UNKNOWN]),
    (b"list-tube-used\r" + b"\n", [ListTubeUsed()]),
    # tubeq departure (a): a stray CR does not hide the line end (1.12 waits for 224 bytes, then
    # discards through the next CRLF and answers one BAD_FORMAT for all of it).
    (line(b"stats\r"), [BAD]),
    (line(b"sta\rts"), [UNKNOWN]),
    (line(b"quit\r"), [Quit()]),
    (line(b"use a\rb") + line(b"stats"), [BAD, Stats()]),
    (line(b"kick \r7"), [Kick(7)]),
    # NUL anywhere in a command line is BAD_FORMAT, checked before the command word.
    (line(b"stats\x00"), [BAD]),
    (line(b"\x00"), [BAD]),
    (line(b"quit\x00"), [BAD]),
    (line(b"use a\x00b"), [BAD]),
    (line(b"pause-tube\x00 x 0"), [BAD]),
    (line(b"put 0 0 10 3\x00") + line(b"abc"), [BAD, UNKNOWN]),
)
def test_framing(data: bytes, expected: list[Command]) -> None:
    check(data, expected)


def test_cr_and_lf_in_separate_feeds() -> None:
    commands, parser = feed_in([b"list-tube-used\r", b"\nstats", b"\r", b"\n"])
    assert commands == [ListTubeUsed(), Stats()]
    assert parser.buffered == 0


def test_longest_legal_line_is_exactly_line_max() -> None:
    data = line(b"pause-tube " + b"a" * MAX_TUBE_NAME + b" 4294967295")
    assert len(data) == LINE_MAX == 224
    check(data, [PauseTube("a" * MAX_TUBE_NAME, U32_MAX)])


@cases(
    # 224 bytes with CRLF: still a line, judged on its content.
    (line(b"x" * 222), [UNKNOWN]),
    (line(b"stats" + b"x" * 217), [BAD]),
    (line(b"pause-tube " + b"a" * 209 + b" 0"), [BAD_COUNTED_PAUSE]),
    # 225 bytes: too long. tubeq departure (b): 1.12 answers nothing here and eats the next line.
    (line(b"x" * 223), [BAD]),
    (line(b"pause-tube " + b"a" * 210 + b" 0"), [BAD]),
    (line(b"x" * 222 + b"\r"), [BAD]),
    # 226 bytes and more: one BAD_FORMAT once the CRLF arrives; nothing is counted.
    (line(b"x" * 224), [BAD]),
    (line(b"stats" + b" " * 300), [BAD]),
    (line(b"a" * 4998), [BAD]),
    (line(b"a" * 223 + b"\r" + b"b" * 10 + b"\n\n"), [BAD]),
    (line(b"x" * 300) + line(b"x" * 300) + line(b"stats"), [BAD, BAD, Stats()]),
    # An overlong put line does not consume a body: what follows is parsed as commands.
    (line(b"put 0 0 10 5" + b" " * 300) + line(b"hello"), [BAD, UNKNOWN]),
)
def test_line_length_limit(data: bytes, expected: list[Command]) -> None:
    check(data, expected)


def test_overlong_line_is_discarded_as_it_arrives() -> None:
    parser = Parser()
    for _ in range(16):
        parser.feed(b"z" * 65536)
        assert parser.next_command() is None
        assert parser.buffered == 0
    parser.feed(b"\r")
    assert parser.next_command() is None
    assert parser.buffered == 1  # the CR is kept: its LF may come next
    parser.feed(b"\n" + line(b"stats"))
    assert drain(parser) == [BAD, Stats()]


def test_a_line_is_abandoned_as_soon_as_it_cannot_fit() -> None:
    parser = Parser()
    parser.feed(b"x" * (LINE_MAX - 1))
    assert parser.next_command() is None
    assert parser.buffered == LINE_MAX - 1  # a CRLF could still make it a 224-byte line
    parser.feed(b"x")
    assert parser.next_command() is None
    assert parser.buffered == 0


def test_nothing_is_answered_before_an_overlong_line_ends() -> None:
    commands, parser = feed_in([b"q" * 1000])
    assert commands == []
    assert parser.buffered == 0


# --- Command recognition -----------------------------------------------------------------------

# beanstalkd 1.12's which_cmd: the first of these prefixes the line starts with wins.
WHICH_CMD_ORDER_1_12 = [
    b"put ", b"peek ", b"peek-ready", b"peek-delayed", b"peek-buried",
    b"reserve-with-timeout ", b"reserve-job ", b"reserve", b"delete ", b"release ", b"bury ",
    b"kick ", b"kick-job ", b"touch ", b"stats-job ", b"stats-tube ", b"stats", b"use ",
    b"watch ", b"ignore ", b"list-tubes-watched", b"list-tube-used", b"list-tubes", b"quit",
    b"pause-tube",
]  # fmt: skip


def first_match_1_12(text: bytes) -> bytes | None:
    return next((word for word in WHICH_CMD_ORDER_1_12 if text.startswith(word)), None)


def test_longest_word_rule_is_which_cmd_order() -> None:
    assert set(grammar.COMMAND_WORDS) == set(WHICH_CMD_ORDER_1_12)
    words = WHICH_CMD_ORDER_1_12
    probes = [a + b for a in words for b in [*words, b"", b"x", b" ", b"-", b"s", b"-job "]]
    probes += [word[:cut] for word in words for cut in range(len(word))]
    for text in probes:
        found = grammar.COMMAND_WORD.match(text)
        assert (found[0] if found else None) == first_match_1_12(text), text


@cases(
    *[
        (line(text), [UNKNOWN])
        for text in [
            b"put", b"use", b"watch", b"ignore", b"peek", b"delete", b"release", b"bury",
            b"touch", b"kick", b"kick-job", b"list-tube", b"peek-", b"reserv", b"stat",
            b"pause-tub", b"qui", b" stats", b"\tstats", b"Stats", b"PUT 0 0 0 0", b"QUIT",
            b" quit", b"hello", b"\xff\xfe",
        ]
    ]
)  # fmt: skip
def test_unknown_command(data: bytes, expected: list[Command]) -> None:
    check(data, expected)


@cases(
    *[
        (line(text), [BAD])
        for text in [
            b"reservex", b"reserve ", b"reserve x", b"reserve_job 1", b"reserve-with-timeout",
            b"reserve-job", b"reserve-jobx", b"statsx", b"stats ", b"stats-", b"stats-job",
            b"stats-tube", b"stats-jobx", b"stats-tubes x", b"list-tubesx", b"list-tubes ",
            b"list-tubes-", b"list-tube-used ", b"list-tubes-watchedx", b"list-tubes-watched ",
            b"list-tubes-watche", b"peek-readyx", b"peek-ready ", b"peek-delayedx",
            b"peek-buried 1", b"peek ", b"delete ", b"use ", b"watch ", b"ignore ", b"kick ",
            b"pause-tube",
        ]
    ]
)  # fmt: skip
def test_known_word_with_bad_arguments(data: bytes, expected: list[Command]) -> None:
    check(data, expected)


@cases(
    (line(b"put 1 2 3 4") + line(b"body"), [Put(1, 2, 3, b"body")]),
    (line(b"peek 7"), [Peek(7)]),
    (line(b"peek-ready"), [PeekReady()]),
    (line(b"peek-delayed"), [PeekDelayed()]),
    (line(b"peek-buried"), [PeekBuried()]),
    (line(b"reserve"), [Reserve()]),
    (line(b"reserve-with-timeout 5"), [ReserveWithTimeout(5)]),
    (line(b"reserve-job 8"), [ReserveJob(8)]),
    (line(b"delete 9"), [Delete(9)]),
    (line(b"release 10 11 12"), [Release(10, 11, 12)]),
    (line(b"bury 13 14"), [Bury(13, 14)]),
    (line(b"kick 15"), [Kick(15)]),
    (line(b"kick-job 16"), [KickJob(16)]),
    (line(b"touch 17"), [Touch(17)]),
    (line(b"stats-job 18"), [StatsJob(18)]),
    (line(b"stats-tube foo"), [StatsTube("foo")]),
    (line(b"stats"), [Stats()]),
    (line(b"use foo"), [Use("foo")]),
    (line(b"watch foo"), [Watch("foo")]),
    (line(b"ignore foo"), [Ignore("foo")]),
    (line(b"list-tubes-watched"), [ListTubesWatched()]),
    (line(b"list-tube-used"), [ListTubeUsed()]),
    (line(b"list-tubes"), [ListTubes()]),
    (line(b"pause-tube foo 19"), [PauseTube("foo", 19)]),
    (line(b"quit"), [Quit()]),
    # Words matched without their space, 1.12 quirks kept on purpose.
    (line(b"quitnow"), [Quit()]),
    (line(b"quit 1 2 3"), [Quit()]),
    (line(b"pause-tubefoo 0"), [PauseTube("foo", 0)]),
)
def test_every_command(data: bytes, expected: list[Command]) -> None:
    check(data, expected)


def test_tube_names_are_str() -> None:
    [command], _ = feed_in([line(b"use foo")])
    assert isinstance(command, Use)
    assert type(command.tube) is str


# --- Argument grammar: u64 job ids, u32 numbers ------------------------------------------------

ID_COMMANDS = [
    (b"peek ", Peek),
    (b"delete ", Delete),
    (b"touch ", Touch),
    (b"kick-job ", KickJob),
    (b"reserve-job ", ReserveJob),
    (b"stats-job ", StatsJob),
]

ID_ARGUMENTS: list[tuple[bytes, int | None]] = [
    (b"0", 0),
    (b"1", 1),
    (b"18446744073709551615", U64_MAX),
    (b"000000000000000000000000000018446744073709551615", U64_MAX),
    (b"  1", 1),
    (b"18446744073709551616", None),
    (b"99999999999999999999999999", None),
    (b"", None),
    (b"1 ", None),
    (b"1x", None),
    (b"1 2", None),
    (b"+1", None),
    (b"-1", None),
    (b"\t1", None),
    (b"0x1", None),
    (b"1_000", None),
    (b"\xd9\xa1", None),  # ARABIC-INDIC DIGIT ONE: Python's int() would accept it
]


@pytest.mark.parametrize(("word", "command"), ID_COMMANDS, ids=[w.decode() for w, _ in ID_COMMANDS])
@pytest.mark.parametrize(
    ("arg", "value"), ID_ARGUMENTS, ids=[repr(a)[2:-1] for a, _ in ID_ARGUMENTS]
)
def test_job_id_argument(word: bytes, command: type[Peek], arg: bytes, value: int | None) -> None:
    check(line(word + arg), [BAD if value is None else command(value)])


@cases(
    (line(b"release 1 2 3"), [Release(1, 2, 3)]),
    (
        line(b"release 18446744073709551615 4294967295 4294967295"),
        [Release(U64_MAX, U32_MAX, U32_MAX)],
    ),
    (line(b"release   1  2   3"), [Release(1, 2, 3)]),
    (line(b"release 1 02 003"), [Release(1, 2, 3)]),
    (line(b"release 18446744073709551616 0 0"), [BAD]),
    (line(b"release 1 4294967296 0"), [BAD]),
    (line(b"release 1 0 4294967296"), [BAD]),
    (line(b"release 1 0 0 "), [BAD]),
    (line(b"release 1 0"), [BAD]),
    (line(b"release 1 0 0 0"), [BAD]),
    (line(b"release 1 0\t0"), [BAD]),
    (line(b"release 1 -0 0"), [BAD]),
    (line(b"release 1 0 0x"), [BAD]),
    (line(b"bury 1 2"), [Bury(1, 2)]),
    (line(b"bury 18446744073709551615 4294967295"), [Bury(U64_MAX, U32_MAX)]),
    (line(b"bury  1  2"), [Bury(1, 2)]),
    (line(b"bury 1 4294967296"), [BAD]),
    (line(b"bury 1"), [BAD]),
    (line(b"bury 1 2 "), [BAD]),
    (line(b"bury 1 2 3"), [BAD]),
    (line(b"bury 1 +2"), [BAD]),
)
def test_release_and_bury_arguments(data: bytes, expected: list[Command]) -> None:
    check(data, expected)


# --- Argument grammar: tube names --------------------------------------------------------------

EVERY_NAME_CHAR = TUBE_NAME_CHARS.decode()
LONGEST_NAME = "n" * MAX_TUBE_NAME

TUBE_ARGUMENTS: list[tuple[bytes, str | None]] = [
    (b"a", "a"),
    (b"default", "default"),
    (b"Z" + TUBE_NAME_CHARS, "Z" + EVERY_NAME_CHAR),
    (b"a-", "a-"),
    (b"0", "0"),
    (LONGEST_NAME.encode(), LONGEST_NAME),
    (b"n" * (MAX_TUBE_NAME + 1), None),
    (b"-", None),
    (b"-a", None),
    (b"", None),
    (b" a", None),
    (b"a ", None),
    (b"a b", None),
    (b"a\tb", None),
    (b"a*", None),
    (b"a,b", None),
    (b"\xc3\xa9", None),
]
TUBE_COMMANDS = [
    (b"use ", Use),
    (b"watch ", Watch),
    (b"ignore ", Ignore),
    (b"stats-tube ", StatsTube),
]


@pytest.mark.parametrize(
    ("word", "command"), TUBE_COMMANDS, ids=[w.decode() for w, _ in TUBE_COMMANDS]
)
@pytest.mark.parametrize(
    ("arg", "name"), TUBE_ARGUMENTS, ids=[repr(a)[2:-1][:20] for a, _ in TUBE_ARGUMENTS]
)
def test_tube_name_argument(word: bytes, command: type[Use], arg: bytes, name: str | None) -> None:
    check(line(word + arg), [BAD if name is None else command(name)])


# --- Argument grammar: pause-tube's tokenizer --------------------------------------------------


@cases(
    (line(b"pause-tube foo 0"), [PauseTube("foo", 0)]),
    (line(b"pause-tube   foo   0"), [PauseTube("foo", 0)]),
    (line(b"pause-tube foo 00"), [PauseTube("foo", 0)]),
    (line(b"pause-tube foo 4294967295"), [PauseTube("foo", U32_MAX)]),
    (line(b"pause-tubefoo 0"), [PauseTube("foo", 0)]),
    (line(b"pause-tube 0 0"), [PauseTube("0", 0)]),
    (line(b"pause-tube a- 1"), [PauseTube("a-", 1)]),
    # Fails in the tokenizer or the delay: BAD_FORMAT, not counted.
    (line(b"pause-tube"), [BAD]),
    (line(b"pause-tube foo"), [BAD]),
    (line(b"pause-tube  0"), [BAD]),  # the name is "0", then no delay
    (line(b"pause-tube foo 0x"), [BAD]),
    (line(b"pause-tube foo 0 "), [BAD]),
    (line(b"pause-tube foo\t0"), [BAD]),
    (line(b"pause-tube foo*0"), [BAD]),
    (line(b"pause-tube *foo 0"), [BAD]),
    (line(b"pause-tube foo 4294967296"), [BAD]),
    (line(b"pause-tube foo  +0"), [BAD]),
    (line(b"pause-tube foo -1"), [BAD]),
    (line(b"pause-tube -"), [BAD]),
    # Tokenized fine, then the name fails validation: 1.12 has already counted cmd-pause-tube.
    (line(b"pause-tube -x 0"), [BAD_COUNTED_PAUSE]),
    (line(b"pause-tube - 0"), [BAD_COUNTED_PAUSE]),
    (line(b"pause-tube-foo 0"), [BAD_COUNTED_PAUSE]),
    (line(b"pause-tube " + b"n" * (MAX_TUBE_NAME + 1) + b" 0"), [BAD_COUNTED_PAUSE]),
)
def test_pause_tube_arguments(data: bytes, expected: list[Command]) -> None:
    check(data, expected)


# --- Argument grammar: reserve-with-timeout (1.12 strtol) and kick (strtoul) --------------------

RWT_ARGUMENTS: list[tuple[bytes, int | None]] = [
    (b"0", 0),
    (b"5", 5),
    (b"  0", 0),
    (b"", 0),  # no digits is 0
    (b"-", 0),
    (b"+", 0),
    (b"x", 0),
    (b"0x5", 0),
    (b" \t\n\x0b\x0c7", 7),  # C whitespace is skipped
    (b"\t+7", 7),
    (b"+5", 5),
    (b"-0", 0),
    (b"5 junk", 5),  # trailing text is ignored
    (b"0" * 150 + b"5", 5),
    (b"-1", -1),  # negative: wait forever
    (b"2147483647", 2147483647),
    (b"2147483648", -(2**31)),  # truncated to a C int
    (b"4294967295", -1),
    (b"4294967296", 0),
    (b"8589934592", 0),
    (b"-4294967296", 0),
    (b"9223372036854775807", -1),
    (b"-9223372036854775808", 0),
    (b"9223372036854775808", None),  # beyond C long: ERANGE
    (b"-9223372036854775809", None),
    (b"9" * 100, None),
]


@pytest.mark.parametrize(
    ("arg", "seconds"), RWT_ARGUMENTS, ids=[repr(a)[2:-1][:24] for a, _ in RWT_ARGUMENTS]
)
def test_reserve_with_timeout_argument(arg: bytes, seconds: int | None) -> None:
    check(
        line(b"reserve-with-timeout " + arg),
        [BAD if seconds is None else ReserveWithTimeout(seconds)],
    )


KICK_ARGUMENTS: list[tuple[bytes, int | None]] = [
    (b"1", 1),
    (b"1x", 1),
    (b"2 9", 2),
    (b"0x10", 0),
    (b"+1", 1),
    (b"  +3", 3),
    (b"\t2", 2),
    (b"\n1", 1),
    (b"\x0b1", 1),
    (b"0" * 150 + b"2", 2),
    (b"-0", 0),
    (b"-1", U32_MAX),  # negated modulo 2**64, then cast to unsigned int
    (b"-4294967295", 1),
    (b"-18446744073709551615", 1),
    (b"4294967295", U32_MAX),
    (b"4294967296", 0),
    (b"4294967297", 1),
    (b"18446744073709551615", U32_MAX),
    (b"", None),  # no digits
    (b" ", None),
    (b"-", None),
    (b"+", None),
    (b"x", None),
    (b"- 1", None),
    (b"18446744073709551616", None),  # beyond unsigned long: ERANGE
    (b"-18446744073709551616", None),
]


@pytest.mark.parametrize(
    ("arg", "bound_"), KICK_ARGUMENTS, ids=[repr(a)[2:-1][:24] for a, _ in KICK_ARGUMENTS]
)
def test_kick_argument(arg: bytes, bound_: int | None) -> None:
    check(line(b"kick " + arg), [BAD if bound_ is None else Kick(bound_)])


# --- put: header, body, and the order of checks ------------------------------------------------

MAX = DEFAULT_MAX_JOB_SIZE
TOO_BIG = MAX + 1
# A too-big body made of command lines: none of them may be parsed.
STATS_LINES_OF_TOO_BIG_BODY = line(b"stats") * (TOO_BIG // 7) + b"x" * (TOO_BIG % 7 + 2)


@cases(
    (line(b"put 0 0 10 5") + line(b"hello"), [Put(0, 0, 10, b"hello")]),
    (line(b"put 0 0 10 0") + line(b""), [Put(0, 0, 10, b"")]),
    (line(b"put 0 0 0 1") + line(b"x"), [Put(0, 0, 0, b"x")]),  # ttr 0 is raised by the server
    (
        line(b"put 4294967295 4294967295 4294967295 1") + line(b"x"),
        [Put(U32_MAX, U32_MAX, U32_MAX, b"x")],
    ),
    (line(b"put  00  0   10  3") + line(b"abc"), [Put(0, 0, 10, b"abc")]),
    # The body is length-delimited and never scanned.
    (
        line(b"put 1 2 3 16") + line(b"a\r\nb\nc\rd\x00stats\r\n"),
        [Put(1, 2, 3, b"a\r\nb\nc\rd\x00stats\r\n")],
    ),
    (line(b"put 1 2 3 2") + line(b"\r\n"), [Put(1, 2, 3, b"\r\n")]),
    (line(b"put 0 0 1 256") + line(bytes(range(256))), [Put(0, 0, 1, bytes(range(256)))]),
    (line(b"put 0 0 1 %d" % MAX) + line(b"m" * MAX), [Put(0, 0, 1, b"m" * MAX)]),
    # Step 1: the four numbers fail to parse: BAD_FORMAT, not counted, the body is read as commands.
    (line(b"put 0 0 10") + line(b"hello"), [BAD, UNKNOWN]),
    (line(b"put 0 0 10 ") + line(b"hello"), [BAD, UNKNOWN]),
    (line(b"put 1x 0 0 0") + line(b""), [BAD, UNKNOWN]),
    (line(b"put 0\t0 10 3") + line(b"abc"), [BAD, UNKNOWN]),
    (line(b"put +0 0 10 3") + line(b"abc"), [BAD, UNKNOWN]),
    (line(b"put 4294967296 0 10 3") + line(b"abc"), [BAD, UNKNOWN]),
    (line(b"put 0 4294967296 10 3") + line(b"abc"), [BAD, UNKNOWN]),
    (line(b"put 0 0 4294967296 3") + line(b"abc"), [BAD, UNKNOWN]),
    (line(b"put 0 0 10 4294967296") + line(b"abc"), [BAD, UNKNOWN]),
    (line(b"put 0 0 10 -1") + line(b"abc"), [BAD, UNKNOWN]),
    # Step 2: too big: exactly size+2 bytes are swallowed, whatever they are, then JOB_TOO_BIG.
    (line(b"put 0 0 10 %d" % TOO_BIG) + b"s" * TOO_BIG + b"\r\n", [PutTooBig()]),
    (line(b"put 0 0 10 %d" % TOO_BIG) + STATS_LINES_OF_TOO_BIG_BODY, [PutTooBig()]),
    # Step 3: only then trailing garbage; cmd-put already counted, the body is read as commands.
    (line(b"put 0 0 10 %dx" % TOO_BIG) + b"s" * (TOO_BIG + 2), [PutTooBig()]),
    (line(b"put 0 0 10 5x") + line(b"hello"), [BAD_COUNTED_PUT, UNKNOWN]),
    (line(b"put 0 0 10 5 ") + line(b"hello"), [BAD_COUNTED_PUT, UNKNOWN]),
    (line(b"put 0 0 10 5x0") + line(b"hello"), [BAD_COUNTED_PUT, UNKNOWN]),
    (line(b"put 0 0 10 5 5") + line(b"hello"), [BAD_COUNTED_PUT, UNKNOWN]),
    # Step 5: the size+2 bytes do not end in CRLF: exactly size+2 are consumed.
    (line(b"put 0 0 10 3") + line(b"abcde"), [PutExpectedCrlf(), UNKNOWN]),
    (line(b"put 0 0 10 3") + b"abc\n\r", [PutExpectedCrlf()]),
    (line(b"put 0 0 10 3") + b"abcxx" + line(b"stats"), [PutExpectedCrlf(), Stats()]),
    (line(b"put 0 0 10 0") + b"ab", [PutExpectedCrlf()]),
)
def test_put(data: bytes, expected: list[Command]) -> None:
    check(data, expected)


@cases(
    (line(b"put 0 0 1 10") + line(b"0123456789"), [Put(0, 0, 1, b"0123456789")]),
    (line(b"put 0 0 1 11") + line(b"0123456789a"), [PutTooBig()]),
    (line(b"put 0 0 1 11x") + line(b"0123456789a"), [PutTooBig()]),
    (line(b"put 0 0 1 10x") + line(b"0123456789"), [BAD_COUNTED_PUT, UNKNOWN]),
)
def test_put_with_max_job_size_10(data: bytes, expected: list[Command]) -> None:
    check(data, expected, max_job_size=10)


@cases(
    (line(b"put 0 0 1 0") + line(b""), [Put(0, 0, 1, b"")]),
    (line(b"put 0 0 1 1") + line(b"x"), [PutTooBig()]),
)
def test_put_with_max_job_size_0(data: bytes, expected: list[Command]) -> None:
    check(data, expected, max_job_size=0)


def test_put_waits_for_the_whole_body() -> None:
    parser = Parser()
    parser.feed(line(b"put 0 0 10 5") + b"hel")
    assert parser.next_command() is None
    assert parser.buffered == 3
    parser.feed(b"lo\r")
    assert parser.next_command() is None
    parser.feed(b"\n")
    assert drain(parser) == [Put(0, 0, 10, b"hello")]
    assert parser.buffered == 0


def test_too_big_body_is_swallowed_as_it_arrives_with_no_reply_until_the_end() -> None:
    parser = Parser()
    parser.feed(line(b"put 0 0 10 %d" % U32_MAX))
    for _ in range(32):
        parser.feed(b"\0" * 65536)
        assert parser.next_command() is None
        assert parser.buffered == 0


def test_too_big_body_then_commands_in_one_feed() -> None:
    parser = Parser(max_job_size=4)
    parser.feed(line(b"put 0 0 1 5") + b"12345\r\n" + line(b"stats") + b"sta")
    assert drain(parser) == [PutTooBig(), Stats()]
    assert parser.buffered == 3


def test_max_job_size_must_be_a_u32() -> None:
    with pytest.raises(ValueError, match="max_job_size"):
        Parser(-1)
    with pytest.raises(ValueError, match="max_job_size"):
        Parser(U32_MAX + 1)


@cases(
    (line(b"push 32"), [Push(32)]),
    (line(b"push 0"), [Push(0)]),
    (line(b"push 4294967295"), [Push(4294967295)]),
    (line(b"push"), [UNKNOWN]),
    (line(b"push "), [BAD]),
    (line(b"push 4294967296"), [BAD]),
    (line(b"push 3 "), [BAD]),
    (line(b"push -1"), [BAD]),
)  # fmt: skip
def test_push_extension(data: bytes, expected: list[Command]) -> None:
    """tubeq's push verb (protocol.md, Extensions): a u32 credit count that ends the line."""
    check(data, expected)


def test_an_extension_line_may_pass_line_max() -> None:
    """Lines that start with an extension word may run to EXT_LINE_MAX (protocol.md, Limits)."""
    padded = b"push " + b"0" * (LINE_MAX + 100) + b"7"
    check(line(padded), [Push(7)])


def test_an_extension_line_trickled_byte_by_byte() -> None:
    padded = line(b"push " + b"0" * (2 * LINE_MAX) + b"9") + line(b"stats")
    parser = Parser()
    commands: list[Command] = []
    for i in range(len(padded)):
        parser.feed(padded[i : i + 1])
        commands += drain(parser)
    assert commands == [Push(9), Stats()]


def test_an_extension_line_past_its_limit_is_one_bad_format() -> None:
    parser = Parser()
    parser.feed(b"push " + b"0" * EXT_LINE_MAX)
    assert drain(parser) == []
    assert parser.buffered < EXT_LINE_MAX  # discarded as it arrives
    parser.feed(b"1\r\n" + line(b"stats"))
    assert drain(parser) == [BAD, Stats()]


def test_a_beanstalkd_line_keeps_line_max() -> None:
    """Only extension words get the long limit: a put line past 224 bytes is BAD_FORMAT."""
    check(line(b"put " + b"0" * LINE_MAX + b" 0 1 1") + line(b"x"), [BAD, UNKNOWN])


# -- the one command list ------------------------------------------------------------------------

# Bytes that parse into each command of tubeq.protocol.commands.COMMANDS (with a max job size
# of 1 byte, so a too-big put is short).
ONE_OF_EACH: dict[type[Command], bytes] = {
    commands.Put: line(b"put 0 0 1 1") + line(b"x"),
    commands.PutExpectedCrlf: line(b"put 0 0 1 1") + b"xyz",
    commands.PutTooBig: line(b"put 0 0 1 2") + line(b"xy"),
    commands.Rejected: line(b"nonsense"),
    commands.Use: line(b"use t"),
    commands.Reserve: line(b"reserve"),
    commands.ReserveWithTimeout: line(b"reserve-with-timeout 0"),
    commands.ReserveJob: line(b"reserve-job 1"),
    commands.Delete: line(b"delete 1"),
    commands.Release: line(b"release 1 0 0"),
    commands.Bury: line(b"bury 1 0"),
    commands.Touch: line(b"touch 1"),
    commands.Watch: line(b"watch t"),
    commands.Ignore: line(b"ignore t"),
    commands.Peek: line(b"peek 1"),
    commands.PeekReady: line(b"peek-ready"),
    commands.PeekDelayed: line(b"peek-delayed"),
    commands.PeekBuried: line(b"peek-buried"),
    commands.Kick: line(b"kick 1"),
    commands.KickJob: line(b"kick-job 1"),
    commands.StatsJob: line(b"stats-job 1"),
    commands.StatsTube: line(b"stats-tube t"),
    commands.Stats: line(b"stats"),
    commands.ListTubes: line(b"list-tubes"),
    commands.ListTubeUsed: line(b"list-tube-used"),
    commands.ListTubesWatched: line(b"list-tubes-watched"),
    commands.Quit: line(b"quit"),
    commands.PauseTube: line(b"pause-tube t 1"),
    commands.Push: line(b"push 1"),
    commands.Quiet: line(b"quiet all"),
    commands.Extensions: line(b"extensions"),
    commands.TubeSet: line(b"tube-set t rate=5"),
    commands.ScheduleAdd: line(b"schedule-add t s 1 every-ms=60000") + line(b"x"),
    commands.ScheduleList: line(b"schedule-list t"),
    commands.ScheduleRemove: line(b"schedule-remove t s"),
    commands.ClearTube: line(b"clear-tube t all"),
    commands.ListJobs: line(b"list-jobs t ready 0 10"),
    commands.ChangePri: line(b"change-pri 1 0"),
    commands.ChangeDelay: line(b"change-delay 1 10"),
    commands.TubePause: line(b"tube-pause t"),
    commands.TubeResume: line(b"tube-resume t"),
    commands.PutMany: line(b"put-many 1") + line(b"0 0 1 1") + line(b"x"),
    commands.ReserveMany: line(b"reserve-many 2 0"),
    commands.DeleteMany: line(b"delete-many 1 2"),
    commands.PutWith: line(b"put-with 0 0 1 1 key=k") + line(b"x"),
    commands.PeekKey: line(b"peek-key k"),
    commands.Finish: line(b"finish 1 1") + line(b"r"),
    commands.Fail: line(b"fail 1 1") + line(b"e"),
    commands.ReportProgress: line(b"progress 1 1") + line(b"p"),
    commands.HandBack: line(b"hand-back 1"),
    commands.Cancel: line(b"cancel 1"),
    commands.Wait: line(b"wait 1 5"),
    commands.WaitMs: line(b"wait-ms 1 5"),
    commands.Auth: line(b"auth token"),
}


def test_the_command_list_is_every_command_the_parser_makes() -> None:
    """COMMANDS lists each command class once, each parses from bytes, and its classes are
    every command tubeq.protocol.commands defines, in the order they are defined."""
    assert list(ONE_OF_EACH) == list(commands.COMMANDS)
    for kind, data in ONE_OF_EACH.items():
        parser = Parser(1)
        parser.feed(data)
        assert [type(command) for command in drain(parser)] == [kind], data
    defined = [value for value in vars(commands).values()
               if isinstance(value, type) and issubclass(value, Command) and value is not Command]
    assert defined == list(commands.COMMANDS)


def test_the_word_tables_follow_the_command_list() -> None:
    """The parser's word tables hold each command's word, in the list's order: beanstalkd's
    words, then tubeq's extensions by feature."""
    def words(kinds: Sequence[type[Command]]) -> list[bytes]:
        return [kind.word for kind in kinds if kind.word is not None]

    assert list(grammar.COMMAND_WORDS) == words(commands.BEANSTALKD_COMMANDS)
    assert list(grammar.EXTENSION_WORDS) == words(commands.EXTENSION_COMMANDS)
    names = sorted(word.decode().strip() for word in words(commands.EXTENSION_COMMANDS))
    assert tuple(names) == grammar.EXTENSION_NAMES
    for kind in commands.COMMANDS:  # a line of just the word goes to that word's parser
        if kind.word is not None:
            found = grammar.COMMAND_WORD.match(kind.word)
            assert found is not None and found[0] == kind.word
