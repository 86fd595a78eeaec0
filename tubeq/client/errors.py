"""The client's exceptions, and :data:`ERRORS`, the one table from error reply to exception.

Every exception derives from :class:`ClientError`: :class:`ClientConnectionError` for the
connection, :class:`ProtocolError` for bytes outside the grammar or a reply that does not answer
its command, and one :class:`CommandError` subclass per error reply word. Turning a reply into one
of them is ``_expect`` (:mod:`tubeq.client.args`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final

from tubeq.client.wire import REPLY_ARITY, _word
from tubeq.protocol import replies


class ClientError(Exception):
    """The base of every exception this package raises about the server or the connection."""


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
    """INTERNAL_ERROR: the server failed on its side (tubeq: Redis refused, unreachable or
    stalled). ``ran`` says whether the command took effect, as tubeq tells a connection that has
    used an extension command: False (it did not: safe to send again), True (it did; only
    --min-replicas could not confirm it), None (unknown: the server lost Redis while the
    command was out, or a beanstalkd server, which does not say). A put that fails with ran None
    may have stored its job: sending it again may store it twice (put-with key= deduplicates)."""

    reply = replies.INTERNAL_ERROR
    _RAN: ClassVar[dict[str, bool]] = {"not-run": False, "ran": True}

    def __init__(self, command: str, word: str = "") -> None:
        self.ran: bool | None = self._RAN.get(word)
        CommandError.__init__(self, command, f" {word}" if word else "")


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


class CallTimedOut(TimedOut):
    """A call's job had not ended within its timeout: it is stored and lives on (``job_id``;
    :meth:`tubeq.client.Client.wait` waits for it again), or ``job_id`` is None when the server
    did not answer at all in time (stopped, or cut off): the job may or may not be stored."""

    def __init__(self, command: str, job_id: int | None) -> None:
        self.job_id = job_id
        super().__init__(command, "" if job_id is None else f" (job {job_id})")


class JobCancelled(CommandError):
    """CANCELLED: the job was cancelled (tubeq's ``cancel``) while this connection held it; it
    is gone, and whatever the command asked (touch, finish, fail) was not done."""

    reply = b"CANCELLED\r\n"


class JobNotFinished(ClientError):
    """A job waited for (``wait``, ``call``) ended without a result: ``how`` is ``deleted``,
    ``buried`` (``data``: why tubeq buried it, then after a newline the last error a worker
    failed it with) or ``expired``."""

    def __init__(self, job_id: int, how: str, data: bytes) -> None:
        self.job_id, self.how, self.data = job_id, how, data
        detail = f": {data.decode('utf-8', 'replace')!r}" if data else ""
        super().__init__(f"job {job_id} ended {how}{detail}")


class Buried(CommandError):
    """BURIED as an error: beanstalkd ran out of memory growing a priority queue and buried the
    job instead (``put`` then carries the new job's id in ``job_id``; ``release`` carries none).
    A successful ``bury`` is not an error."""

    reply = replies.BURIED

    def __init__(self, command: str, job_id: int | None = None) -> None:
        self.job_id = job_id
        super().__init__(command, "" if job_id is None else f" (job {job_id})")


class BadOption(CommandError):
    """BAD_OPTION <name>: an extension command's option was refused (unknown to the command,
    given twice, or its value out of range); ``option`` names it. Nothing was stored."""

    reply = b"BAD_OPTION\r\n"

    def __init__(self, command: str, option: str = "") -> None:
        self.option = option
        CommandError.__init__(self, command, f" {option}" if option else "")


class UnknownParent(CommandError):
    """UNKNOWN_PARENT <id>: a put-with ``after=`` names job ``parent``, which tubeq does not
    know (never put, or ended without a kept end: a finished job's end is kept for the
    server's --result-ttl). Nothing was stored."""

    reply = b"UNKNOWN_PARENT\r\n"

    def __init__(self, command: str, parent: int = 0) -> None:
        self.parent = parent
        CommandError.__init__(self, command, f" {parent}" if parent else "")


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
    b"BAD_OPTION": BadOption,  # job policies (tubeq extensions)
    b"CANCELLED": JobCancelled,  # ends (tubeq): touch, finish or fail of a cancelled job
    b"UNKNOWN_PARENT": UnknownParent,  # dependencies (tubeq): put-with after=
}
assert set(ERRORS) <= set(REPLY_ARITY), "every error word must be in the reply grammar"
