"""The bundled client, tubeq.client: the sans-IO reply parser byte by byte, every error reply
through a scripted server, garbage and closes mid-reply, and every command against real
beanstalkd 1.12 and tubeq (pipelining, reconnect with use/watch restored, orphaned reserves).
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.client_support import WAIT_S, Close, FakeServer, Proxy, connected, eventually
from tests.support.servers import ServerProcess, start_beanstalkd, unique_prefix
from tubeq import client as tc
from tubeq.client import (
    ERRORS,
    MAX_REPLY_LINE,
    BadFormat,
    Buried,
    Client,
    ClientConnectionError,
    CommandError,
    DeadlineSoon,
    Draining,
    Job,
    JobTooBig,
    NotFound,
    NotIgnored,
    ProtocolError,
    Reply,
    ReplyParser,
    TimedOut,
    UnknownCommand,
    parse_yaml_list,
    parse_yaml_mapping,
)

pytestmark = pytest.mark.timeout(60)

NO_SUCH_JOB = 2**63

# --------------------------------------------------------------------------------------------
# The reply parser, sans IO
# --------------------------------------------------------------------------------------------

STREAM = (
    b"INSERTED 12\r\n"
    b"RESERVED 7 12\r\nhello\r\nworld\r\n"  # a body may hold CRLF: it is framed by length
    b"FOUND 8 0\r\n\r\n"
    b"OK 14\r\n---\n- default\n\r\n"
    b"USING emails\r\n"
    b"BURIED\r\nBURIED 9\r\nKICKED\r\nKICKED 3\r\nWATCHING 2\r\n"
    b"NOT_FOUND\r\nTIMED_OUT\r\nDEADLINE_SOON\r\nPUSHING 4\r\n"
)
EXPECTED = [
    Reply(b"INSERTED", (b"12",)),
    Reply(b"RESERVED", (b"7", b"12"), b"hello\r\nworld"),
    Reply(b"FOUND", (b"8", b"0"), b""),
    Reply(b"OK", (b"14",), b"---\n- default\n"),
    Reply(b"USING", (b"emails",)),
    Reply(b"BURIED"), Reply(b"BURIED", (b"9",)), Reply(b"KICKED"), Reply(b"KICKED", (b"3",)),
    Reply(b"WATCHING", (b"2",)),
    Reply(b"NOT_FOUND"), Reply(b"TIMED_OUT"), Reply(b"DEADLINE_SOON"), Reply(b"PUSHING", (b"4",)),
]


def test_parser_whole_stream() -> None:
    parser = ReplyParser()
    assert parser.feed(STREAM) == EXPECTED
    assert not parser.mid_reply and parser.error is None


def test_parser_one_byte_at_a_time_never_returns_part_of_a_frame() -> None:
    parser = ReplyParser()
    got: list[Reply] = []
    for i in range(len(STREAM)):
        got += parser.feed(STREAM[i:i + 1])
    assert got == EXPECTED
    assert not parser.mid_reply


def test_parser_every_split_point() -> None:
    for cut in range(len(STREAM) + 1):
        parser = ReplyParser()
        assert parser.feed(STREAM[:cut]) + parser.feed(STREAM[cut:]) == EXPECTED, cut


def test_parser_partial_frame_is_mid_reply() -> None:
    parser = ReplyParser()
    assert parser.feed(b"RESERVED 1 5\r\nhel") == []
    assert parser.mid_reply
    assert parser.feed(b"lo\r\n") == [Reply(b"RESERVED", (b"1", b"5"), b"hello")]
    assert not parser.mid_reply
    assert parser.feed(b"INSERT") == [] and parser.mid_reply


@settings(max_examples=300, deadline=None)
@example(args=[b"1" * 21, b"finished", b"1"], word=b"END")  # shapes too rare to draw
@example(args=[b"1", b"", b"2"], word=b"END")
@example(args=[b"1", b"finished", b"1048577"], word=b"END")
@example(args=[b"1", b"finished", b"2", b"3"], word=b"END")
@example(args=[b"1" * 21, b"1"], word=b"RESERVED")
@example(args=[b"07", b"1"], word=b"RESERVED")
@given(args=st.lists(st.sampled_from([b"1", b"07", b"2", b"", b"x", b"-1", b"1" * 21, b"9" * 20,
                                      b"1048577", b" ", b"finished"]), max_size=4),
       word=st.sampled_from([b"RESERVED", b"END", b"DELETED", b"TOUCHED", b"BURIED",
                             b"FINISHED"]))
def test_the_parsers_one_step_lines_read_as_the_general_way(args: list[bytes],
                                                             word: bytes) -> None:
    """RESERVED, END and the one-word replies are read in one step (a consumer's per-job
    lines, a call's end); any line of theirs gives the frame, or the protocol error, the
    general way gives."""
    line = b" ".join([word, *args])
    general = ReplyParser(max_body=1 << 20)
    try:
        expected: Reply | None = general._parse_line(line)
    except ProtocolError:
        expected = None
    parser = ReplyParser(max_body=1 << 20)
    body = b""
    if expected is not None and expected.word in (b"RESERVED", b"END"):
        body = b"b" * int(expected.args[-1]) + b"\r\n"
        expected = Reply(expected.word, expected.args, body[:-2])
    got = parser.feed(line + b"\r\n" + body)
    if expected is None:
        assert got == [] and isinstance(parser.error, ProtocolError)
    else:
        assert got == [expected] and parser.error is None


@pytest.mark.parametrize("garbage", [
    b"HELLO\r\n",
    b"inserted 1\r\n",
    b"INSERTED\r\n",
    b"INSERTED 1 2\r\n",
    b"INSERTED x\r\n",
    b"INSERTED -1\r\n",
    b"DELETED 1\r\n",
    b"RESERVED 1\r\n",
    b"END 1 finished x\r\n",
    b"ENDED x finished 2\r\nok\r\n",
    b"RESERVED 1 3\r\nabcXY",
    b"FOUND 1 1\r\nab\r\n",
    b"OK 99999999999\r\n",
    b"USING \r\n",
    b"\r\n",
    b"X" * MAX_REPLY_LINE,
])
def test_parser_garbage_is_a_protocol_error(garbage: bytes) -> None:
    parser = ReplyParser(max_body=1 << 20)
    assert parser.feed(b"DELETED\r\n" + garbage + b"TOUCHED\r\n") == [Reply(b"DELETED")]
    assert isinstance(parser.error, ProtocolError)
    assert parser.feed(b"TOUCHED\r\n") == []  # a stopped parser stays stopped


def test_parser_line_limit_is_exact() -> None:
    tube = b"t" * (MAX_REPLY_LINE - len(b"USING \r\n"))
    assert ReplyParser().feed(b"USING " + tube + b"\r\n") == [Reply(b"USING", (tube,))]
    parser = ReplyParser()
    parser.feed(b"USING " + tube + b"x\r\n")
    assert isinstance(parser.error, ProtocolError)


SERVER_STATS = (
    b"---\ncurrent-jobs-urgent: 0\nrusage-utime: 0.001996\nversion: \"1.12\"\n"
    b"draining: false\nid: 1234567890123456\nhostname: vm\nos: #1 SMP PREEMPT_DYNAMIC @0\n"
    b"platform: x86_64\n"
)


def test_yaml_mapping() -> None:
    stats = parse_yaml_mapping(SERVER_STATS, tc.SERVER_TEXT_KEYS)
    assert stats == {
        "current-jobs-urgent": 0, "rusage-utime": 0.001996, "version": "1.12",
        "draining": False, "id": "1234567890123456", "hostname": "vm",
        "os": "#1 SMP PREEMPT_DYNAMIC @0", "platform": "x86_64",
    }
    assert parse_yaml_mapping(b"---\nname: 42\n", {"name"}) == {"name": "42"}
    assert parse_yaml_list(b"---\n- default\n- a.b\n") == ["default", "a.b"]
    assert parse_yaml_list(b"---\n") == []
    for bad in (b"name: x\n", b"---\nno colon here\n", b"---\nx:y\n"):
        with pytest.raises(ProtocolError):
            parse_yaml_mapping(bad)
    with pytest.raises(ProtocolError):
        parse_yaml_list(b"---\nnot an item\n")


def test_argument_checks_before_anything_is_sent() -> None:
    async def main() -> None:
        client = Client("127.0.0.1", 1)  # never connected: the checks come first
        for tube in ("", "a b", "a\r\nput", "tübe", "a\x00"):
            with pytest.raises(ValueError):
                await client.use(tube)
        with pytest.raises(ValueError):
            await client.put(b"x", pri=-1)
        with pytest.raises(ValueError):
            await client.put(b"x", ttr=2**32)
        with pytest.raises(ValueError):
            await client.delete(2**64)
        with pytest.raises(ValueError):
            await client.reserve_with_timeout(-1)

    asyncio.run(main())


def test_backoff_and_touch_interval() -> None:
    assert [tc.backoff_delay(r, 1, 60) for r in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert tc.backoff_delay(500, 2, 3600) == 3600
    assert tc.backoff_delay(3, 0, 60) == 0
    assert tc.touch_interval(60) == 58.5
    assert tc.touch_interval(3) == 1.5
    assert tc.touch_interval(1) == 0.25


# --------------------------------------------------------------------------------------------
# A scripted server: every error reply, garbage, closes
# --------------------------------------------------------------------------------------------


def answers(table: dict[bytes, bytes | Close], default: bytes = b"DELETED\r\n") -> Callable[
        [bytes], bytes | Close]:
    return lambda line: table.get(line, default)


@pytest.mark.parametrize("word", sorted(ERRORS), ids=lambda w: w.decode())
async def test_every_error_reply_raises_its_exception(word: bytes) -> None:
    # BAD_OPTION names the option refused, UNKNOWN_PARENT the job
    reply = word + {b"BAD_OPTION": b" cron", b"UNKNOWN_PARENT": b" 7"}.get(word, b"")
    async with FakeServer(answers({b"delete 1": reply + b"\r\n"})) as server:
        async with server.client() as client:
            with pytest.raises(ERRORS[word]) as caught:
                await client.delete(1)
            assert isinstance(caught.value, CommandError)
            assert caught.value.command == "delete"
            assert word.decode() in str(caught.value)
            await client.delete(2)  # the connection stays usable
        assert server.connections == 1


def test_every_exception_documents_when_the_server_sends_it() -> None:
    for word, error in ERRORS.items():
        assert error.__doc__ and word.decode() in error.__doc__, error


async def test_buried_on_put_carries_the_new_job_id() -> None:
    async with FakeServer(lambda line: b"BURIED 7\r\n") as server, server.client() as client:
        with pytest.raises(Buried) as caught:
            await client.put(b"x")
        assert caught.value.job_id == 7


async def test_bury_expects_buried_as_success() -> None:
    async with FakeServer(lambda line: b"BURIED\r\n") as server, server.client() as client:
        await client.bury(1, pri=5)
        with pytest.raises(Buried):  # release answered BURIED: out of memory
            await client.release(1)


@pytest.mark.parametrize("garbage", [
    b"HELLO\r\n",
    b"RESERVED 1 3\r\nabcXY\r\n",
    b"RESERVED one 3\r\nabc\r\n",
    b"X" * 300,
    b"OK 2000000000\r\n",
    b"DELETED\r\n",  # a well-formed reply that does not answer reserve: desync
])
async def test_garbage_raises_protocol_error_and_the_next_call_reconnects(garbage: bytes) -> None:
    table: dict[bytes, bytes | Close] = {b"reserve-with-timeout 0": garbage}
    async with FakeServer(answers(table, b"INSERTED 5\r\n")) as server:
        async with server.client() as client:
            with pytest.raises(ProtocolError):
                await client.reserve_with_timeout(0)
            assert not client.connected
            assert await client.put(b"x") == 5
        assert server.connections == 2


@pytest.mark.parametrize("cut", [
    b"",
    b"RESERV",
    b"RESERVED 1 10\r\n",
    b"RESERVED 1 10\r\nabc",
    b"RESERVED 1 10\r\n0123456789",
    b"RESERVED 1 10\r\n0123456789\r",
])
async def test_close_mid_reply_raises_connection_error_never_a_half_job(cut: bytes) -> None:
    async with FakeServer(answers({b"reserve": Close(cut)})) as server, \
            server.client() as client:
        with pytest.raises(ClientConnectionError) as caught:
            await client.reserve()
        assert isinstance(caught.value, ConnectionError)
        if cut:
            assert "middle of a reply" in str(caught.value)


async def test_every_pipelined_call_fails_when_the_connection_drops() -> None:
    lines = 0

    def respond(line: bytes) -> bytes | Close:
        nonlocal lines
        lines += 1
        return Close(b"DELETED\r\n") if lines == 2 else b"DELETED\r\n"

    async with FakeServer(respond) as server, server.client(reconnect=False) as client:
        results = await asyncio.gather(*(client.delete(i) for i in range(5)),
                                       return_exceptions=True)
        assert results[:2] == [None, None]
        assert all(isinstance(r, ClientConnectionError) for r in results[2:]), results
        with pytest.raises(ClientConnectionError):  # reconnect is off
            await client.delete(9)


async def test_calls_are_pipelined() -> None:
    """The scripted server answers nothing until it has all 50 commands: a client that waited
    for each reply before sending the next command would never finish."""
    count = 50
    received: list[bytes] = []
    all_in = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while len(received) < count:
            received.append((await reader.readuntil(b"\r\n"))[:-2])
        writer.write(b"".join(b"INSERTED %d\r\n" % (100 + i) for i in range(count)))
        all_in.set()
        await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        async with Client("127.0.0.1", server.sockets[0].getsockname()[1]) as client:
            async with asyncio.timeout(WAIT_S):
                ids = await asyncio.gather(*(client.put(b"%d" % i) for i in range(count)))
        assert ids == [100 + i for i in range(count)]
        assert all_in.is_set()
    finally:
        server.close()


class _CountingTransport:
    """A transport that counts its writes and passes everything on."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


async def test_the_commands_of_one_loop_turn_leave_in_two_writes() -> None:
    """The first command of a turn is written at once (a lone call waits for nothing), the
    turn's others together when it ends: 30 callers' puts, two system calls."""
    async with FakeServer(lambda line: b"INSERTED 1\r\n") as server, server.client() as client:
        async with asyncio.timeout(WAIT_S):
            await client.put(b"first")  # connected
            link = client._link
            assert link is not None
            counting = _CountingTransport(link._transport)
            link._transport = counting  # type: ignore[assignment]
            await asyncio.gather(*(client.put(b"%d" % i) for i in range(30)))
            assert len(counting.writes) == 2
            sent = b"".join(counting.writes)
            assert sent.count(b"put ") == 30 and sent.endswith(b" 2\r\n29\r\n")
            await client.put(b"alone")
            assert len(counting.writes) == 3


async def test_connection_refused_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        client = Client("127.0.0.1", port, connect_timeout=2)
        with pytest.raises(ClientConnectionError, match="cannot connect"):
            await client.stats()


JOB_11 = b"---\nid: 11\nstate: reserved\npri: 5\nttr: 9\n"


async def test_push_frames_interleaved_with_replies_go_to_the_push_queue() -> None:
    table: dict[bytes, bytes | Close] = {
        b"push 2": b"PUSHING 2\r\nRESERVED 10 1\r\na\r\n",
        # a pushed frame between replies, and one just before the reply to delete
        b"delete 10": b"RESERVED 11 2\r\nbb\r\nDELETED\r\n",
        b"touch 11": b"TOUCHED\r\n",
        b"stats-job 11": b"OK %d\r\n%s\r\n" % (len(JOB_11), JOB_11),
        b"release 11 5 0": b"RESERVED 12 0\r\n\r\nRELEASED\r\n",
    }
    async with FakeServer(answers(table)) as server, server.client() as client:
        with pytest.raises(RuntimeError):
            await client.next_pushed()  # not in push mode
        assert await client.push(2) == 2
        first = await client.next_pushed()
        assert (first.id, first.body, first.reserved) == (10, b"a", True)
        await first.delete()
        second = await client.next_pushed()
        assert (second.id, second.body) == (11, b"bb")
        await second.touch()
        await second.release()  # its own priority, asked with stats-job
        third = await client.next_pushed()
        assert (third.id, third.body) == (12, b"")
        with pytest.raises(RuntimeError):
            await client.reserve_with_timeout(0)  # never on a push connection
        assert server.lines[-2:] == [b"stats-job 11", b"release 11 5 0"]


async def test_push_refused_leaves_the_connection_usable() -> None:
    table: dict[bytes, bytes | Close] = {b"push 3": b"UNKNOWN_COMMAND\r\n",
                                         b"reserve-with-timeout 0": b"TIMED_OUT\r\n"}
    async with FakeServer(answers(table)) as server, server.client() as client:
        with pytest.raises(UnknownCommand):
            await client.push(3)
        with pytest.raises(TimedOut):
            await client.reserve_with_timeout(0)


# --------------------------------------------------------------------------------------------
# Real servers: beanstalkd 1.12 and tubeq
# --------------------------------------------------------------------------------------------


async def test_producer_and_inspection_commands(any_server: ServerProcess, tube_name: str) -> None:
    async with Client(*any_server.address) as client:
        assert await client.use(tube_name) == tube_name
        assert client.used == tube_name
        assert await client.list_tube_used() == tube_name
        first = await client.put(b"first", pri=10, ttr=30)
        second = await client.put("second \N{SNOWMAN}", pri=5)
        later = await client.put(b"later", delay=100)
        assert first < second < later

        job = await client.peek(first)
        assert (job.id, job.body, job.reserved) == (first, b"first", False)
        ready = await client.peek_ready()
        assert (ready.id, ready.body, ready.tube) == (second, "second ☃".encode(), tube_name)
        assert (await client.peek_delayed()).id == later
        with pytest.raises(NotFound):
            await client.peek_buried()

        stats = await client.stats_job(first)
        assert stats["id"] == first and stats["tube"] == tube_name
        assert (stats["state"], stats["pri"], stats["ttr"]) == ("ready", 10, 30)
        assert (await job.stats())["reserves"] == 0
        tube = await client.stats_tube(tube_name)
        assert tube["name"] == tube_name
        assert (tube["current-jobs-ready"], tube["current-jobs-delayed"]) == (2, 1)
        assert tube["current-jobs-urgent"] == 2 and tube["total-jobs"] == 3
        server = await client.stats()
        assert isinstance(server["version"], str) and '"' not in server["version"]
        assert isinstance(server["current-connections"], int)
        assert isinstance(server["rusage-utime"], float)
        assert server["draining"] is False
        assert tube_name in await client.list_tubes()

        assert await client.kick(10) == 1  # no buried job: kicks the delayed one
        assert (await client.stats_job(later))["state"] == "ready"
        await client.pause_tube(tube_name, 100)
        assert (await client.stats_tube(tube_name))["pause"] == 100
        await client.pause_tube(tube_name, 0)
        await job.delete()  # a job that is not reserved: any connection may delete it
        for job_id in (second, later):
            await client.delete(job_id)
        with pytest.raises(NotFound):
            await client.peek(first)


async def test_worker_commands(any_server: ServerProcess, tube_name: str) -> None:
    async with connected(*any_server.address, tube_name) as client:
        assert await client.list_tubes_watched() == [tube_name]
        assert client.watched == (tube_name,)
        job_id = await client.put(b"work", pri=3, ttr=60)

        job = await client.reserve_with_timeout(1)
        assert (job.id, job.body, job.tube, job.reserved) == (job_id, b"work", tube_name, True)
        await client.touch(job_id)
        await job.touch()
        await client.release(job_id, pri=4, delay=0)
        job = await client.reserve()  # a ready job: answered at once
        assert job.id == job_id
        assert (await job.stats())["pri"] == 4
        await job.bury()  # its own priority
        stats = await client.stats_job(job_id)
        assert (stats["state"], stats["pri"], stats["buries"]) == ("buried", 4, 1)
        assert (await client.peek_buried()).id == job_id
        assert await client.kick(5) == 1

        job = await client.reserve_job(job_id)
        await job.release(delay=100)
        assert (await client.stats_job(job_id))["state"] == "delayed"
        await client.kick_job(job_id)
        job = await client.reserve_job(job_id)
        await client.bury(job_id, pri=8)
        await client.kick_job(job_id)
        job = await client.reserve_with_timeout(0)
        await job.delete()
        with pytest.raises(NotFound):
            await job.delete()

        await client.put(b"paused")
        await client.pause_tube(tube_name, 60)
        with pytest.raises(TimedOut):
            await client.reserve_with_timeout(0)
        await client.pause_tube(tube_name, 0)
        job = await client.reserve_with_timeout(1)
        await job.delete()


async def test_error_replies_from_real_servers(any_server: ServerProcess, tube_name: str) -> None:
    async with connected(*any_server.address, tube_name) as client:
        for call in (client.delete, client.peek, client.stats_job, client.kick_job,
                     client.reserve_job, client.touch):
            with pytest.raises(NotFound):
                await call(NO_SUCH_JOB)
        with pytest.raises(NotFound):
            await client.release(NO_SUCH_JOB)
        with pytest.raises(NotFound):
            await client.bury(NO_SUCH_JOB)
        with pytest.raises(NotFound):
            await client.stats_tube(f"{tube_name}-none")
        with pytest.raises(NotFound):
            await client.pause_tube(f"{tube_name}-none", 1)
        with pytest.raises(NotFound):
            await client.peek_ready()
        with pytest.raises(NotIgnored):
            await client.ignore(tube_name)
        with pytest.raises(TimedOut):
            await client.reserve_with_timeout(0)
        with pytest.raises(JobTooBig):
            await client.put(b"x" * 65536)
        for name in ("-dash", "x" * 201, "star*"):
            with pytest.raises(BadFormat):
                await client.use(name)
        assert client.used == tube_name  # refused: the state did not change

        unowned = await client.put(b"unowned")
        with pytest.raises(NotFound):  # ready, not reserved by this connection
            await client.release(unowned)
        await client.delete(unowned)

        await client.put(b"short", ttr=1)
        job = await client.reserve_with_timeout(1)
        # ttr 1: the job is inside its 1 s safety margin as soon as it is reserved, and no
        # other job is ready
        with pytest.raises(DeadlineSoon):
            await client.reserve_with_timeout(1)
        await job.delete()
        assert await client.list_tube_used() == tube_name  # still the same connection


async def test_push_is_unknown_to_beanstalkd(client_beanstalkd: ServerProcess,
                                             tube_name: str) -> None:
    async with connected(*client_beanstalkd.address, tube_name) as client:
        with pytest.raises(UnknownCommand):
            await client.push(4)
        with pytest.raises(TimedOut):  # not a push connection: reserves allowed
            await client.reserve_with_timeout(0)


async def test_push_credits_bound_the_jobs_outstanding(client_tubeq: ServerProcess,
                                                       tube_name: str) -> None:
    async with connected(*client_tubeq.address, tube_name) as client, \
            connected(*client_tubeq.address, tube_name) as producer:
        assert await client.push(2) == 2
        ids = [await producer.put(b"%d" % i) for i in range(3)]
        first, second = await client.next_pushed(), await client.next_pushed()
        assert [first.id, second.id] == ids[:2]
        assert first.tube == tube_name and first.reserved
        stats = await producer.stats_tube(tube_name)
        assert (stats["current-jobs-reserved"], stats["current-jobs-ready"]) == (2, 1)
        await first.delete()  # frees a credit: the third comes
        third = await client.next_pushed()
        assert third.id == ids[2]
        await second.touch()
        await second.release(delay=100)
        await third.bury()
        await client.push(0)
        await producer.kick_job(second.id)
        await producer.kick_job(third.id)
        await asyncio.sleep(0.2)  # nothing may come with no credits (not a timing assertion)
        stats = await producer.stats_tube(tube_name)
        assert (stats["current-jobs-reserved"], stats["current-jobs-ready"]) == (0, 2)
        for job_id in ids[1:]:
            await producer.delete(job_id)


async def test_pipelined_calls_get_their_own_replies(any_server: ServerProcess,
                                                     tube_name: str) -> None:
    async with connected(*any_server.address, tube_name) as client:
        bodies = [b"body %d" % i for i in range(200)]
        ids = await asyncio.gather(*(client.put(body) for body in bodies))
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        peeked = await asyncio.gather(*(client.peek(job_id) for job_id in ids))
        assert [job.body for job in peeked] == bodies
        mixed = await asyncio.gather(
            client.stats_tube(tube_name), client.list_tube_used(), client.peek(ids[5]),
            client.list_tubes_watched(), client.stats_job(ids[7]), client.kick(0),
            client.peek_ready(), return_exceptions=True)
        assert isinstance(mixed[0], dict) and mixed[0]["current-jobs-ready"] == 200
        assert mixed[1] == tube_name
        assert isinstance(mixed[2], Job) and mixed[2].body == bodies[5]
        assert mixed[3] == [tube_name]
        assert isinstance(mixed[4], dict) and mixed[4]["id"] == ids[7]
        assert mixed[5] == 0
        assert isinstance(mixed[6], Job) and mixed[6].id == ids[0]
        results = await asyncio.gather(*(client.delete(job_id) for job_id in ids),
                                       client.delete(NO_SUCH_JOB), return_exceptions=True)
        assert results[:-1] == [None] * len(ids)
        assert isinstance(results[-1], NotFound)


async def test_reconnect_restores_use_and_watch(any_server: ServerProcess,
                                                tube_name: str) -> None:
    other = f"{tube_name}-b"
    async with Proxy(*any_server.address) as proxy, \
            connected(*any_server.address, tube_name) as admin, \
            Client("127.0.0.1", proxy.port) as client:
        await client.use(tube_name)
        await client.watch(tube_name)
        await client.watch(other)
        await client.ignore("default")
        job_id = await client.put(b"held")
        job = await client.reserve_with_timeout(1)
        assert job.id == job_id
        pending = asyncio.ensure_future(client.reserve_with_timeout(30))
        await eventually(lambda: _stat(admin, tube_name, "current-waiting", 1),
                         "the reserve is waiting on the server")

        proxy.cut()
        with pytest.raises(ClientConnectionError):
            await pending
        with pytest.raises(ClientConnectionError):  # its connection is gone
            await job.release()
        await eventually(lambda: _state(admin, job_id, "ready"),
                         "the server put the reservation back")

        assert await client.list_tube_used() == tube_name  # reconnected here
        assert sorted(await client.list_tubes_watched()) == sorted([tube_name, other])
        assert proxy.accepted == 2
        job = await client.reserve_with_timeout(1)  # watches restored: it finds the job
        assert job.id == job_id
        await job.delete()


async def test_quit_then_the_next_call_reconnects(any_server: ServerProcess,
                                                  tube_name: str) -> None:
    async with connected(*any_server.address, tube_name) as client:
        inserted = asyncio.ensure_future(client.put(b"before quit"))
        await asyncio.sleep(0)  # the put is written, its reply not read yet
        await client.quit()
        job_id = await inserted  # answered before the server closed
        assert not client.connected
        assert await client.list_tube_used() == tube_name
        await client.delete(job_id)


async def test_a_cancelled_reserve_that_is_granted_later_is_released(
        any_server: ServerProcess, tube_name: str) -> None:
    async with connected(*any_server.address, tube_name) as client, \
            connected(*any_server.address, tube_name) as producer:
        waiting = asyncio.ensure_future(client.reserve_with_timeout(30))
        await eventually(lambda: _stat(producer, tube_name, "current-waiting", 1),
                         "the reserve is waiting on the server")
        waiting.cancel()
        job_id = await producer.put(b"orphan", pri=77)
        # "ready" alone can be seen before the waiter takes the job (tubeq hands a put's job
        # to a waiter one wake-up after INSERTED: protocol.md), so wait for the release.
        await eventually(lambda: _released(producer, job_id), "the orphaned job was released")
        stats = await producer.stats_job(job_id)
        assert (stats["state"], stats["reserves"], stats["releases"], stats["pri"]) == (
            "ready", 1, 1, 77)
        assert await client.list_tube_used() == tube_name  # the connection is fine
        await producer.delete(job_id)


async def test_draining_server_refuses_puts(tmp_path: Path,
                                            tubeq_factory: Callable[[str], ServerProcess]
                                            ) -> None:
    servers = [start_beanstalkd(tmp_path, "beanstalkd-draining")]
    try:
        servers.append(tubeq_factory(unique_prefix("drain")))
        for server in servers:
            async with Client(*server.address) as client:
                await client.put(b"before")
                os.kill(server.pid, signal.SIGUSR1)
                await eventually(functools.partial(_draining, client),
                                 f"{server.describe()} drains")
                with pytest.raises(Draining):
                    await client.put(b"after")
    finally:
        servers[0].stop()


async def _draining(client: Client) -> bool:
    return (await client.stats())["draining"] is True


async def _stat(client: Client, tube: str, key: str, value: int) -> bool:
    return (await client.stats_tube(tube))[key] == value


async def _released(client: Client, job_id: int) -> bool:
    return (await client.stats_job(job_id))["releases"] == 1


async def _state(client: Client, job_id: int, state: str) -> bool:
    return (await client.stats_job(job_id))["state"] == state
