"""The beanstalkd wire protocol, sans-IO: bytes in, commands out.

Owns framing (CRLF-terminated lines, the line limit and the recovery from overlong lines) and the
``put`` body phase, including swallowing oversize bodies in step as they arrive (beanstalkd's bit
bucket). Each whole line goes to the grammar (tubeq.protocol.grammar: command recognition and
arguments); the limits are tubeq.protocol.limits'.

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

from tubeq.protocol import replies
from tubeq.protocol.batch_framing import DEFAULT_MAX_BATCH_BYTES, PutManyHeader, PutManyReader
from tubeq.protocol.commands import (
    Command,
    Put,
    PutExpectedCrlf,
    PutMany,
    PutTooBig,
    PutWith,
    Rejected,
)
from tubeq.protocol.grammar import (
    BODY_HEADERS,
    LONG_LINE_WORDS,
    REJECT_BAD_FORMAT,
    REJECT_EXPECTED_CRLF,
    REJECT_JOB_TOO_BIG,
    WHOLE_PUT_LINE,
    BodyHeader,
    PutHeader,
    parse_line,
)
from tubeq.protocol.limits import (
    CRLF,
    DEFAULT_MAX_JOB_SIZE,
    EXT_LINE_MAX,
    LINE_MAX,
    U32_MAX,
)

__all__ = ["Parser"]

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
        self._put: PutHeader | BodyHeader | None = None  # whose body is awaited (BODY)
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
                if buffer.startswith(LONG_LINE_WORDS):  # ... an extension line
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
        match = WHOLE_PUT_LINE.match(buffer)
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
        parsed = parse_line(line)
        if isinstance(parsed, BODY_HEADERS):
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

    def _begin_body(self, header: PutHeader | BodyHeader) -> Command | None:
        # 1.12's order: the size limit first (its body is swallowed even if the line also has
        # trailing garbage), then trailing garbage (BAD_FORMAT, the body is then read as commands;
        # cmd-put was already counted), then the body itself.
        if header.size > self._max_job_size:
            self._skip_left = header.size + len(CRLF)
            self._phase = _Phase.SKIP_BODY
            self._too_big = REJECT_JOB_TOO_BIG if isinstance(header, BodyHeader) else PutTooBig()
            return None
        if isinstance(header, PutHeader) and header.trailing_garbage:
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
        if isinstance(header, BodyHeader):  # an extension's body (schedule-add): no id burnt
            return header.build(body) if terminated else REJECT_EXPECTED_CRLF
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
        return REJECT_BAD_FORMAT
