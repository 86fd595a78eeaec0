"""The framing of ``put-many``, sans-IO: the entries that follow its line, read from the parser's
buffer as they arrive (protocol.md "put-many").

``put-many <count>\\r\\n`` is followed by ``<count>`` entries, each ``<pri> <delay> <ttr>
<bytes>\\r\\n<data>\\r\\n`` (the put line without its word). :class:`PutManyReader` turns them
into :class:`~tubeq.protocol.commands.PutMany` commands whose entries are either a job to insert
or the reply bytes of a refused entry, so every entry gets exactly one reply: one command for a
batch of at most :data:`PUT_MANY_PART` entries, else one part of that many entries each time
they have arrived (``more`` set) and the rest in the last part. The server stores a part while
the next one is still being read and parsed, so Redis and the parser work at once.

Rules:

* Exactly ``<count>`` entries are read, whatever they hold: a refused entry never ends the batch
  early, so the bytes after the batch are commands again.
* Resynchronisation: an entry whose four numbers can be read has a known size, so its
  ``bytes+2`` are always consumed (kept, or swallowed as they arrive when the entry is refused:
  too big, trailing text, out of range). An entry line from which no size can be read has no
  body: the next line is the next entry (beanstalkd reads the line after a bad put line as a
  command; the batch's count keeps the damage inside the batch).
* Memory is bounded: at most one entry line (``EXT_LINE_MAX``) or one body (``max_job_size +
  2``) is buffered, and the bodies kept for one batch total at most ``max_bytes``; an entry
  that would pass that total is refused ``JOB_TOO_BIG`` and swallowed.
* A count over :data:`PUT_MANY_MAX` refuses the whole command (``BAD_FORMAT``), after its
  entries were read and dropped the same way, so no body is ever taken for a command.

Imports neither asyncio nor redis.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final

from tubeq.model import options
from tubeq.protocol import replies
from tubeq.protocol.commands import Command, PutEntry, PutMany, Rejected

CRLF: Final = b"\r\n"

# The most entries one put-many may carry (and jobs one reserve-many may take): enough to
# amortise a round trip and a script call many times over (a put costs Redis ~11 us, the round
# trip ~100 us), small enough that one script call holds Redis's single thread for
# milliseconds, not seconds, and that one reply stays small.
PUT_MANY_MAX: Final = 1000

# The entries of one part of a longer put-many (see the module's header). A part is one
# put_many.lua call: enough entries that the call's fixed cost (the tube's settings, the
# waiters' count) stays small beside theirs, few enough that Redis starts early: with ~3 us of
# parsing and ~8 us of Redis per job, Redis runs a part while the next ones are parsed.
PUT_MANY_PART: Final = 128

# The bodies one put-many may keep in the server at once, when the connection does not say:
# half of the connection's default buffer cap (tubeq.server.context.DEFAULT_MAX_CLIENT_BUFFER),
# so a batch being read plus the replies waiting to leave stay under the cap.
DEFAULT_MAX_BATCH_BYTES: Final = 16 * 1024 * 1024

_U32_MAX: Final = 2**32 - 1

# An entry line: put's four numbers (read as put reads them: spaces before each), then the
# rest: its options (tubeq.model.options.PUT_MANY_OPTIONS, put-with's grammar), if any.
_ENTRY: Final = re.compile(rb" *+([0-9]++) *+([0-9]++) *+([0-9]++) *+([0-9]++)(.*+)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class PutManyHeader(Command):
    """A parsed ``put-many`` line. A Command only so the parser's word table can return it;
    it never leaves the parser (the entries follow)."""

    count: int


class _Phase(enum.Enum):
    LINE = "line"  # expecting an entry line
    BODY = "body"  # expecting an entry's body plus its CRLF
    SKIP = "skip"  # swallowing the bytes+2 of a refused entry
    OVERLONG = "overlong"  # discarding an entry line longer than EXT_LINE_MAX up to its CRLF


class PutManyReader:
    """Reads the entries of one ``put-many`` out of a buffer shared with the parser."""

    __slots__ = ("_entries", "_group", "_header", "_left", "_line_max", "_max_bytes",
                 "_max_job_size", "_part", "_phase", "_refuse", "_scanned", "_skip_left",
                 "_skip_reply", "_traceparent", "held")

    def __init__(self, count: int, *, max_job_size: int, max_bytes: int, line_max: int,
                 part: int = PUT_MANY_PART) -> None:
        """Expect ``count`` entries; over PUT_MANY_MAX they are read, dropped and refused.
        ``part``: hand them over in parts of that many entries."""
        self._left = count
        self._part = part
        self._refuse = count > PUT_MANY_MAX
        self._max_job_size = max_job_size
        self._max_bytes = max_bytes
        self._line_max = line_max
        self._entries: list[PutEntry | bytes] = []
        self.held = 0  # body bytes kept so far
        self._phase = _Phase.LINE
        self._scanned = 0  # bytes of the entry line known to hold no CRLF
        self._header: tuple[int, int, int, int] | None = None  # pri, delay, ttr, size (BODY)
        self._group = ""  # the entry's group= (BODY)
        self._traceparent = ""  # the entry's traceparent= (BODY)
        self._skip_left = 0
        self._skip_reply = b""

    def read(self, buffer: bytearray) -> Command | None:
        """Consume entries from the front of ``buffer``: a part of ``part`` entries once they
        are complete and more are expected, the command (its last part) once the last one is,
        else None (more bytes needed)."""
        while self._left:
            if len(self._entries) >= self._part:
                entries, self._entries = tuple(self._entries), []
                return PutMany(entries, more=True)
            phase = self._phase
            if phase is _Phase.LINE:
                progressed = self._read_line(buffer)
            elif phase is _Phase.BODY:
                progressed = self._read_body(buffer)
            elif phase is _Phase.SKIP:
                progressed = self._skip(buffer)
            else:
                progressed = self._discard_overlong(buffer)
            if not progressed:
                return None
        if self._refuse:
            return Rejected(reply=replies.BAD_FORMAT)
        return PutMany(tuple(self._entries))

    def _done(self, entry: PutEntry | bytes) -> None:
        self._left -= 1
        self._phase = _Phase.LINE
        if not self._refuse:
            self._entries.append(entry)

    def _read_line(self, buffer: bytearray) -> bool:
        end = buffer.find(CRLF, self._scanned, self._line_max)
        if end < 0:
            if len(buffer) >= self._line_max:
                self._phase = _Phase.OVERLONG
                self._scanned = 0
                return True
            # Scanned once: a client trickling a line costs linear time, not quadratic.
            self._scanned = max(len(buffer) - 1, 0)
            return False
        line = bytes(buffer[:end])
        del buffer[: end + len(CRLF)]
        self._scanned = 0
        self._begin_entry(line)
        return True

    def _begin_entry(self, line: bytes) -> None:
        match = _ENTRY.fullmatch(line)
        size = int(match[4]) if match is not None else _U32_MAX + 1
        if match is None or size > _U32_MAX:
            self._done(replies.BAD_FORMAT)  # no size: no body; the next line is the next entry
            return
        pri, delay, ttr = int(match[1]), int(match[2]), int(match[3])
        # put's order: the size limit first, then the rest of the line.
        if size > self._max_job_size:
            self._swallow(size, replies.JOB_TOO_BIG)
        elif b"\0" in line or max(pri, delay, ttr) > _U32_MAX:
            self._swallow(size, replies.BAD_FORMAT)
        elif self._refuse or self.held + size > self._max_bytes:
            self._swallow(size, replies.JOB_TOO_BIG)
        else:
            try:
                given = dict(options.parse(match[5], options.PUT_MANY_OPTIONS))
            except options.BadFormat:
                self._swallow(size, replies.BAD_FORMAT)
                return
            except options.BadOption as refused:
                self._swallow(size, replies.bad_option(refused.name))
                return
            self._header = (pri, delay, ttr, size)
            self._group = str(given.get("group", ""))
            self._traceparent = str(given.get("traceparent", ""))
            self._phase = _Phase.BODY

    def _swallow(self, size: int, reply: bytes) -> None:
        self._skip_left = size + len(CRLF)
        self._skip_reply = reply
        self._phase = _Phase.SKIP

    def _read_body(self, buffer: bytearray) -> bool:
        assert self._header is not None
        pri, delay, ttr, size = self._header
        if len(buffer) < size + len(CRLF):
            return False
        body = bytes(buffer[:size])
        terminated = buffer[size : size + len(CRLF)] == CRLF
        del buffer[: size + len(CRLF)]  # exactly size+2 bytes, whatever they are
        self._header = None
        if not terminated:
            self._done(replies.EXPECTED_CRLF)
            return True
        self.held += size
        self._done(PutEntry(pri, delay, ttr, body, self._group, self._traceparent))
        return True

    def _skip(self, buffer: bytearray) -> bool:
        taken = min(self._skip_left, len(buffer))
        del buffer[:taken]
        self._skip_left -= taken
        if self._skip_left:
            return False
        self._done(self._skip_reply)
        return True

    def _discard_overlong(self, buffer: bytearray) -> bool:
        end = buffer.find(CRLF)
        if end < 0:
            # Keep a final CR: its LF may be the first byte of the next feed.
            del buffer[: len(buffer) - 1 if buffer.endswith(b"\r") else len(buffer)]
            return False
        del buffer[: end + len(CRLF)]
        self._done(replies.BAD_FORMAT)
        return True
