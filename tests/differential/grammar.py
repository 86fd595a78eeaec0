"""The beanstalkd reply grammar, as the wire tests read it: bytes in, whole replies out (no I/O).

A reply is one CRLF-terminated line; ``RESERVED <id> <bytes>``, ``FOUND <id> <bytes>`` and
``OK <bytes>`` are followed by exactly ``<bytes>`` bytes of data and a CRLF. Anything else that
arrives is *malformed*: the harness records that as an outcome instead of guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CRLF = b"\r\n"

# Every first word a beanstalkd 1.12 server can send (doc/protocol.txt and prot.c).
REPLY_WORDS = frozenset({
    b"INSERTED", b"BURIED", b"EXPECTED_CRLF", b"JOB_TOO_BIG", b"DRAINING", b"USING",
    b"RESERVED", b"DEADLINE_SOON", b"TIMED_OUT", b"DELETED", b"NOT_FOUND", b"RELEASED",
    b"TOUCHED", b"WATCHING", b"NOT_IGNORED", b"FOUND", b"KICKED", b"OK", b"PAUSED",
    b"OUT_OF_MEMORY", b"INTERNAL_ERROR", b"BAD_FORMAT", b"UNKNOWN_COMMAND",
})
# Replies whose line carries a number after the word, and how many numbers.
_NUMBER_COUNT = {b"INSERTED": 1, b"BURIED": (0, 1), b"WATCHING": 1, b"KICKED": (0, 1),
                 b"RESERVED": 2, b"FOUND": 2, b"OK": 1}
_WITH_DATA = frozenset({b"RESERVED", b"FOUND", b"OK"})
_DIGITS = re.compile(rb"[0-9]+")

# The longest reply line a server can legitimately send: `USING <200-byte name>` plus slack.
MAX_REPLY_LINE = 512


@dataclass(frozen=True, slots=True)
class Reply:
    """One complete reply: its first line (no CRLF), its data block if any, and the raw bytes."""

    head: bytes
    data: bytes | None
    raw: bytes

    @property
    def words(self) -> list[bytes]:
        return self.head.split(b" ")


@dataclass(frozen=True, slots=True)
class Malformed:
    """Bytes that do not parse as a reply; ``why`` says which rule they broke."""

    raw: bytes
    why: str


def split_reply(buffer: bytes | bytearray) -> tuple[Reply | Malformed, int] | None:
    """Take the first reply off ``buffer``: ``(reply, bytes consumed)``, or None if incomplete."""
    end = buffer.find(CRLF)
    if end < 0:
        if len(buffer) > MAX_REPLY_LINE:
            return Malformed(bytes(buffer), "no CRLF within the longest possible reply line"), \
                len(buffer)
        return None
    head = bytes(buffer[:end])
    words = head.split(b" ")
    if words[0] not in _WITH_DATA:
        return Reply(head, None, head + CRLF), end + 2
    if len(words) != (3 if words[0] != b"OK" else 2) or not _DIGITS.fullmatch(words[-1]):
        return Malformed(head + CRLF, "a data reply without a valid byte count"), end + 2
    size = int(words[-1])
    total = end + 2 + size + 2
    if len(buffer) < total:
        return None
    data = bytes(buffer[end + 2:end + 2 + size])
    raw = bytes(buffer[:total])
    if buffer[total - 2:total] != CRLF:
        return Malformed(raw, f"{size} data bytes not followed by CRLF"), total
    return Reply(head, data, raw), total


def well_formed(reply: Reply) -> str | None:
    """Why ``reply`` is not a reply beanstalkd could send (word and number shape), else None."""
    words = reply.words
    if words[0] not in REPLY_WORDS:
        return f"unknown reply word {words[0]!r}"
    expected = _NUMBER_COUNT.get(words[0], 0)
    allowed = expected if isinstance(expected, tuple) else (expected,)
    numbers = words[1:]
    if words[0] == b"USING":
        return None if len(numbers) == 1 and numbers[0] else "USING without a tube name"
    if len(numbers) not in allowed:
        return f"{words[0]!r} with {len(numbers)} arguments"
    if not all(_DIGITS.fullmatch(number) for number in numbers):
        return f"{words[0]!r} with a non-numeric argument"
    if reply.data is not None and words[0] == b"OK" and not (
        reply.data.startswith(b"---\n") and reply.data.endswith(b"\n")
    ):
        return "OK data is not a YAML document ending in a newline"
    return None
