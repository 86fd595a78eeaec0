"""Arguments: what a command checks before it is sent, and the one check of its answer.

``_tube``, ``_uint`` and ``_job_id`` refuse (ValueError) a tube name that would split the command
line and a number out of range, before anything is written. ``_expect`` returns when a reply is
one of the words that answer the command, and otherwise raises its exception (:data:`ERRORS`) or
:class:`ProtocolError`.
"""

from __future__ import annotations

import re

from tubeq.client.errors import (
    ERRORS,
    BadOption,
    Buried,
    InternalError,
    ProtocolError,
    UnknownParent,
)
from tubeq.client.parser import Reply
from tubeq.client.wire import U32_MAX, U64_MAX

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
    if error is UnknownParent:
        raise UnknownParent(command, reply.int_arg(0))
    if error is BadOption or error is InternalError:  # with the word that names what failed
        raise error(command, reply.args[0].decode("ascii", "replace") if reply.args else "")
    if error is not None:
        raise error(command)
    raise ProtocolError(f"{command}: {reply.word.decode()} does not answer it")
