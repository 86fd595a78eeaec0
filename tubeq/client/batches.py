"""Batches: the commands and reply conversions of tubeq's put-many, reserve-many and
delete-many (protocol.md "put-many" ...), for :class:`~tubeq.client.Client`.

Each builder returns the command's bytes and the converter of its ``BATCH <n>`` reply (the
parser gathers the n replies into :attr:`Reply.items`). A per-job failure inside a batch is a
result, not an exception: ``put_many`` returns the :class:`CommandError` of a refused job in
its place, ``delete_many`` False for an id not deleted. An error answering the whole command
(TIMED_OUT, BAD_FORMAT, UNKNOWN_COMMAND ...) is raised as usual.

beanstalkd has none of these commands. ``put-many`` must never reach it (it would read the
entries' bodies as commands), so the client asks the server's ``extensions`` first, once per
connection, and sends plain pipelined puts (deletes) to a server without them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from tubeq.client._contracts import Connection, Convert
from tubeq.client.args import _expect, _job_id, _tube, _uint
from tubeq.client.errors import CommandError, NotFound, ProtocolError, UnknownCommand
from tubeq.client.parser import Reply, parse_yaml_list
from tubeq.client.tracing import valid_traceparent
from tubeq.client.wire import (
    BATCH,
    CRLF,
    DEFAULT_PRIORITY,
    DEFAULT_TTR,
    DELETED,
    EXT_LINE_MAX,
    INSERTED,
    OK,
    PUT_MANY_MAX,
)

# The bodies one put-many carries at most, as the client splits them: well under what a tubeq
# server keeps for one batch (half its --max-client-buffer, 16 MiB by default), so no job of a
# put_many() is refused for the batch's size with the server's defaults.
PUT_MANY_BYTES: Final = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job of :meth:`Client.put_many` with its own priority, delay (s) or TTR (s), its
    group in the tube (tubeq's groups: protocol.md, "Groups"; None: none) and its W3C
    traceparent (protocol.md, "Traces"; None: none; put_many does not take the current
    OpenTelemetry context by itself, put_with does)."""

    body: bytes | str
    pri: int = DEFAULT_PRIORITY
    delay: int = 0
    ttr: int = DEFAULT_TTR
    group: str | None = None
    traceparent: str | None = None


PutResult = int | CommandError


def _entries(jobs: Iterable[bytes | str | NewJob], pri: int, delay: int,
             ttr: int) -> list[bytes]:
    """Each job as a put-many entry (put's line without its word, then the body); the same
    bytes after ``put `` make a plain put."""
    # The shared numbers of the plain bodies, checked and formatted once.
    shared = b"%d %d %d " % (_uint(pri, "pri"), _uint(delay, "delay"), _uint(ttr, "ttr"))
    out = []
    for job in jobs:
        if type(job) is bytes:
            out.append(b"%s%d\r\n%s\r\n" % (shared, len(job), job))
            continue
        if not isinstance(job, NewJob):
            job = NewJob(job, pri, delay, ttr)
        body = job.body.encode("utf-8") if isinstance(job.body, str) else bytes(job.body)
        options = b"" if job.group is None else b" group=" + _tube(job.group)
        if job.traceparent is not None:
            if not valid_traceparent(job.traceparent):
                raise ValueError(f"traceparent {job.traceparent!r}: a W3C traceparent of "
                                 "version 00")
            options += b" traceparent=" + job.traceparent.encode("ascii")
        out.append(b"%d %d %d %d%s\r\n%s\r\n" % (
            _uint(job.pri, "pri"), _uint(job.delay, "delay"), _uint(job.ttr, "ttr"), len(body),
            options, body))
    return out


def _put_chunks(entries: list[bytes]) -> Iterator[list[bytes]]:
    """Consecutive runs of at most PUT_MANY_MAX entries and about PUT_MANY_BYTES."""
    chunk: list[bytes] = []
    size = 0
    for entry in entries:
        if chunk and (len(chunk) == PUT_MANY_MAX or size + len(entry) > PUT_MANY_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += len(entry)
    if chunk:
        yield chunk


def _error_of(reply: Reply, command: str) -> CommandError:
    """The exception an error reply stands for (ProtocolError for a word that is none)."""
    try:
        _expect(reply, command)
    except CommandError as error:
        return error
    raise AssertionError("unreachable: _expect with no word always raises")


def _items(reply: Reply, command: str, count: int | None = None) -> tuple[Reply, ...]:
    _expect(reply, command, BATCH)
    if count is not None and len(reply.items) != count:
        raise ProtocolError(f"{command}: BATCH of {len(reply.items)} replies for {count} jobs")
    return reply.items


def put_many_command(chunk: list[bytes]) -> tuple[bytes, Convert[list[PutResult]]]:
    def convert(reply: Reply, link: Connection) -> list[PutResult]:
        # int(args[0]): the parser checked that INSERTED has one decimal argument.
        return [int(item.args[0]) if item.word == INSERTED else _error_of(item, "put-many")
                for item in _items(reply, "put-many", len(chunk))]

    return b"put-many %d\r\n%s" % (len(chunk), b"".join(chunk)), convert


def put_command(entry: bytes) -> tuple[bytes, Convert[PutResult]]:
    """A plain put of one entry, its error returned as the result (a server without batches)."""
    def convert(reply: Reply, link: Connection) -> PutResult:
        return reply.int_arg(0) if reply.word == INSERTED else _error_of(reply, "put")

    return b"put " + entry, convert


def delete_many_commands(ids: Iterable[int]) -> list[tuple[bytes, Convert[list[bool]]]]:
    """delete-many commands for ``ids``, in order, each line within EXT_LINE_MAX; each id
    checked and written once."""
    commands: list[tuple[bytes, Convert[list[bool]]]] = []
    run: list[int] = []
    pieces: list[bytes] = []
    length = len(b"delete-many") + len(CRLF)
    for job_id in ids:
        piece = b" %d" % _job_id(job_id)
        if run and length + len(piece) > EXT_LINE_MAX:
            commands.append(_delete_many_command(run, pieces))
            run, pieces, length = [], [], len(b"delete-many") + len(CRLF)
        run.append(job_id)
        pieces.append(piece)
        length += len(piece)
    if run:
        commands.append(_delete_many_command(run, pieces))
    return commands


def _delete_many_command(ids: list[int], pieces: list[bytes]
                         ) -> tuple[bytes, Convert[list[bool]]]:
    def convert(reply: Reply, link: Connection) -> list[bool]:
        out = []
        for item in _items(reply, "delete-many", len(ids)):
            if item.word == DELETED:
                out.append(True)
            elif isinstance(_error_of(item, "delete-many"), NotFound):
                out.append(False)
            else:
                raise _error_of(item, "delete-many")
        return out

    return b"delete-many%s\r\n" % b"".join(pieces), convert


def delete_command(job_id: int) -> tuple[bytes, Convert[bool]]:
    """A plain delete, NOT_FOUND as False (a server without batches)."""
    def convert(reply: Reply, link: Connection) -> bool:
        if reply.word == DELETED:
            return True
        error = _error_of(reply, "delete")
        if isinstance(error, NotFound):
            return False
        raise error

    return b"delete %d\r\n" % _job_id(job_id), convert


def extensions_command(*, probe: bool) -> tuple[bytes, Convert[list[str]]]:
    """``extensions``; with ``probe``, UNKNOWN_COMMAND (beanstalkd) is an empty list."""
    def convert(reply: Reply, link: Connection) -> list[str]:
        if probe and reply.word != OK and isinstance(_error_of(reply, "extensions"),
                                                     UnknownCommand):
            link.extensions = frozenset()
            return []
        _expect(reply, "extensions", OK)
        assert reply.body is not None
        words = parse_yaml_list(reply.body)
        link.extensions = frozenset(words)
        return words

    return b"extensions\r\n", convert
