"""put-many, reserve-many and delete-many at the parser (layer a): bytes in, commands out.

Every input goes through ``check`` as in tests/protocol/test_protocol.py: fed whole, one byte at a
time, followed by a command (which must still parse: the batch ended where it should), and followed
by garbage without a line end (which must stay buffered).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import pytest

from tubeq.protocol import replies
from tubeq.protocol.batch_framing import PUT_MANY_MAX, PUT_MANY_PART
from tubeq.protocol.commands import (
    Command,
    DeleteMany,
    ListTubeUsed,
    PutEntry,
    PutMany,
    Rejected,
    ReserveMany,
)
from tubeq.protocol.limits import EXT_LINE_MAX, U32_MAX, U64_MAX
from tubeq.protocol.parser import Parser

BAD = Rejected(reply=replies.BAD_FORMAT)
FOLLOWER = b"list-tube-used\r\n"
GARBAGE = b"half a line, no end"


def drain(parser: Parser) -> list[Command]:
    commands = []
    while (command := parser.next_command()) is not None:
        commands.append(command)
    return commands


def feed_whole(data: bytes, **kwargs: int) -> list[Command]:
    parser = Parser(**kwargs)
    parser.feed(data)
    return drain(parser)


def feed_bytewise(data: bytes, **kwargs: int) -> list[Command]:
    parser = Parser(**kwargs)
    out: list[Command] = []
    for i in range(len(data)):
        parser.feed(data[i:i + 1])
        out += drain(parser)
    return out


def check(data: bytes, expected: Sequence[Command], **kwargs: int) -> None:
    assert feed_whole(data, **kwargs) == list(expected)
    assert feed_bytewise(data, **kwargs) == list(expected)
    assert feed_whole(data + FOLLOWER, **kwargs) == [*expected, ListTubeUsed()]
    parser = Parser(**kwargs)
    parser.feed(data + GARBAGE)
    assert drain(parser) == list(expected)
    assert parser.buffered == len(GARBAGE)


def entry(body: bytes, pri: int = 0, delay: int = 0, ttr: int = 60) -> bytes:
    return b"%d %d %d %d\r\n%s\r\n" % (pri, delay, ttr, len(body), body)


def test_a_whole_batch_is_one_command_with_its_entries_in_order() -> None:
    data = b"put-many 3\r\n" + entry(b"a", pri=5) + entry(b"", delay=2) + entry(b"c\r\nd", ttr=0)
    check(data, [PutMany((PutEntry(5, 0, 60, b"a"), PutEntry(0, 2, 60, b""),
                          PutEntry(0, 0, 0, b"c\r\nd")))])


def test_a_long_batch_comes_in_parts_of_part_entries_as_they_arrive() -> None:
    # Refused entries count in a part like jobs (each needs its reply), one of them on the
    # boundary; the last part is the command's end (more=False) whatever its size.
    jobs: list[PutEntry | bytes] = [PutEntry(0, 0, 60, b"%d" % i)
                                    for i in range(2 * PUT_MANY_PART + 3)]
    jobs[1] = replies.BAD_FORMAT
    jobs[PUT_MANY_PART - 1] = replies.EXPECTED_CRLF
    data = b"put-many %d\r\n" % len(jobs) + b"".join(
        b"0 0 60 1 x\r\nz\r\n" if job == replies.BAD_FORMAT
        else b"0 0 60 1\r\nzXY" if job == replies.EXPECTED_CRLF
        else entry(cast(PutEntry, job).body) for job in jobs)
    check(data, [PutMany(tuple(jobs[:PUT_MANY_PART]), more=True),
                 PutMany(tuple(jobs[PUT_MANY_PART:2 * PUT_MANY_PART]), more=True),
                 PutMany(tuple(jobs[2 * PUT_MANY_PART:]))])


def test_a_batch_of_exactly_one_part_is_one_command() -> None:
    jobs = tuple(PutEntry(0, 0, 60, b"x") for _ in range(PUT_MANY_PART))
    check(b"put-many %d\r\n" % PUT_MANY_PART + entry(b"x") * PUT_MANY_PART, [PutMany(jobs)])


def test_count_zero_is_an_empty_batch_at_once() -> None:
    check(b"put-many 0\r\n", [PutMany(())])


def test_a_malformed_entry_in_the_middle_fails_alone_and_the_batch_stays_in_step() -> None:
    # An option an entry does not take (entries take group= and traceparent= only): refused,
    # and its body
    # swallowed, not read as the next entry.
    data = (b"put-many 3\r\n" + entry(b"one") + b"0 0 60 3 max-tries=2\r\nbad\r\n"
            + entry(b"three"))
    check(data, [PutMany((PutEntry(0, 0, 60, b"one"), replies.bad_option("max-tries"),
                          PutEntry(0, 0, 60, b"three")))])


def test_an_entry_takes_a_group_and_a_bad_one_is_refused_alone() -> None:
    data = (b"put-many 4\r\n0 0 60 1 group=tenant-a\r\na\r\n"
            b"0 0 60 1 group=a:b\r\nb\r\n0 0 60 1 group=a group=b\r\nc\r\n" + entry(b"d"))
    check(data, [PutMany((PutEntry(0, 0, 60, b"a", "tenant-a"), replies.bad_option("group"),
                          replies.bad_option("group"), PutEntry(0, 0, 60, b"d")))])


TP = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_an_entry_takes_a_traceparent_and_a_bad_one_is_refused_alone() -> None:
    data = (b"put-many 4\r\n0 0 60 1 traceparent=" + TP + b"\r\na\r\n"
            b"0 0 60 1 group=g traceparent=" + TP + b"\r\nb\r\n"
            b"0 0 60 1 traceparent=" + TP.upper() + b"\r\nc\r\n" + entry(b"d"))
    check(data, [PutMany((PutEntry(0, 0, 60, b"a", "", TP.decode()),
                          PutEntry(0, 0, 60, b"b", "g", TP.decode()),
                          replies.bad_option("traceparent"), PutEntry(0, 0, 60, b"d")))])


@pytest.mark.parametrize("line", [
    b"0 0 60 3 \r\n",  # a trailing space
    b"4294967296 0 60 3\r\n",  # pri past u32
    b"0 0 4294967296 3\r\n",  # ttr past u32
    b"0 0 60 3\x00\r\n",  # a NUL
])
def test_an_entry_with_a_readable_size_is_refused_and_its_body_swallowed(line: bytes) -> None:
    data = b"put-many 2\r\n" + line + b"abc\r\n" + entry(b"ok")
    check(data, [PutMany((replies.BAD_FORMAT, PutEntry(0, 0, 60, b"ok")))])


@pytest.mark.parametrize("line", [b"nonsense\r\n", b"0 0 60\r\n", b"0 0 60 4294967296\r\n",
                                  b"\r\n"])
def test_an_entry_without_a_size_has_no_body_and_the_next_line_is_the_next_entry(
        line: bytes) -> None:
    data = b"put-many 2\r\n" + line + entry(b"ok")
    check(data, [PutMany((replies.BAD_FORMAT, PutEntry(0, 0, 60, b"ok")))])


def test_a_body_without_its_crlf_is_expected_crlf_and_exactly_its_bytes_are_taken() -> None:
    data = b"put-many 2\r\n0 0 60 2\r\nabXY" + entry(b"ok")
    check(data, [PutMany((replies.EXPECTED_CRLF, PutEntry(0, 0, 60, b"ok")))])


def test_a_too_big_body_inside_a_batch_is_swallowed_as_it_arrives() -> None:
    big = b"z" * 101
    data = b"put-many 3\r\n" + entry(b"a") + entry(big) + entry(b"c")
    check(data, [PutMany((PutEntry(0, 0, 60, b"a"), replies.JOB_TOO_BIG,
                          PutEntry(0, 0, 60, b"c")))], max_job_size=100)
    parser = Parser(max_job_size=100)
    parser.feed(b"put-many 2\r\n0 0 60 100000\r\n" + b"z" * 50_000)
    assert drain(parser) == []
    assert parser.buffered == 0  # swallowed, not held


def test_bodies_past_the_batch_limit_are_job_too_big_and_not_kept() -> None:
    data = b"put-many 3\r\n" + entry(b"a" * 40) + entry(b"b" * 40) + entry(b"c" * 20)
    check(data, [PutMany((PutEntry(0, 0, 60, b"a" * 40), replies.JOB_TOO_BIG,
                          PutEntry(0, 0, 60, b"c" * 20)))], max_batch_bytes=60)


def test_the_bodies_kept_count_as_buffered() -> None:
    parser = Parser()
    parser.feed(b"put-many 2\r\n" + entry(b"x" * 30))
    assert drain(parser) == []
    assert parser.buffered == 30


def test_an_overlong_entry_line_is_discarded_to_its_crlf() -> None:
    data = b"put-many 2\r\n" + b"1" * EXT_LINE_MAX + b"\r\n" + entry(b"ok")
    check(data, [PutMany((replies.BAD_FORMAT, PutEntry(0, 0, 60, b"ok")))])


def test_a_count_over_the_limit_reads_and_drops_every_entry_then_refuses() -> None:
    count = PUT_MANY_MAX + 1
    data = b"put-many %d\r\n" % count + entry(b"delete 1") * count
    assert feed_whole(data + FOLLOWER) == [BAD, ListTubeUsed()]
    parser = Parser()
    parser.feed(data[: len(data) // 2])
    assert drain(parser) == []
    assert parser.buffered < 100  # the dropped bodies are not held


@pytest.mark.parametrize("line", [b"put-many\r\n", b"put-many \r\n", b"put-many x\r\n",
                                  b"put-many 1 \r\n", b"put-many -1\r\n",
                                  b"put-many 4294967296\r\n"])
def test_a_bad_put_many_line_is_bad_format_and_reads_no_entries(line: bytes) -> None:
    check(line, [BAD] if line != b"put-many\r\n" else [Rejected(replies.UNKNOWN_COMMAND)])


def test_reserve_many() -> None:
    check(b"reserve-many 10 0\r\n", [ReserveMany(10, 0)])
    check(b"reserve-many %d %d\r\n" % (PUT_MANY_MAX, U32_MAX), [ReserveMany(PUT_MANY_MAX, U32_MAX)])


@pytest.mark.parametrize("line", [b"reserve-many 0 1\r\n", b"reserve-many %d 1\r\n" % (
    PUT_MANY_MAX + 1), b"reserve-many 5\r\n", b"reserve-many 5 -1\r\n", b"reserve-many 5 1 \r\n",
    b"reserve-many 5 4294967296\r\n", b"reserve-many a 1\r\n"])
def test_reserve_many_errors(line: bytes) -> None:
    check(line, [BAD])


def test_delete_many_takes_ids_in_the_order_given_up_to_the_extension_line() -> None:
    check(b"delete-many 3 1 2 3\r\n", [DeleteMany((3, 1, 2, 3))])
    check(b"delete-many %d\r\n" % U64_MAX, [DeleteMany((U64_MAX,))])
    ids = b" ".join(b"%d" % (10**15 + i) for i in range(1000))  # 16,999 bytes: too long
    many = b"delete-many " + ids[: EXT_LINE_MAX - 20].rsplit(b" ", 1)[0]
    assert len(many) + 2 <= EXT_LINE_MAX
    check(many + b"\r\n", [DeleteMany(tuple(int(i) for i in many.split()[1:]))])
    check(b"delete-many " + ids + b"\r\n", [BAD])


@pytest.mark.parametrize("line", [b"delete-many \r\n", b"delete-many 1  2\r\n",
                                  b"delete-many 1 2 \r\n", b"delete-many 1 x\r\n",
                                  b"delete-many %d\r\n" % (U64_MAX + 1), b"delete-many -1\r\n"])
def test_delete_many_errors(line: bytes) -> None:
    check(line, [BAD])
