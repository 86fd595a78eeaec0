"""The bundled asyncio client: every beanstalkd command as a typed method, and ``consume()``.

It speaks the beanstalkd protocol, so it works against tubeq and against beanstalkd itself. The
layers run one way, as in the server (socket -> parser -> conversion -> caller):

* :class:`ReplyParser` is sans-IO: bytes in, complete :class:`Reply` frames out. It owns the
  reply grammar (:data:`REPLY_ARITY`), the line and body limits, and the length-delimited bodies;
  it never returns part of a frame, so no half-read job can escape it.
* ``_Link`` is one TCP connection, a thin :class:`asyncio.Protocol`: it writes commands, feeds the
  parser and hands each reply, in wire order, to the command that asked for it. Replies are
  converted (state updated, :class:`Job` built, error raised) synchronously as they are routed,
  whether or not the caller is still waiting, so pipelined calls and cancelled calls cannot
  disturb the connection's state.
* :class:`Client` holds one link at a time: typed methods, reconnect, and the ``use``/``watch``
  state replayed on a new connection.
* :class:`Consumer` (``client.consume()``) keeps jobs in flight over long-lived connections of
  its own, with a server-side push extension when the server has one and pipelined
  ``reserve-with-timeout`` otherwise.

Rules:

* Error replies become exceptions through one table, :data:`ERRORS`. A reply outside the grammar
  or one that does not answer the command raises :class:`ProtocolError` and closes the connection
  (nothing after a bad frame can be trusted); a closed or lost connection raises
  :class:`ClientConnectionError` for every call still waiting.
* A reservation belongs to a connection, as on the server. A reserved :class:`Job` is bound to
  the link that reserved it; its ``delete``/``release``/``bury``/``touch`` go on that link and
  fail with :class:`ClientConnectionError` once it is gone (the server has already put the job
  back), never on a fresh connection where they would mean something else.
* Pipelined commands wait behind a blocking reserve on the server. A reserve whose caller was
  cancelled stays on the server; if it is later granted, the client releases the job at its
  original priority (the job is "orphaned", see ``Client._release_orphan``).

Logging goes to the standard ``logging`` module (logger ``tubeq.client``): a library should not
impose the server's structlog setup on the applications that import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, ClassVar, Final, Literal, TypeVar

from tubeq import replies

__all__ = [
    "DEFAULT_PORT", "DEFAULT_PRIORITY", "DEFAULT_TTR", "ERRORS", "BadFormat", "Buried",
    "Client", "ClientConnectionError", "ClientError", "CommandError", "Consumer", "DeadlineSoon",
    "Draining", "ExpectedCrlf", "InternalError", "Job", "JobTooBig", "NotFound", "NotIgnored",
    "OutOfMemory", "ProtocolError", "Reply", "ReplyParser", "Stats", "TimedOut",
    "UnknownCommand", "backoff_delay", "parse_yaml_list", "parse_yaml_mapping", "touch_interval",
]

log = logging.getLogger("tubeq.client")

T = TypeVar("T")

# --------------------------------------------------------------------------------------------
# Vocabulary and limits
# --------------------------------------------------------------------------------------------

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 11300
DEFAULT_TUBE: Final = "default"
# The middle of the 32-bit range: as far from "urgent" (< 1024) as from the least urgent job, so
# callers can go either way without thinking about it.
DEFAULT_PRIORITY: Final = 2**31
# A minute: long enough for most jobs; workers that need more ask for it or touch the job.
DEFAULT_TTR: Final = 60

U32_MAX: Final = 2**32 - 1
U64_MAX: Final = 2**64 - 1

# The longest reply line beanstalkd sends is ``USING <200-byte tube>\r\n`` (208 bytes); a
# RESERVED header is at most 9 + 20 + 1 + 10 + 2 bytes. A server sending more than this without a
# CRLF is not speaking the protocol, and waiting longer would buffer without bound.
MAX_REPLY_LINE: Final = 256
# beanstalkd refuses ``-z`` above 1 GiB (JOB_DATA_SIZE_LIMIT_MAX), so no job or stats document can
# be larger; a bigger announced length is garbage we must not try to buffer.
MAX_BODY: Final = 1 << 30
# How long quit()/aclose() wait for the server to close its side before closing ours.
CLOSE_WAIT_S: Final = 2.0

CRLF: Final = b"\r\n"


def _word(reply: bytes) -> bytes:
    """The word of a reply constant of the server: ``NOT_FOUND\\r\\n`` -> ``NOT_FOUND``."""
    return reply.removesuffix(CRLF)


# Success replies. The ones without arguments are the server's own constants (tubeq.replies).
INSERTED: Final = b"INSERTED"
USING: Final = b"USING"
RESERVED: Final = b"RESERVED"
WATCHING: Final = b"WATCHING"
FOUND: Final = b"FOUND"
OK: Final = b"OK"
DELETED: Final = _word(replies.DELETED)
RELEASED: Final = _word(replies.RELEASED)
BURIED: Final = _word(replies.BURIED)
TOUCHED: Final = _word(replies.TOUCHED)
KICKED: Final = _word(replies.KICKED)
PAUSED: Final = _word(replies.PAUSED)
# The push extension's acknowledgement (tubeq only; see Client.push).
PUSHING: Final = b"PUSHING"

# The reply grammar: each word and the argument counts it may carry. Every argument is an
# unsigned decimal except USING's tube name. RESERVED, FOUND and OK are followed by a body whose
# length is their last argument. BURIED carries an id when it answers a put (out of memory);
# KICKED carries a count when it answers kick, none when it answers kick-job.
REPLY_ARITY: Final[Mapping[bytes, frozenset[int]]] = {
    INSERTED: frozenset({1}),
    USING: frozenset({1}),
    RESERVED: frozenset({2}),
    WATCHING: frozenset({1}),
    FOUND: frozenset({2}),
    OK: frozenset({1}),
    DELETED: frozenset({0}),
    RELEASED: frozenset({0}),
    BURIED: frozenset({0, 1}),
    TOUCHED: frozenset({0}),
    KICKED: frozenset({0, 1}),
    PAUSED: frozenset({0}),
    PUSHING: frozenset({1}),
    _word(replies.BAD_FORMAT): frozenset({0}),
    _word(replies.UNKNOWN_COMMAND): frozenset({0}),
    _word(replies.EXPECTED_CRLF): frozenset({0}),
    _word(replies.JOB_TOO_BIG): frozenset({0}),
    _word(replies.DRAINING): frozenset({0}),
    _word(replies.OUT_OF_MEMORY): frozenset({0}),
    _word(replies.INTERNAL_ERROR): frozenset({0}),
    _word(replies.NOT_FOUND): frozenset({0}),
    _word(replies.NOT_IGNORED): frozenset({0}),
    _word(replies.DEADLINE_SOON): frozenset({0}),
    _word(replies.TIMED_OUT): frozenset({0}),
}
BODY_WORDS: Final = frozenset({RESERVED, FOUND, OK})
TEXT_ARG_WORDS: Final = frozenset({USING})

# --------------------------------------------------------------------------------------------
# Exceptions
# --------------------------------------------------------------------------------------------


class ClientError(Exception):
    """The base of every exception this module raises about the server or the connection."""


class ClientConnectionError(ClientError, ConnectionError):
    """The connection could not be opened, was closed, or was lost (also mid-reply).

    Calls still waiting for a reply get it; nothing half-received is returned. The server puts
    back every job the connection had reserved.
    """


class ProtocolError(ClientError):
    """The server sent bytes outside the beanstalkd reply grammar, or a reply that does not answer
    the command it is paired with. The connection is closed: nothing after it can be trusted."""


class CommandError(ClientError):
    """The server answered a command with an error reply; the connection stays usable."""

    reply: ClassVar[bytes] = b""

    def __init__(self, command: str, detail: str = "") -> None:
        self.command = command
        super().__init__(f"{command}: {_word(self.reply).decode()}{detail}")


class BadFormat(CommandError):
    """BAD_FORMAT: the command line was malformed: a bad tube name (leading ``-``, a character
    outside beanstalkd's set, longer than 200 bytes) or a number out of range."""

    reply = replies.BAD_FORMAT


class UnknownCommand(CommandError):
    """UNKNOWN_COMMAND: the server does not know the command (beanstalkd answers ``push`` so)."""

    reply = replies.UNKNOWN_COMMAND


class ExpectedCrlf(CommandError):
    """EXPECTED_CRLF: a put's body was not followed by CRLF (a client bug; never sent by this
    client, which frames bodies by length)."""

    reply = replies.EXPECTED_CRLF


class JobTooBig(CommandError):
    """JOB_TOO_BIG: a put's body is larger than the server's ``max-job-size`` (``-z``)."""

    reply = replies.JOB_TOO_BIG


class Draining(CommandError):
    """DRAINING: the server is in drain mode (SIGUSR1) and takes no new jobs."""

    reply = replies.DRAINING


class OutOfMemory(CommandError):
    """OUT_OF_MEMORY: beanstalkd could not allocate the job (tubeq never sends it: a failing
    Redis gives INTERNAL_ERROR)."""

    reply = replies.OUT_OF_MEMORY


class InternalError(CommandError):
    """INTERNAL_ERROR: the server failed on its side (tubeq: Redis unreachable); the command had
    no effect and may be retried."""

    reply = replies.INTERNAL_ERROR


class NotFound(CommandError):
    """NOT_FOUND: no such job (or not in a state the command accepts: release, bury and touch
    need a job this connection reserved; peek-* found nothing), or no such tube for
    stats-tube and pause-tube."""

    reply = replies.NOT_FOUND


class NotIgnored(CommandError):
    """NOT_IGNORED: ``ignore`` of the last watched tube; a connection always watches one."""

    reply = replies.NOT_IGNORED


class DeadlineSoon(CommandError):
    """DEADLINE_SOON: a reserve while a job this connection holds is within 1 s of its TTR and
    nothing is ready: finish or touch that job first."""

    reply = replies.DEADLINE_SOON


class TimedOut(CommandError):
    """TIMED_OUT: ``reserve-with-timeout`` found no ready job within its timeout."""

    reply = replies.TIMED_OUT


class Buried(CommandError):
    """BURIED as an error: beanstalkd ran out of memory growing a priority queue and buried the
    job instead (``put`` then carries the new job's id in ``job_id``; ``release`` carries none).
    A successful ``bury`` is not an error."""

    reply = replies.BURIED

    def __init__(self, command: str, job_id: int | None = None) -> None:
        self.job_id = job_id
        super().__init__(command, "" if job_id is None else f" (job {job_id})")


# The one table from error reply to exception. A word in it answers any command with its
# exception, unless that command expects the word as success (``bury`` expects BURIED).
ERRORS: Final[Mapping[bytes, type[CommandError]]] = {
    _word(replies.BAD_FORMAT): BadFormat,
    _word(replies.UNKNOWN_COMMAND): UnknownCommand,
    _word(replies.EXPECTED_CRLF): ExpectedCrlf,
    _word(replies.JOB_TOO_BIG): JobTooBig,
    _word(replies.DRAINING): Draining,
    _word(replies.OUT_OF_MEMORY): OutOfMemory,
    _word(replies.INTERNAL_ERROR): InternalError,
    _word(replies.NOT_FOUND): NotFound,
    _word(replies.NOT_IGNORED): NotIgnored,
    _word(replies.DEADLINE_SOON): DeadlineSoon,
    _word(replies.TIMED_OUT): TimedOut,
    _word(replies.BURIED): Buried,
}
assert set(ERRORS) <= set(REPLY_ARITY), "every error word must be in the reply grammar"

# --------------------------------------------------------------------------------------------
# Sans-IO: replies and stats documents
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """One complete reply frame: its word, its arguments, and its body for RESERVED/FOUND/OK."""

    word: bytes
    args: tuple[bytes, ...] = ()
    body: bytes | None = None

    def int_arg(self, index: int) -> int:
        """Argument ``index`` as an int (the parser checked it is decimal)."""
        if index >= len(self.args):
            raise ProtocolError(f"{self.word.decode()} without its argument")
        return int(self.args[index])


class ReplyParser:
    """Bytes in, complete reply frames out; no I/O.

    ``feed`` returns every frame completed by the new bytes. Bytes outside the grammar stop the
    parser: the frames before them are still returned and :attr:`error` is set; the caller
    closes the connection. :attr:`mid_reply` tells whether a close now would cut a frame.
    """

    def __init__(self, max_body: int = MAX_BODY) -> None:
        self.max_body = max_body
        self.error: ProtocolError | None = None
        self._buf = bytearray()
        self._head: Reply | None = None  # a RESERVED/FOUND/OK line waiting for its body
        self._size = 0

    @property
    def mid_reply(self) -> bool:
        return self._head is not None or bool(self._buf)

    def feed(self, data: bytes) -> list[Reply]:
        if self.error is not None:
            return []
        buf = self._buf
        buf += data
        out: list[Reply] = []
        pos = 0
        try:
            while True:
                if self._head is not None:
                    end = pos + self._size
                    if len(buf) < end + 2:
                        break
                    if buf[end:end + 2] != CRLF:
                        raise ProtocolError(
                            f"{self._head.word.decode()} body of {self._size} bytes is not "
                            f"followed by CRLF")
                    out.append(replace(self._head, body=bytes(buf[pos:end])))
                    self._head = None
                    pos = end + 2
                    continue
                eol = buf.find(CRLF, pos, pos + MAX_REPLY_LINE)
                if eol < 0:
                    if len(buf) - pos >= MAX_REPLY_LINE:
                        raise ProtocolError(
                            f"reply line longer than {MAX_REPLY_LINE} bytes: "
                            f"{bytes(buf[pos:pos + 40])!r}...")
                    break
                reply = self._parse_line(bytes(buf[pos:eol]))
                pos = eol + 2
                if reply.word in BODY_WORDS:
                    self._head = reply
                    self._size = reply.int_arg(len(reply.args) - 1)
                else:
                    out.append(reply)
        except ProtocolError as error:
            self.error = error
            buf.clear()
            return out
        del buf[:pos]
        return out

    def _parse_line(self, line: bytes) -> Reply:
        word, *args = line.split(b" ")
        arity = REPLY_ARITY.get(word)
        if arity is None:
            raise ProtocolError(f"not a beanstalkd reply: {line[:60]!r}")
        if len(args) not in arity:
            raise ProtocolError(f"{word.decode()} with {len(args)} arguments: {line[:60]!r}")
        if word not in TEXT_ARG_WORDS:
            for arg in args:
                # 20 digits hold any 64-bit id; isdigit() on bytes accepts ASCII digits only.
                if not (arg.isdigit() and len(arg) <= 20):
                    raise ProtocolError(f"{word.decode()} with a non-numeric argument: "
                                        f"{line[:60]!r}")
        elif not args[0]:
            raise ProtocolError(f"{word.decode()} without a name")
        if word in BODY_WORDS and int(args[-1]) > self.max_body:
            raise ProtocolError(f"{word.decode()} announces {int(args[-1])} bytes, more than "
                                f"{self.max_body}")
        return Reply(word, tuple(args))


StatValue = int | float | bool | str
Stats = dict[str, StatValue]

_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+\.[0-9]+")


def _unquote(text: str) -> str:
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text


def _scalar(text: str) -> StatValue:
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if text in ("true", "false"):
        return text == "true"
    return _unquote(text)


def _yaml_lines(data: bytes) -> list[str]:
    lines = data.decode("utf-8", errors="replace").split("\n")
    if not lines or lines[0] != "---":
        raise ProtocolError(f"stats document does not start with '---': {data[:40]!r}")
    return [line for line in lines[1:] if line]


def parse_yaml_mapping(data: bytes, text_keys: Iterable[str] = ()) -> Stats:
    """beanstalkd's flat YAML mapping (``---`` then ``key: value`` lines) as a dict.

    Values are ints, floats (``rusage-*``), booleans, or text (double quotes removed: 1.12
    quotes ``version``); keys in ``text_keys`` stay text whatever they look like (a tube named
    ``42``). Nothing else of YAML is understood: a ``#`` is part of the value
    (``os: #1 SMP ...``).
    """
    keep_text = frozenset(text_keys)
    result: Stats = {}
    for line in _yaml_lines(data):
        key, sep, value = line.partition(": ")
        if not sep:
            key, sep, value = line.partition(":")
            if not sep or value:
                raise ProtocolError(f"not a 'key: value' line: {line[:60]!r}")
        result[key] = _unquote(value) if key in keep_text else _scalar(value)
    return result


def parse_yaml_list(data: bytes) -> list[str]:
    """beanstalkd's YAML list (``---`` then ``- item`` lines) as a list of strings."""
    items: list[str] = []
    for line in _yaml_lines(data):
        if not line.startswith("- "):
            raise ProtocolError(f"not a '- item' line: {line[:60]!r}")
        items.append(line[2:])
    return items


# Which values of each stats document are text even when they look like numbers.
JOB_TEXT_KEYS: Final = frozenset({"tube", "state"})
TUBE_TEXT_KEYS: Final = frozenset({"name"})
SERVER_TEXT_KEYS: Final = frozenset({"version", "id", "hostname", "os", "platform"})

# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------

# Bytes that would end or split a command line. Everything else is left to the server, which
# answers BAD_FORMAT for a name it does not accept (leading '-', '*', more than 200 bytes).
_UNSAFE_NAME = re.compile(rb"[\x00-\x20\x7f-\xff]")


def _tube(name: str) -> bytes:
    data = name.encode("utf-8")
    if not data or _UNSAFE_NAME.search(data):
        raise ValueError(f"tube name {name!r}: beanstalkd tube names are 1-200 bytes of "
                         f"A-Z a-z 0-9 - + / ; . $ _ ( )")
    return data


def _uint(value: int, name: str, maximum: int = U32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ValueError(f"{name} must be an integer from 0 to {maximum}, not {value!r}")
    return value


def _job_id(value: int) -> int:
    return _uint(value, "job id", U64_MAX)


def _expect(reply: Reply, command: str, *words: bytes) -> None:
    """Return if ``reply`` is one of ``words``; else raise its exception (or ProtocolError)."""
    if reply.word in words:
        return
    error = ERRORS.get(reply.word)
    if error is Buried:
        raise Buried(command, reply.int_arg(0) if reply.args else None)
    if error is not None:
        raise error(command)
    raise ProtocolError(f"{command}: {reply.word.decode()} does not answer it")


# --------------------------------------------------------------------------------------------
# One connection
# --------------------------------------------------------------------------------------------

Convert = Callable[[Reply, "_Link"], T]


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Any]
    convert: Callable[[Reply, _Link], Any]


class _Link(asyncio.Protocol):
    """One TCP connection: commands out, replies routed in wire order to the calls awaiting them.

    On a link that sent ``push``, RESERVED frames are jobs the server pushes: the client sends no
    reserve there, so no RESERVED can be the answer to a command, and every one goes to the push
    queue, wherever it falls between replies.
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self._parser = ReplyParser(client.max_body)
        self._transport: asyncio.Transport | None = None
        self._pending: deque[_Pending] = deque()
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.error: ClientError | None = None
        self.push_requested = False
        self.pushing = False
        self._pushed: deque[Job] = deque()
        self._push_waiters: set[asyncio.Future[None]] = set()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for reply in self._parser.feed(data):
            if self.error is not None:
                return
            self._route(reply)
        if self._parser.error is not None and self.error is None:
            self._fail(self._parser.error)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            if self._parser.mid_reply:
                what = "closed the connection in the middle of a reply"
            elif self._pending:
                what = f"closed the connection with {len(self._pending)} replies outstanding"
            else:
                what = "closed the connection"
            reason = f" ({exc})" if exc is not None else ""
            self.error = ClientConnectionError(f"{self._client.address}: server {what}{reason}")
        self._fail_waiters()
        self._writable.set()
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- sending ------------------------------------------------------------------------------

    def failure(self) -> ClientError:
        """A fresh exception saying why this link is unusable (one instance per raise)."""
        assert self.error is not None
        return type(self.error)(*self.error.args)

    @property
    def usable(self) -> bool:
        return self.error is None and self._transport is not None

    def send(self, data: bytes, convert: Convert[T], *,
             reserves: bool = False) -> asyncio.Future[T]:
        """Write one command; the future gets ``convert(reply)`` or its exception."""
        if self.error is not None:
            raise self.failure()
        if reserves and self.push_requested:
            raise RuntimeError("a connection that sent push must not send reserve commands: "
                               "their RESERVED replies could not be told from pushed jobs")
        assert self._transport is not None
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(future, convert))
        self._transport.write(data)
        return future

    def send_noreply(self, data: bytes) -> None:
        if self.error is not None:
            raise self.failure()
        assert self._transport is not None
        self._transport.write(data)

    async def wait_writable(self) -> None:
        await self._writable.wait()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- receiving ----------------------------------------------------------------------------

    def _route(self, reply: Reply) -> None:
        if reply.word == RESERVED and self.pushing:
            self._pushed.append(self._client._job_from(reply, self, None))
            self._wake_push_waiters()
            return
        if not self._pending:
            self._fail(ProtocolError(f"unsolicited reply {reply.word.decode()} from "
                                     f"{self._client.address}"))
            return
        pending = self._pending.popleft()
        future = pending.future
        try:
            value = pending.convert(reply, self)
        except ProtocolError as error:
            if not future.done():
                future.set_exception(error)
            self._fail(ProtocolError(f"{self._client.address}: {error}"))
            return
        except Exception as error:
            if not future.done():
                future.set_exception(error)
            return
        if not future.cancelled():
            future.set_result(value)
        elif isinstance(value, Job) and value.reserved:
            self._client._release_orphan(value)

    def _fail(self, error: ClientError) -> None:
        """Make the link unusable: every waiting call gets ``error``; the transport is aborted."""
        if self.error is None:
            self.error = error
        self._fail_waiters()
        if self._transport is not None:
            self._transport.abort()

    def _fail_waiters(self) -> None:
        while self._pending:
            future = self._pending.popleft().future
            if not future.done():
                future.set_exception(self.failure())
        self._wake_push_waiters()

    # -- pushed jobs --------------------------------------------------------------------------

    def _wake_push_waiters(self) -> None:
        for waiter in self._push_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._push_waiters.clear()

    async def next_pushed(self) -> Job:
        while not self._pushed:
            if self.error is not None:
                raise self.failure()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._push_waiters.add(waiter)
            try:
                await waiter
            finally:
                self._push_waiters.discard(waiter)
        return self._pushed.popleft()


# --------------------------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------------------------


class Job:
    """A job as the server showed it: ``id``, ``body`` and, when the client knows it, ``tube``.

    A job from a reserve (or pushed by the server) is *reserved*: it is bound to the connection
    that holds the reservation, and :meth:`delete`, :meth:`release`, :meth:`bury` and
    :meth:`touch` go on that connection. A job from peek is not reserved; its
    :meth:`delete` goes on the client's current connection.

    ``tube`` is known for a job from peek-ready/-delayed/-buried, for a reserved job when one
    tube is watched, and after :meth:`stats` (auto_touch calls it); otherwise it is None.

    A job handed out by :meth:`Client.consume` is settled with ``async with job:``: a block
    that ends normally deletes it; one that raises releases it with backoff, or buries it once
    it has been reserved ``max_tries`` times (see :class:`Consumer`).
    """

    __slots__ = ("_client", "_hold", "_link", "_pri", "_ttr", "body", "id", "reserved_at", "tube")

    def __init__(self, client: Client, job_id: int, body: bytes, *, tube: str | None = None,
                 link: _Link | None = None) -> None:
        self._client = client
        self.id = job_id
        self.body = body
        self.tube = tube
        self._link = link
        self._pri: int | None = None
        self._ttr: int | None = None
        self._hold: _Hold | None = None
        self.reserved_at = asyncio.get_running_loop().time()

    def __repr__(self) -> str:
        state = "reserved" if self._link is not None else "seen"
        tube = f" tube={self.tube!r}" if self.tube is not None else ""
        return f"<Job {self.id}{tube} {state} {len(self.body)} bytes>"

    @property
    def reserved(self) -> bool:
        """Whether this client reserved the job (through the connection it is bound to)."""
        return self._link is not None

    async def stats(self) -> Stats:
        """The job's ``stats-job`` document (also fills in ``tube`` and the cached priority
        and TTR)."""
        stats = await self._call(*_stats_job_command(self.id))
        if "pri" in stats:
            self._pri = int(stats["pri"])
        if "ttr" in stats:
            self._ttr = int(stats["ttr"])
        if "tube" in stats:
            self.tube = str(stats["tube"])
        return stats

    async def _priority(self, pri: int | None) -> int:
        if pri is not None:
            return pri
        if self._pri is None:
            await self.stats()
        if self._pri is None:
            raise ProtocolError(f"stats-job {self.id} has no pri")
        return self._pri

    async def _settle(self, data: bytes, convert: Convert[None]) -> None:
        try:
            await self._call(data, convert)
        except (NotFound, ClientConnectionError, ProtocolError):
            self._forget()  # the reservation is gone either way
            raise
        self._forget()

    async def _call(self, data: bytes, convert: Convert[T]) -> T:
        if self._link is None:
            return await self._client._call(data, convert)
        return await self._client._call_on(self._link, data, convert)

    def _forget(self) -> None:
        if self._hold is not None:
            self._hold.consumer._forget(self)

    async def delete(self) -> None:
        """Delete the job (DELETED); :class:`NotFound` if it is gone or reserved elsewhere."""
        await self._settle(*_delete_command(self.id))

    async def release(self, *, pri: int | None = None, delay: int = 0) -> None:
        """Put the reserved job back, ready or after ``delay`` s, at ``pri`` (default: its own
        priority, asked with stats-job when not known)."""
        priority = await self._priority(pri)
        await self._settle(*_release_command(self.id, priority, delay))

    async def bury(self, *, pri: int | None = None) -> None:
        """Bury the reserved job at ``pri`` (default: its own priority)."""
        priority = await self._priority(pri)
        await self._settle(*_bury_command(self.id, priority))

    async def touch(self) -> None:
        """Give the reserved job a full TTR from now."""
        await self._call(*_touch_command(self.id))

    async def __aenter__(self) -> Job:
        if self._hold is None:
            raise RuntimeError(f"job {self.id}: only a job handed out by consume() that is not "
                               f"settled yet can be used with 'async with'")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        hold = self._hold
        if hold is None:  # settled inside the block, or the consumer closed
            return False
        return await hold.consumer._settle_block(self, exc)


# Each command is its bytes and a converter; Client methods send them on the current connection,
# Job methods on the connection holding the reservation.


def _delete_command(job_id: int) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: _Link) -> None:
        _expect(reply, "delete", DELETED)

    return b"delete %d\r\n" % _job_id(job_id), convert


def _release_command(job_id: int, pri: int, delay: int) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: _Link) -> None:
        _expect(reply, "release", RELEASED)

    return (b"release %d %d %d\r\n" % (_job_id(job_id), _uint(pri, "pri"), _uint(delay, "delay")),
            convert)


def _bury_command(job_id: int, pri: int) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: _Link) -> None:
        _expect(reply, "bury", BURIED)

    return b"bury %d %d\r\n" % (_job_id(job_id), _uint(pri, "pri")), convert


def _touch_command(job_id: int) -> tuple[bytes, Convert[None]]:
    def convert(reply: Reply, link: _Link) -> None:
        _expect(reply, "touch", TOUCHED)

    return b"touch %d\r\n" % _job_id(job_id), convert


def _ok(command: str, parse: Callable[[bytes], T]) -> Convert[T]:
    def convert(reply: Reply, link: _Link) -> T:
        _expect(reply, command, OK)
        assert reply.body is not None
        return parse(reply.body)

    return convert


def _stats_job_command(job_id: int) -> tuple[bytes, Convert[Stats]]:
    parse = lambda data: parse_yaml_mapping(data, JOB_TEXT_KEYS)  # noqa: E731
    return b"stats-job %d\r\n" % _job_id(job_id), _ok("stats-job", parse)


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


class Client:
    """An asyncio beanstalkd client: one connection at a time, every command a typed method.

    Calls may be made concurrently: they are written at once (pipelined) and each gets its own
    reply, in order. The connection opens on the first call (or ``await client.connect()``, or
    ``async with Client(...)``). When it is lost, the calls waiting on it raise
    :class:`ClientConnectionError`; with ``reconnect=True`` the next call opens a new one and
    first replays ``use`` and ``watch``/``ignore`` so the new connection uses and watches what
    the old one did. Reservations do not survive a reconnect (the server put the jobs back).

    A blocking :meth:`reserve` holds every command pipelined behind it until it is answered,
    and cancelling the call does not withdraw it from the server; prefer
    :meth:`reserve_with_timeout`, or a :meth:`consume` loop.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                 connect_timeout: float = 10.0, reconnect: bool = True,
                 max_body: int = MAX_BODY) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.reconnect = reconnect
        self.max_body = max_body
        self._link: _Link | None = None
        self._connecting = asyncio.Lock()
        self._ever_connected = False
        self._used = DEFAULT_TUBE
        self._watched = [DEFAULT_TUBE]
        self._background: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<Client {self.address} {'connected' if self.connected else 'not connected'}>"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        return self._link is not None and self._link.usable

    @property
    def used(self) -> str:
        """The tube puts go to, as the server last confirmed."""
        return self._used

    @property
    def watched(self) -> tuple[str, ...]:
        """The watched tubes, as the server last confirmed."""
        return tuple(self._watched)

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Open a connection unless one is open, replaying ``use``/``watch`` state on it."""
        async with self._connecting:
            if not self.connected:
                await self._open()

    async def _current_link(self) -> _Link:
        link = self._link
        if link is not None and link.usable:
            return link
        if self._ever_connected and not self.reconnect:
            if link is not None and link.error is not None:
                raise link.failure()
            raise ClientConnectionError(f"{self.address}: not connected (reconnect is off)")
        async with self._connecting:
            link = self._link
            if link is None or not link.usable:
                link = await self._open()
            return link

    async def _open(self) -> _Link:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, link = await loop.create_connection(lambda: _Link(self), self.host, self.port)
        except TimeoutError as error:
            raise ClientConnectionError(
                f"cannot connect to {self.address}: no answer within "
                f"{self.connect_timeout:g} s") from error
        except OSError as error:
            # asyncio words a refused connection "Connect call failed (...)"; say it plainly.
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise ClientConnectionError(f"cannot connect to {self.address}: {reason}") from error
        # Replay the state the server confirmed on the previous connection, pipelined, before
        # any other call can write: watches first, so ignoring default never leaves none.
        restore: list[asyncio.Future[Any]] = []
        if self._used != DEFAULT_TUBE:
            restore.append(link.send(*self._use_command(self._used)))
        for tube in list(self._watched):
            if tube != DEFAULT_TUBE:
                restore.append(link.send(*self._watch_command(tube)))
        if DEFAULT_TUBE not in self._watched:
            restore.append(link.send(*self._ignore_command(DEFAULT_TUBE)))
        try:
            await asyncio.gather(*restore)
        except BaseException:
            link.close()
            raise
        self._link = link
        self._ever_connected = True
        return link

    def close(self) -> None:
        """Close the connection now (the server puts back the jobs it had reserved)."""
        if self._link is not None:
            self._link.close()

    async def aclose(self) -> None:
        """Close the connection and wait (briefly) until it is closed."""
        link = self._link
        if link is None:
            return
        link.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await link.wait_closed()

    async def quit(self) -> None:
        """Send ``quit``: the server answers the commands before it and closes the connection.

        A later call opens a new connection (when ``reconnect`` is on).
        """
        link = self._link
        if link is None or not link.usable:
            return
        link.send_noreply(b"quit\r\n")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await link.wait_closed()
        link.close()

    # -- plumbing -----------------------------------------------------------------------------

    async def _call(self, data: bytes, convert: Convert[T], *, reserves: bool = False) -> T:
        return await self._call_on(await self._current_link(), data, convert, reserves=reserves)

    async def _call_on(self, link: _Link, data: bytes, convert: Convert[T], *,
                       reserves: bool = False) -> T:
        future = link.send(data, convert, reserves=reserves)
        await link.wait_writable()
        return await future

    def _job_from(self, reply: Reply, link: _Link | None, tube: str | None) -> Job:
        assert reply.body is not None
        job = Job(self, reply.int_arg(0), reply.body, tube=tube, link=link)
        if link is not None and tube is None and len(self._watched) == 1:
            job.tube = self._watched[0]
        return job

    def _release_orphan(self, job: Job) -> None:
        """A reserve whose caller was cancelled got a job: put it back at its own priority."""

        async def release() -> None:
            try:
                await job.release(delay=0)  # its own priority, asked on its own connection
            except ClientError as error:  # its connection is gone: the server put it back
                log.debug("orphaned job %d not released: %s", job.id, error)

        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _use_command(self, tube: str) -> tuple[bytes, Convert[str]]:
        def convert(reply: Reply, link: _Link) -> str:
            _expect(reply, "use", USING)
            self._used = reply.args[0].decode("ascii", "replace")
            return self._used

        return b"use %s\r\n" % _tube(tube), convert

    def _watch_command(self, tube: str) -> tuple[bytes, Convert[int]]:
        def convert(reply: Reply, link: _Link) -> int:
            _expect(reply, "watch", WATCHING)
            if tube not in self._watched:
                self._watched.append(tube)
            return reply.int_arg(0)

        return b"watch %s\r\n" % _tube(tube), convert

    def _ignore_command(self, tube: str) -> tuple[bytes, Convert[int]]:
        def convert(reply: Reply, link: _Link) -> int:
            _expect(reply, "ignore", WATCHING)
            if tube in self._watched:
                # beanstalkd keeps the watch list as an array and fills a hole with the last.
                watched = self._watched
                watched[watched.index(tube)] = watched[-1]
                watched.pop()
            return reply.int_arg(0)

        return b"ignore %s\r\n" % _tube(tube), convert

    def _reserved(self, command: str) -> Convert[Job]:
        def convert(reply: Reply, link: _Link) -> Job:
            _expect(reply, command, RESERVED)
            return self._job_from(reply, link, None)

        return convert

    def _found(self, command: str, tube: Callable[[], str | None]) -> Convert[Job]:
        def convert(reply: Reply, link: _Link) -> Job:
            _expect(reply, command, FOUND)
            return self._job_from(reply, None, tube())

        return convert

    # -- producer commands --------------------------------------------------------------------

    async def put(self, body: bytes | str, *, pri: int = DEFAULT_PRIORITY, delay: int = 0,
                  ttr: int = DEFAULT_TTR) -> int:
        """Put a job into the used tube; returns its id. A ``str`` body is sent as UTF-8.

        Raises :class:`JobTooBig`, :class:`Draining`, :class:`Buried` (out of memory).
        """
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)

        def convert(reply: Reply, link: _Link) -> int:
            _expect(reply, "put", INSERTED)
            return reply.int_arg(0)

        line = b"put %d %d %d %d\r\n" % (_uint(pri, "pri"), _uint(delay, "delay"),
                                         _uint(ttr, "ttr"), len(data))
        return await self._call(line + data + CRLF, convert)

    async def use(self, tube: str) -> str:
        """Make ``tube`` the tube that put, peek-* and kick act on; returns it."""
        return await self._call(*self._use_command(tube))

    # -- worker commands ----------------------------------------------------------------------

    async def reserve(self) -> Job:
        """Wait as long as it takes for a ready job in a watched tube and reserve it.

        Raises :class:`DeadlineSoon` when a job this connection holds is about to time out.
        """
        return await self._call(b"reserve\r\n", self._reserved("reserve"), reserves=True)

    async def reserve_with_timeout(self, seconds: int) -> Job:
        """Reserve a ready job of a watched tube, waiting at most ``seconds`` (0: don't wait).

        Raises :class:`TimedOut` when none came, :class:`DeadlineSoon` (see :meth:`reserve`).
        """
        line = b"reserve-with-timeout %d\r\n" % _uint(seconds, "seconds")
        return await self._call(line, self._reserved("reserve-with-timeout"), reserves=True)

    async def reserve_job(self, job_id: int) -> Job:
        """Reserve job ``job_id`` whatever its tube and state (ready, delayed or buried).

        Raises :class:`NotFound` when there is no such job or it is reserved.
        """
        line = b"reserve-job %d\r\n" % _job_id(job_id)
        return await self._call(line, self._reserved("reserve-job"), reserves=True)

    async def delete(self, job_id: int) -> None:
        """Delete a job that is ready, delayed, buried, or reserved by this connection."""
        await self._call(*_delete_command(job_id))

    async def release(self, job_id: int, *, pri: int = DEFAULT_PRIORITY, delay: int = 0) -> None:
        """Put back a job this connection reserved, at ``pri``, ready or after ``delay`` s.

        (:meth:`Job.release` keeps the job's own priority by default.)
        """
        await self._call(*_release_command(job_id, pri, delay))

    async def bury(self, job_id: int, *, pri: int = DEFAULT_PRIORITY) -> None:
        """Bury a job this connection reserved, at ``pri``."""
        await self._call(*_bury_command(job_id, pri))

    async def touch(self, job_id: int) -> None:
        """Give a job this connection reserved a full TTR from now."""
        await self._call(*_touch_command(job_id))

    async def watch(self, tube: str) -> int:
        """Add ``tube`` to the watch list; returns how many tubes are watched."""
        return await self._call(*self._watch_command(tube))

    async def ignore(self, tube: str) -> int:
        """Remove ``tube`` from the watch list; returns how many tubes are watched.

        Raises :class:`NotIgnored` for the last watched tube.
        """
        return await self._call(*self._ignore_command(tube))

    # -- inspection ---------------------------------------------------------------------------

    async def peek(self, job_id: int) -> Job:
        """Job ``job_id`` in any state (not reserved by this call); :class:`NotFound` if none."""
        line = b"peek %d\r\n" % _job_id(job_id)
        return await self._call(line, self._found("peek", lambda: None))

    async def peek_ready(self) -> Job:
        """The job a reserve would take next from the used tube; :class:`NotFound` if none."""
        return await self._call(b"peek-ready\r\n", self._found("peek-ready", lambda: self._used))

    async def peek_delayed(self) -> Job:
        """The used tube's delayed job that is due soonest; :class:`NotFound` if none."""
        return await self._call(b"peek-delayed\r\n",
                                self._found("peek-delayed", lambda: self._used))

    async def peek_buried(self) -> Job:
        """The used tube's oldest buried job; :class:`NotFound` if none."""
        return await self._call(b"peek-buried\r\n",
                                self._found("peek-buried", lambda: self._used))

    async def kick(self, bound: int) -> int:
        """Kick up to ``bound`` jobs of the used tube (buried ones if any, else delayed ones);
        returns how many were kicked."""

        def convert(reply: Reply, link: _Link) -> int:
            _expect(reply, "kick", KICKED)
            return reply.int_arg(0)

        return await self._call(b"kick %d\r\n" % _uint(bound, "bound"), convert)

    async def kick_job(self, job_id: int) -> None:
        """Kick one buried or delayed job of any tube; :class:`NotFound` otherwise."""

        def convert(reply: Reply, link: _Link) -> None:
            _expect(reply, "kick-job", KICKED)

        await self._call(b"kick-job %d\r\n" % _job_id(job_id), convert)

    async def stats_job(self, job_id: int) -> Stats:
        """The job's stats (id, tube, state, pri, age, delay, ttr, time-left, reserves ...)."""
        return await self._call(*_stats_job_command(job_id))

    async def stats_tube(self, tube: str) -> Stats:
        """The tube's stats (current-jobs-*, total-jobs, current-waiting, pause ...)."""
        parse = lambda data: parse_yaml_mapping(data, TUBE_TEXT_KEYS)  # noqa: E731
        return await self._call(b"stats-tube %s\r\n" % _tube(tube),
                                _ok("stats-tube", parse))

    async def stats(self) -> Stats:
        """The server's stats."""
        parse = lambda data: parse_yaml_mapping(data, SERVER_TEXT_KEYS)  # noqa: E731
        return await self._call(b"stats\r\n", _ok("stats", parse))

    async def list_tubes(self) -> list[str]:
        """Every existing tube."""
        return await self._call(b"list-tubes\r\n", _ok("list-tubes", parse_yaml_list))

    async def list_tube_used(self) -> str:
        """The used tube, as the server sees it."""

        def convert(reply: Reply, link: _Link) -> str:
            _expect(reply, "list-tube-used", USING)
            return reply.args[0].decode("ascii", "replace")

        return await self._call(b"list-tube-used\r\n", convert)

    async def list_tubes_watched(self) -> list[str]:
        """The watched tubes, as the server sees them."""
        return await self._call(b"list-tubes-watched\r\n",
                                _ok("list-tubes-watched", parse_yaml_list))

    async def pause_tube(self, tube: str, delay: int) -> None:
        """Hold every reserve from ``tube`` for ``delay`` s (0 resumes now)."""

        def convert(reply: Reply, link: _Link) -> None:
            _expect(reply, "pause-tube", PAUSED)

        await self._call(b"pause-tube %s %d\r\n" % (_tube(tube), _uint(delay, "delay")), convert)

    # -- the push extension (tubeq) -----------------------------------------------------------

    async def push(self, credits: int) -> int:
        """Ask the server to push ready jobs of the watched tubes, ``credits`` at most held.

        After ``PUSHING <credits>`` the server sends jobs unsolicited; take them with
        :meth:`next_pushed`. Deleting, releasing or burying a pushed job frees a credit; sending
        push again changes the credit count (``push(0)``: no new deliveries). The
        connection must not send reserve commands any more (RuntimeError). A server without the
        extension (beanstalkd) raises :class:`UnknownCommand` and the connection is unchanged.
        Push mode ends with the connection: a reconnect does not restore it.
        """
        link = await self._current_link()

        def convert(reply: Reply, link: _Link) -> int:
            if reply.word != PUSHING:
                link.push_requested = False
            _expect(reply, "push", PUSHING)
            link.pushing = True  # RESERVED frames from here on are pushed jobs
            return reply.int_arg(0)

        line = b"push %d\r\n" % _uint(credits, "credits")
        future = link.send(line, convert)
        link.push_requested = True
        await link.wait_writable()
        return await future

    async def next_pushed(self) -> Job:
        """The next job the server pushed on this connection (waits for one).

        Raises :class:`ClientConnectionError` when the connection is gone (its jobs went back).
        """
        link = self._link
        if link is None or not link.pushing:
            raise RuntimeError("next_pushed() needs a connection in push mode (see push())")
        return await link.next_pushed()

    # -- consumption --------------------------------------------------------------------------

    def consume(self, tubes: str | Iterable[str], *, concurrency: int = 32,
                connections: int | None = None, auto_touch: bool = False,
                max_tries: int | None = 5, backoff_base: int = 1, backoff_max: int = 60,
                push: bool | None = None, reserve_timeout: int = 1,
                grace: float = 30.0) -> Consumer:
        """Jobs of ``tubes`` as they come, up to ``concurrency`` held at once (see Consumer)."""
        return Consumer(self, tubes, concurrency=concurrency, connections=connections,
                        auto_touch=auto_touch, max_tries=max_tries, backoff_base=backoff_base,
                        backoff_max=backoff_max, push=push, reserve_timeout=reserve_timeout,
                        grace=grace)

    async def work(self, handler: Callable[[Job], Awaitable[object]],
                   tubes: str | Iterable[str], **options: Any) -> None:
        """Run ``handler(job)`` for every job of ``tubes`` until cancelled (see Consumer.run)."""
        await self.consume(tubes, **options).run(handler)

    def _sibling(self) -> Client:
        """A new client for the same server with the same settings but its own connection."""
        return Client(self.host, self.port, connect_timeout=self.connect_timeout,
                      reconnect=False, max_body=self.max_body)


# --------------------------------------------------------------------------------------------
# Consumption
# --------------------------------------------------------------------------------------------

# Touch a job this long before its TTR ends: the server's safety margin is 1 s (a reserve
# behind which our touch may wait is answered DEADLINE_SOON when it starts), plus 0.5 s for the
# touch to travel and be processed.
TOUCH_AHEAD_S: Final = 1.5
# ... but never less often than four times per TTR (TTRs of 1-2 s).
TOUCH_MIN_FRACTION: Final = 0.25
# After DEADLINE_SOON a connection asks again only after this pause: the job in its margin gets
# touched, settled or expires within the margin (1 s), and asking at once would only bounce.
DEADLINE_SOON_PAUSE_S: Final = 0.25
# A lost consumer connection is reopened after this delay, doubled per failure up to the max.
RECONNECT_MIN_S: Final = 0.1
RECONNECT_MAX_S: Final = 5.0
# Connections a consumer opens unless told: enough to spread pipelined reserves, few enough
# that a server with many workers is not flooded with idle connections.
DEFAULT_CONNECTIONS: Final = 4


def backoff_delay(reserves: int, base: int, maximum: int) -> int:
    """Seconds to delay a failed job that has been reserved ``reserves`` times:
    ``min(base * 2 ** (reserves - 1), maximum)``."""
    exponent = max(0, reserves - 1)
    if exponent >= 63:
        return maximum
    return int(min(base * 2**exponent, maximum))


def touch_interval(ttr: int) -> float:
    """How often auto_touch touches a job whose TTR is ``ttr`` seconds."""
    return max(ttr - TOUCH_AHEAD_S, ttr * TOUCH_MIN_FRACTION)


@dataclass(eq=False)
class _Lane:
    """One long-lived consumer connection and the jobs reserved through it."""

    index: int
    client: Client
    share: int  # reserves in flight (or push credits) this connection may hold
    slots: asyncio.Semaphore
    held: set[Job] = field(default_factory=set)
    mode: Literal["push", "reserve"] | None = None
    subscribed: bool = False


@dataclass(eq=False)
class _Hold:
    """A consumer's claim on a job it reserved, from the reservation until it is settled."""

    consumer: Consumer
    lane: _Lane
    uses_slot: bool
    handed: bool = False
    keep_alive: asyncio.Task[None] | None = None


class Consumer:
    """Jobs of some tubes, as they become ready, over long-lived connections of its own.

    Two forms; both settle every job the same way:

    .. code-block:: python

        async for job in client.consume(["emails", "sms"], concurrency=32):
            async with job:                  # ends normally: deleted
                await send(job.body)         # raises: released with backoff, or buried

        await client.consume(["emails"], concurrency=32).run(handle)   # handle(job) concurrently

    Why ``async with job``: the body of an ``async for`` cannot tell the iterator how it ended
    (an exception leaves the loop before the iterator hears of it), while a context manager sees
    exactly that, per job. It also lets the caller hand each job to a task of its own (``async
    with`` inside the task), which is how jobs get processed concurrently; :meth:`run` does just
    that with ``handler(job)``. A failure is logged and swallowed (the loop goes on);
    cancellation is not swallowed. A job may also be settled explicitly instead
    (``job.delete()``, ``job.release()``, ``job.bury()``).

    Settling: success deletes the job. An exception asks the job's ``reserves`` count
    (stats-job) and releases it at its own priority with ``delay = min(backoff_base *
    2**(reserves-1), backoff_max)`` seconds, or buries it when ``reserves >= max_tries``
    (``max_tries=None``: never bury).

    ``concurrency`` bounds the jobs the consumer holds: reserved and not yet settled, whether
    waiting to be handed out, handed out, or in a handler. The consumer asks for more only as
    jobs are settled. With ``async for`` and no task per job only one job is processed at a time
    and the others wait reserved, their TTR running; keep ``concurrency`` small then, or set
    ``auto_touch``.

    ``auto_touch=True``: every held job is touched every ``ttr - 1.5`` s (a quarter of the TTR
    for TTRs under 2 s) from its reservation until it is settled. It costs one stats-job per job
    to learn the TTR.

    Delivery: each of ``connections`` connections watches ``tubes`` (and not ``default`` unless
    asked). With ``push`` None (the default) each connection first sends ``push <credits>``; a
    server with the push extension (tubeq) then sends ready jobs as they come, with no round
    trip per job; one answering UNKNOWN_COMMAND (beanstalkd) gets pipelined reserves instead:
    one ``reserve-with-timeout reserve_timeout`` that waits, plus ``reserve-with-timeout 0``
    for the rest of the connection's share while jobs keep coming, so at most one reserve per
    connection ever blocks the deletes and touches queued behind it. ``push=True`` requires the
    extension (UnknownCommand is raised from the iteration otherwise); ``push=False`` never asks.
    A lost connection is reopened with backoff; the jobs it held went back to the server.

    Stopping: :meth:`stop` (e.g. from a signal handler) stops taking jobs (push connections are
    sent ``push 0``), lets the jobs handed out finish for up to ``grace`` seconds, then closes
    the connections, which makes the server put back everything still reserved (jobs waiting
    unhanded, jobs pushed or granted after the stop). The iteration ends. Cancelling the task
    that iterates (or runs :meth:`run`) closes at once: the jobs in flight are put back without
    counting as failures. Use ``async with client.consume(...) as jobs:`` when the loop may be
    left by ``break`` or an exception: the connections are then closed when the block ends.
    """

    def __init__(self, client: Client, tubes: str | Iterable[str], *, concurrency: int = 32,
                 connections: int | None = None, auto_touch: bool = False,
                 max_tries: int | None = 5, backoff_base: int = 1, backoff_max: int = 60,
                 push: bool | None = None, reserve_timeout: int = 1,
                 grace: float = 30.0) -> None:
        self.tubes = [tubes] if isinstance(tubes, str) else list(tubes)
        if not self.tubes:
            raise ValueError("consume() needs at least one tube")
        for tube in self.tubes:
            _tube(tube)
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if max_tries is not None and max_tries < 1:
            raise ValueError("max_tries must be at least 1 (or None: never bury)")
        count = min(concurrency, connections or DEFAULT_CONNECTIONS)
        if count < 1:
            raise ValueError("connections must be at least 1")
        self.concurrency = concurrency
        self.auto_touch = auto_touch
        self.max_tries = max_tries
        self.backoff_base = _uint(backoff_base, "backoff_base")
        self.backoff_max = _uint(backoff_max, "backoff_max")
        self.push = push
        self.reserve_timeout = _uint(reserve_timeout, "reserve_timeout")
        self.grace = grace
        self._lanes: list[_Lane] = []
        for index in range(count):
            share = concurrency // count + (1 if index < concurrency % count else 0)
            self._lanes.append(_Lane(index, client._sibling(), share, asyncio.Semaphore(share)))
        self._ready: deque[Job] = deque()
        self._readers: set[asyncio.Future[None]] = set()
        self._handed: set[Job] = set()
        self._drivers: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._started = False
        self._stopping = False
        self._closed = False
        self._done = asyncio.Event()
        self._failure: BaseException | None = None
        self._iterating: asyncio.Task[Any] | None = None
        self._closer: asyncio.Task[None] | None = None

    # -- public surface -----------------------------------------------------------------------

    @property
    def modes(self) -> list[str | None]:
        """How each connection gets jobs: ``"push"``, ``"reserve"``, or None (not decided)."""
        return [lane.mode for lane in self._lanes]

    @property
    def held(self) -> int:
        """Jobs reserved through this consumer and not settled yet."""
        return sum(len(lane.held) for lane in self._lanes)

    def stop(self) -> None:
        """Stop taking jobs; the jobs handed out get ``grace`` s to finish, then connections close.

        Safe to call from a signal handler (``loop.add_signal_handler(SIGTERM, c.stop)``) and
        more than once.
        """
        if self._stopping:
            return
        self._stopping = True
        for driver in self._drivers:
            driver.cancel()
        for lane in self._lanes:
            if lane.mode == "push" and lane.client.connected:
                self._spawn(self._stop_pushing(lane))
        self._ready.clear()  # never handed out: closing the connections puts them back
        self._wake_readers()
        self._closer = self._spawn(self._close_when_idle())

    async def wait_closed(self) -> None:
        """Wait until the consumer has closed its connections."""
        if self._started or self._stopping:
            await self._done.wait()
            await asyncio.gather(*(lane.client.aclose() for lane in self._lanes))

    async def aclose(self) -> None:
        """Close now: every job still held goes back to the server."""
        self._close_now()
        await self.wait_closed()

    async def __aenter__(self) -> Consumer:
        self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc is None:
            self.stop()
            await self.wait_closed()
        else:
            self._close_now()

    def __aiter__(self) -> AsyncIterator[Job]:
        return self

    async def __anext__(self) -> Job:
        self._start()
        self._iterating = asyncio.current_task()
        while True:
            if self._failure is not None:
                raise self._failure
            if self._stopping:
                raise StopAsyncIteration
            while self._ready:
                job = self._ready.popleft()
                hold = job._hold
                if hold is not None:  # else its connection was lost while it waited here
                    hold.handed = True
                    self._handed.add(job)
                    return job
            reader: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._readers.add(reader)
            try:
                await reader
            except asyncio.CancelledError:
                self._close_now()
                raise
            finally:
                self._readers.discard(reader)

    async def run(self, handler: Callable[[Job], Awaitable[object]]) -> None:
        """Call ``handler(job)`` in a task per job, at most ``concurrency`` at once, until
        :meth:`stop` (then waits up to ``grace`` s for the running ones) or cancellation."""
        tasks: set[asyncio.Task[None]] = set()

        async def handle(job: Job) -> None:
            async with job:
                await handler(job)

        try:
            async for job in self:
                task = asyncio.get_running_loop().create_task(handle(job))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                _, late = await asyncio.wait(set(tasks), timeout=self.grace)
                for task in late:
                    task.cancel()
            await self.wait_closed()
        except BaseException:
            self._close_now()
            raise
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    # -- lifecycle ----------------------------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        for lane in self._lanes:
            self._drivers.append(self._spawn(self._drive(lane)))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _close_when_idle(self) -> None:
        """After stop(): wait (bounded) until the handed-out jobs are settled, then close."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.grace):
                while self._handed:
                    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    self._readers.add(waiter)
                    try:
                        await waiter
                    finally:
                        self._readers.discard(waiter)
        self._close_now()

    def _close_now(self) -> None:
        """Close every connection at once; the server puts back whatever they still hold."""
        if self._closed:
            return
        self._closed = self._stopping = True
        current = asyncio.current_task()
        for task in list(self._background):
            if task is not current:
                task.cancel()
        for lane in self._lanes:
            lane.client.close()
            for job in list(lane.held):
                self._forget(job)
        self._ready.clear()
        self._wake_readers()
        self._done.set()

    def _wake_readers(self) -> None:
        for reader in self._readers:
            if not reader.done():
                reader.set_result(None)
        self._readers.clear()

    # -- one connection -----------------------------------------------------------------------

    async def _drive(self, lane: _Lane) -> None:
        delay = RECONNECT_MIN_S
        while not self._stopping:
            try:
                await lane.client.connect()  # a reconnect replays the watch list
                if not lane.subscribed:
                    for tube in self.tubes:
                        await lane.client.watch(tube)
                    if DEFAULT_TUBE not in self.tubes:
                        await lane.client.ignore(DEFAULT_TUBE)
                    lane.subscribed = True
                if await self._try_push(lane):
                    delay = RECONNECT_MIN_S
                    await self._take_pushed(lane)
                else:
                    delay = RECONNECT_MIN_S
                    await self._reserve_pipelined(lane)
            except (ClientConnectionError, ProtocolError, InternalError) as error:
                # InternalError: the server lost its store (tubeq without Redis): start over.
                log.warning("consumer connection %d to %s: %s; reconnecting in %.1f s",
                            lane.index, lane.client.address, error, delay)
                lane.client.close()
                self._drop_unhanded(lane)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
            except asyncio.CancelledError:
                raise
            except BaseException as error:  # e.g. push=True against beanstalkd
                self._failure = error
                self._close_now()
                return

    async def _try_push(self, lane: _Lane) -> bool:
        if self.push is False:
            lane.mode = "reserve"
            return False
        # Jobs still held from a lost connection count against this lane's share: wait until
        # their handlers settle them, or the server's credits would exceed the bound.
        while lane.held:
            await asyncio.sleep(DEADLINE_SOON_PAUSE_S)
        try:
            await lane.client.push(lane.share)
        except UnknownCommand:
            if self.push:
                raise
            lane.mode = "reserve"
            return False
        lane.mode = "push"
        return True

    async def _stop_pushing(self, lane: _Lane) -> None:
        """``push 0``: no new deliveries while the jobs handed out finish."""
        with contextlib.suppress(ClientError):
            await lane.client.push(0)

    async def _take_pushed(self, lane: _Lane) -> None:
        while True:
            job = await lane.client.next_pushed()
            self._take(job, lane, uses_slot=False)

    async def _reserve_pipelined(self, lane: _Lane) -> None:
        """``lane.share`` reservers on one connection; only the first one's reserve may block.

        The first waits ``reserve_timeout`` s for a job and loops. When it gets one, jobs are
        coming: the others ask with timeout 0 (answered at once) until one times out, then wait
        for the first to see work again. Each reserver takes a slot before asking, so held jobs
        plus reserves in flight never exceed the share.
        """
        busy = asyncio.Event()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._reserver(lane, busy, first=(i == 0)))
                 for i in range(lane.share)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # raises the connection error that ended it
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _reserver(self, lane: _Lane, busy: asyncio.Event, *, first: bool) -> None:
        client = lane.client
        while True:
            if not first:
                await busy.wait()
            await lane.slots.acquire()
            try:
                job = await client.reserve_with_timeout(self.reserve_timeout if first else 0)
            except TimedOut:
                lane.slots.release()
                if not first:
                    busy.clear()
                continue
            except DeadlineSoon:
                lane.slots.release()
                busy.clear()
                await asyncio.sleep(DEADLINE_SOON_PAUSE_S)
                continue
            except InternalError as error:  # the server's store failed; this connection is fine
                lane.slots.release()
                busy.clear()
                log.warning("reserve on consumer connection %d: %s", lane.index, error)
                await asyncio.sleep(RECONNECT_MAX_S)
                continue
            except BaseException:
                lane.slots.release()
                raise
            if first:
                busy.set()
            self._take(job, lane, uses_slot=True)

    # -- held jobs ----------------------------------------------------------------------------

    def _take(self, job: Job, lane: _Lane, *, uses_slot: bool) -> None:
        if len(self.tubes) == 1:
            job.tube = self.tubes[0]
        job._hold = hold = _Hold(self, lane, uses_slot)
        lane.held.add(job)
        if self._stopping:
            return  # held until the connections close, which puts it back
        if self.auto_touch:
            hold.keep_alive = self._spawn(self._keep_alive(job))
        self._ready.append(job)
        self._wake_readers()

    def _forget(self, job: Job) -> None:
        """The job is no longer held: settled, or its connection is gone."""
        hold = job._hold
        if hold is None:
            return
        job._hold = None
        hold.lane.held.discard(job)
        self._handed.discard(job)
        if hold.keep_alive is not None and hold.keep_alive is not asyncio.current_task():
            hold.keep_alive.cancel()
        if hold.uses_slot:
            hold.lane.slots.release()
        if self._stopping:
            self._wake_readers()  # _close_when_idle counts the handed-out jobs

    def _drop_unhanded(self, lane: _Lane) -> None:
        """A lane's connection is gone: the jobs it held that nobody got are gone with it."""
        for job in list(lane.held):
            hold = job._hold
            if hold is not None and not hold.handed:
                self._forget(job)

    async def _keep_alive(self, job: Job) -> None:
        loop = asyncio.get_running_loop()
        try:
            if job._ttr is None:
                await job.stats()
            interval = touch_interval(job._ttr if job._ttr is not None else DEFAULT_TTR)
            due = job.reserved_at + interval
            while True:
                await asyncio.sleep(max(0.0, due - loop.time()))
                sent = loop.time()
                await job.touch()
                due = sent + interval
        except ClientError as error:
            log.warning("auto_touch of job %d stopped: %s", job.id, error)

    async def _settle_block(self, job: Job, exc: BaseException | None) -> bool:
        """The end of ``async with job``: delete, or release with backoff / bury, or put back."""
        if exc is None:
            try:
                await job.delete()
            except ClientError as error:
                log.warning("job %d done but not deleted: %s", job.id, error)
                self._forget(job)
            return False
        if not isinstance(exc, Exception):  # cancelled (or exiting): not the job's failure
            if isinstance(exc, asyncio.CancelledError) and (
                    asyncio.current_task() is self._iterating):
                self._close_now()  # the loop itself is being cancelled
            elif not self._closed:
                self._spawn(self._put_back(job))
            return False
        log.warning("job %d failed", job.id, exc_info=exc)
        try:
            stats = await job.stats()
            reserves, pri = int(stats["reserves"]), int(stats["pri"])
            if self.max_tries is not None and reserves >= self.max_tries:
                await job.bury(pri=pri)
            else:
                delay = backoff_delay(reserves, self.backoff_base, self.backoff_max)
                await job.release(pri=pri, delay=delay)
        except ClientError as error:
            log.warning("failed job %d not released: %s", job.id, error)
            self._forget(job)
        return True

    async def _put_back(self, job: Job) -> None:
        try:
            await job.release(delay=0)
        except ClientError as error:
            log.debug("job %d not put back: %s", job.id, error)
            self._forget(job)
