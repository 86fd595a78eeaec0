"""Sans-IO: reply frames out of bytes, and the YAML documents of the stats and list commands.

Owns :class:`Reply`, :class:`ReplyParser` (bytes in, complete frames out; it never returns part
of a frame, so no half-read job can escape it) and the flat-YAML readers
:func:`parse_yaml_mapping` and :func:`parse_yaml_list`, with the keys of each stats document that
stay text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, NamedTuple

from tubeq.client.errors import ProtocolError
from tubeq.client.wire import (
    BATCH,
    BODY_WORDS,
    CRLF,
    END,
    INSERTED,
    MAX_BATCH_ITEMS,
    MAX_BODY,
    MAX_REPLY_LINE,
    REPLY_ARITY,
    RESERVED,
    TEXT_ARG_WORDS,
)


class Reply(NamedTuple):
    """One complete reply frame: its word, its arguments, and its body for RESERVED/FOUND/OK;
    for ``BATCH <n>`` (tubeq's batch commands) its n replies in ``items``. A named tuple: a
    consumer builds one or two a job, and a frozen dataclass cost ~0.75 us to build where this
    costs ~0.3."""

    word: bytes
    args: tuple[bytes, ...] = ()
    body: bytes | None = None
    items: tuple[Reply, ...] = ()

    def int_arg(self, index: int) -> int:
        """Argument ``index`` as an int (the parser checked it is decimal)."""
        if index >= len(self.args):
            raise ProtocolError(f"{self.word.decode()} without its argument")
        return int(self.args[index])


# A reply line that is one word without arguments (DELETED, TOUCHED, FINISHED, ...), the same
# frame every time: made once (a frozen Reply costs ~0.75 us to build; a consumer reads one
# such per job, a delete-many's).
_BARE: Final[dict[bytes, Reply]] = {word: Reply(word) for word, arity in REPLY_ARITY.items()
                                    if 0 in arity and word != BATCH}
_RESERVED_ = RESERVED + b" "
_END_ = END + b" "


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
        # a RESERVED/FOUND/OK... line waiting for its body: its word and arguments
        self._head: tuple[bytes, tuple[bytes, ...]] | None = None
        self._size = 0
        self._batch: Reply | None = None  # a BATCH line waiting for its items
        self._batch_size = 0  # its n
        self._items: list[Reply] = []

    @property
    def mid_reply(self) -> bool:
        return self._head is not None or self._batch is not None or bool(self._buf)

    def _complete(self, out: list[Reply], reply: Reply) -> None:
        """A whole frame: the caller's, or the next item of the BATCH being read."""
        if self._batch is None:
            out.append(reply)
            return
        items = self._items
        items.append(reply)
        if len(items) == self._batch_size:
            out.append(Reply(self._batch.word, self._batch.args, items=tuple(self._items)))
            self._batch = None
            self._items = []

    def _begin_batch(self, out: list[Reply], reply: Reply) -> None:
        if self._batch is not None:
            raise ProtocolError("BATCH inside a BATCH")
        if reply.int_arg(0) > MAX_BATCH_ITEMS:
            raise ProtocolError(f"BATCH of {reply.int_arg(0)} replies, more than "
                                f"{MAX_BATCH_ITEMS}")
        if reply.int_arg(0) == 0:
            out.append(reply)
        else:
            self._batch = reply
            self._batch_size = reply.int_arg(0)

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
                            f"{self._head[0].decode()} body of {self._size} bytes is not "
                            f"followed by CRLF")
                    self._complete(out, Reply(*self._head, bytes(buf[pos:end])))
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
                line = bytes(buf[pos:eol])
                pos = eol + 2
                head = None  # a job or a call's end, the usual body lines: one step
                if line.startswith(_RESERVED_):
                    head = self._body_head(RESERVED, line[len(_RESERVED_):].split(b" "), 2)
                elif line.startswith(_END_):
                    head = self._body_head(END, line[len(_END_):].split(b" "), 3)
                if head is not None:
                    self._head, self._size = head
                    continue
                bare = _BARE.get(line)
                if bare is not None:
                    self._complete(out, bare)
                    continue
                reply = self._parse_line(line)
                if reply.word in BODY_WORDS:
                    self._head = (reply.word, reply.args)
                    self._size = reply.int_arg(len(reply.args) - 1)
                elif reply.word == BATCH:
                    self._begin_batch(out, reply)
                else:
                    self._complete(out, reply)
        except ProtocolError as error:
            self.error = error
            buf.clear()
            return out
        del buf[:pos]
        return out

    def _body_head(self, word: bytes, args: list[bytes], arity: int
                   ) -> tuple[tuple[bytes, tuple[bytes, ...]], int] | None:
        """``RESERVED <id> <bytes>`` (a consumer's job) or ``END <id> <how> <bytes>`` (a
        call's end), cut into ``args``, as _parse_line would read it, and its body's size;
        None for any other shape (_parse_line then says what is wrong with it)."""
        if len(args) != arity:
            return None
        job_id, size = args[0], args[-1]
        if not (job_id.isdigit() and size.isdigit() and len(job_id) <= 20 and len(size) <= 20):
            return None
        n = int(size)
        if n > self.max_body:
            return None
        return (word, tuple(args)), n

    def _parse_line(self, line: bytes) -> Reply:
        if line.startswith(b"INSERTED "):  # the common case, a thousand in one put-many's reply
            arg = line[9:]
            if arg.isdigit() and len(arg) <= 20:
                return Reply(INSERTED, (arg,))
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
        elif args and not args[0]:
            raise ProtocolError(f"{word.decode()} without a name")
        elif word in BODY_WORDS:  # END / ENDED <id> <how> <bytes>: the id and size are numbers
            for arg in (args[0], args[-1]):
                if not (arg.isdigit() and len(arg) <= 20):
                    raise ProtocolError(f"{word.decode()} with a non-numeric argument: "
                                        f"{line[:60]!r}")
        if word in BODY_WORDS and int(args[-1]) > self.max_body:
            raise ProtocolError(f"{word.decode()} announces {int(args[-1])} bytes, more than "
                                f"{self.max_body}")
        return Reply(word, tuple(args))


StatValue = int | float | bool | str
Stats = dict[str, StatValue]

_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+\.[0-9]+")


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        # YAML's double-quoted escapes tubeq writes (a dedupe key): \\ and \"
        return re.sub(r'\\(.)', r'\1', text[1:-1])
    return text


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
JOB_TEXT_KEYS: Final = frozenset({"tube", "state", "reason", "key"})  # job policies: last two
TUBE_TEXT_KEYS: Final = frozenset({"name"})
SERVER_TEXT_KEYS: Final = frozenset({"version", "id", "hostname", "os", "platform"})
