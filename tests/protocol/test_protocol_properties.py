"""Parser properties, checked by hypothesis over generated input.

1. Any bytes, split anywhere, parse to the same commands as when fed whole, and nothing raises.
2. Well-formed commands (bodies full of CR, LF and command text included) survive
   serialize -> parse unchanged.
3. A drained parser never holds more than one line or one body, whatever it was fed.
"""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

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
    Put,
    Quit,
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
from tubeq.protocol.limits import LINE_MAX, MAX_TUBE_NAME, TUBE_NAME_CHARS, U32_MAX, U64_MAX
from tubeq.protocol.parser import Parser


def encode(command: Command) -> bytes:
    """The canonical wire form of a well-formed command."""
    match command:
        case Put(pri, delay, ttr, body):
            return b"put %d %d %d %d\r\n%s\r\n" % (pri, delay, ttr, len(body), body)
        case Release(job_id, pri, delay):
            return b"release %d %d %d\r\n" % (job_id, pri, delay)
        case Bury(job_id, pri):
            return b"bury %d %d\r\n" % (job_id, pri)
        case PauseTube(tube, delay):
            return b"pause-tube %s %d\r\n" % (tube.encode(), delay)
        case ReserveWithTimeout(seconds):
            return b"reserve-with-timeout %d\r\n" % seconds
        case Kick(bound):
            return b"kick %d\r\n" % bound
        case (
            Peek(job_id)
            | Delete(job_id)
            | Touch(job_id)
            | KickJob(job_id)
            | ReserveJob(job_id)
            | StatsJob(job_id)
        ):
            return b"%s %d\r\n" % (WITH_ID[type(command)], job_id)
        case Use(tube) | Watch(tube) | Ignore(tube) | StatsTube(tube):
            return b"%s %s\r\n" % (WITH_TUBE[type(command)], tube.encode())
    return WITHOUT_ARGS[type(command)] + b"\r\n"


WITH_ID: dict[type[Command], bytes] = {
    Peek: b"peek",
    Delete: b"delete",
    Touch: b"touch",
    KickJob: b"kick-job",
    ReserveJob: b"reserve-job",
    StatsJob: b"stats-job",
}
WITH_TUBE: dict[type[Command], bytes] = {
    Use: b"use",
    Watch: b"watch",
    Ignore: b"ignore",
    StatsTube: b"stats-tube",
}
WITHOUT_ARGS: dict[type[Command], bytes] = {
    Reserve: b"reserve",
    PeekReady: b"peek-ready",
    PeekDelayed: b"peek-delayed",
    PeekBuried: b"peek-buried",
    Stats: b"stats",
    ListTubes: b"list-tubes",
    ListTubeUsed: b"list-tube-used",
    ListTubesWatched: b"list-tubes-watched",
    Quit: b"quit",
}

u32 = st.integers(0, U32_MAX)
u64 = st.integers(0, U64_MAX)
tube_names = st.text(st.sampled_from(TUBE_NAME_CHARS.decode()), min_size=1, max_size=MAX_TUBE_NAME)
tube_names = tube_names.filter(lambda name: not name.startswith("-"))
# Bodies that look like protocol: CRLFs, lone CRs and LFs, NULs, whole command lines.
body_pieces = st.one_of(
    st.binary(max_size=16),
    st.sampled_from([b"\r\n", b"\r", b"\n", b"\0", b"put 0 0 1 1\r\n", b"quit\r\n"]),
)
bodies = st.lists(body_pieces, max_size=8).map(b"".join)

commands: st.SearchStrategy[Command] = st.one_of(
    st.builds(Put, u32, u32, u32, bodies),
    st.builds(Release, u64, u32, u32),
    st.builds(Bury, u64, u32),
    st.builds(PauseTube, tube_names, u32),
    st.builds(ReserveWithTimeout, st.integers(-(2**31), 2**31 - 1)),
    st.builds(Kick, u32),
    *[st.builds(kind, u64) for kind in WITH_ID],
    *[st.builds(kind, tube_names) for kind in WITH_TUBE],
    *[st.builds(kind) for kind in WITHOUT_ARGS],
)

# Arbitrary input, biased towards the interesting: line ends, command words, boundary numbers,
# lines near and past the limit, and whole valid commands.
fragments = st.one_of(
    st.binary(max_size=24),
    st.sampled_from(
        [
            b"\r\n", b"\r", b"\n", b"\0", b" ", b"-", b"x",
            b"put ", b"put 0 0 1 ", b"put 1 2 3 4\r\n", b"put 0 0 0 70000\r\n",
            b"put 0 0 1 20x\r\n",
            b"reserve-with-timeout ", b"kick ", b"pause-tube", b"quit", b"stats", b"use ",
            b"4294967295", b"4294967296", b"18446744073709551616", b"-1",
        ]
    ),
    st.integers(0, 80).map(lambda size: b"put 0 0 1 %d\r\n" % size),
    st.integers(LINE_MAX - 4, LINE_MAX + 300).map(lambda n: b"a" * n),
    commands.map(encode),
)  # fmt: skip
streams = st.lists(fragments, max_size=24).map(b"".join)

# Whole puts as clients write them and their near misses: the parser takes the first kind in
# one step when it is all in the buffer (Parser._read_whole_put) and the rest the general way,
# line then body; fed whole or a byte at a time, the commands must be the same.
put_numbers = st.one_of(st.integers(0, 99), st.sampled_from([U32_MAX, U32_MAX + 1, 10**10]))


@st.composite
def puts(draw: st.DrawFn) -> bytes:
    body = draw(st.binary(max_size=70))
    size = draw(st.one_of(st.just(len(body)), put_numbers))
    gaps = [draw(st.sampled_from([b" ", b"  "])) for _ in range(4)]
    numbers = [b"%d" % draw(put_numbers) for _ in range(3)] + [b"%d" % size]
    end = draw(st.sampled_from([b"\r\n", b"XY", b"\r"]))
    return b"put" + b"".join(g + n for g, n in zip(gaps, numbers, strict=True)) + b"\r\n" \
        + body + end
max_job_sizes = st.integers(0, 64)


def drain(parser: Parser) -> list[Command]:
    out = []
    while (command := parser.next_command()) is not None:
        out.append(command)
    return out


def parse_in(chunks: list[bytes], max_job_size: int) -> list[Command]:
    parser = Parser(max_job_size)
    out: list[Command] = []
    for chunk in chunks:
        parser.feed(chunk)
        out += drain(parser)
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    return [data[start:end] for start, end in pairwise(points)]


@settings(max_examples=300, deadline=None)
@given(streams, st.lists(st.integers(0, 10_000), max_size=30), max_job_sizes)
def test_any_split_parses_like_whole(data: bytes, cuts: list[int], max_job_size: int) -> None:
    whole = parse_in([data], max_job_size)
    assert parse_in(split(data, cuts), max_job_size) == whole


@settings(max_examples=50, deadline=None)
@given(streams, max_job_sizes)
def test_byte_at_a_time_parses_like_whole(data: bytes, max_job_size: int) -> None:
    bytewise = [data[i : i + 1] for i in range(len(data))]
    assert parse_in(bytewise, max_job_size) == parse_in([data], max_job_size)


@settings(max_examples=300, deadline=None)
@given(st.lists(puts(), min_size=1, max_size=8), max_job_sizes)
def test_whole_puts_and_near_misses_parse_alike_however_they_arrive(
        sent: list[bytes], max_job_size: int) -> None:
    data = b"".join(sent) + b"list-tube-used\r\n"
    bytewise = [data[i : i + 1] for i in range(len(data))]
    assert parse_in([data], max_job_size) == parse_in(bytewise, max_job_size)


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, max_size=20), st.lists(st.integers(0, 10_000), max_size=10))
def test_well_formed_commands_round_trip(sent: list[Command], cuts: list[int]) -> None:
    data = b"".join(encode(command) for command in sent)
    assert parse_in([data], max_job_size=U32_MAX) == sent
    assert parse_in(split(data, cuts), max_job_size=U32_MAX) == sent


@settings(max_examples=300, deadline=None)
@given(streams, st.lists(st.integers(0, 10_000), max_size=30), max_job_sizes)
def test_drained_parser_holds_at_most_a_line_or_a_body(
    data: bytes, cuts: list[int], max_job_size: int
) -> None:
    parser = Parser(max_job_size)
    for chunk in split(data, cuts):
        parser.feed(chunk)
        drain(parser)
        assert parser.buffered <= LINE_MAX + max_job_size + 2
        assert parser.buffered < max(LINE_MAX, max_job_size + 2)
