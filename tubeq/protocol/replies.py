"""The server's reply vocabulary: every reply word once, and pure functions building reply bytes."""

from __future__ import annotations

BAD_FORMAT = b"BAD_FORMAT\r\n"
UNKNOWN_COMMAND = b"UNKNOWN_COMMAND\r\n"
EXPECTED_CRLF = b"EXPECTED_CRLF\r\n"
JOB_TOO_BIG = b"JOB_TOO_BIG\r\n"
DRAINING = b"DRAINING\r\n"
OUT_OF_MEMORY = b"OUT_OF_MEMORY\r\n"
INTERNAL_ERROR = b"INTERNAL_ERROR\r\n"
NOT_FOUND = b"NOT_FOUND\r\n"
NOT_IGNORED = b"NOT_IGNORED\r\n"
DEADLINE_SOON = b"DEADLINE_SOON\r\n"
TIMED_OUT = b"TIMED_OUT\r\n"
DELETED = b"DELETED\r\n"
RELEASED = b"RELEASED\r\n"
BURIED = b"BURIED\r\n"
TOUCHED = b"TOUCHED\r\n"
KICKED = b"KICKED\r\n"
PAUSED = b"PAUSED\r\n"
SET = b"SET\r\n"
AUTHENTICATED = b"AUTHENTICATED\r\n"
UNAUTHORIZED = b"UNAUTHORIZED\r\n"
AUTH_REQUIRED = b"AUTH_REQUIRED\r\n"
TOO_MANY_CONNECTIONS = b"TOO_MANY_CONNECTIONS\r\n"
# admin verbs
CHANGED = b"CHANGED\r\n"
RESUMED = b"RESUMED\r\n"
FINISHED = b"FINISHED\r\n"
FAILED = b"FAILED\r\n"
CANCELLED = b"CANCELLED\r\n"
# A push frame (push ... quiet=1): the server asks the consumer to stop taking jobs.
QUIET = b"QUIET\r\n"
QUIETING = b"QUIETING\r\n"


# INTERNAL_ERROR with the word tubeq adds for a connection that has used an extension command
# (Connection.extended; a beanstalkd client sees the bare reply): whether the failed command
# ran, so a client knows what it may send again (protocol.md, "Redis stalls").
INTERNAL_ERROR_NOT_RUN = b"INTERNAL_ERROR not-run\r\n"  # Redis refused it or was not reached
INTERNAL_ERROR_RAN = b"INTERNAL_ERROR ran\r\n"  # done; only --min-replicas is not confirmed
INTERNAL_ERROR_UNKNOWN = b"INTERNAL_ERROR unknown\r\n"  # the link went while it was out


def internal_error(ran: bool | None, extended: bool) -> bytes:
    """The reply of a command that failed on the server's side: bare for a beanstalkd client,
    saying whether it ran (True, False, or None: unknown) for an extended one."""
    if not extended:
        return INTERNAL_ERROR
    if ran is None:
        return INTERNAL_ERROR_UNKNOWN
    return INTERNAL_ERROR_RAN if ran else INTERNAL_ERROR_NOT_RUN


def bad_option(name: str) -> bytes:
    """An option the command refuses (unknown, repeated, or its value out of range)."""
    return b"BAD_OPTION %s\r\n" % name.encode("ascii")


def inserted(job_id: int) -> bytes:
    return b"INSERTED %d\r\n" % job_id


def duplicate(job_id: int) -> bytes:
    """put-with key=...: a job with that key lives (``job_id``); nothing was enqueued."""
    return b"DUPLICATE %d\r\n" % job_id


def unknown_parent(job_id: int) -> bytes:
    """put-with after=...: tubeq knows no job ``job_id`` (never put, or ended without an end
    kept); nothing was enqueued."""
    return b"UNKNOWN_PARENT %d\r\n" % job_id


def reserved(job_id: int, body: bytes) -> bytes:
    return b"RESERVED %d %d\r\n%s\r\n" % (job_id, len(body), body)


def found(job_id: int, body: bytes) -> bytes:
    return b"FOUND %d %d\r\n%s\r\n" % (job_id, len(body), body)


def using(tube: str) -> bytes:
    return b"USING %s\r\n" % tube.encode("ascii")


def watching(count: int) -> bytes:
    return b"WATCHING %d\r\n" % count


def pushing(credits: int) -> bytes:
    return b"PUSHING %d\r\n" % credits


def cancelled_notice(job_id: int) -> bytes:
    """A push frame (``push ... cancels=1``): job ``job_id``, which the connection holds, was
    cancelled; unlike the reply CANCELLED it names the job."""
    return b"CANCELLED %d\r\n" % job_id


def kicked(count: int) -> bytes:
    return b"KICKED %d\r\n" % count


def ok(data: bytes) -> bytes:
    """An ``OK <bytes>`` reply; ``data`` is the YAML document, without the trailing CRLF."""
    return b"OK %d\r\n%s\r\n" % (len(data), data)


# -- batches ------------------------------------------------------------------------------------


def batch(items: list[bytes]) -> bytes:
    """``BATCH <n>`` followed by the n whole replies of a batch command, in order."""
    return b"BATCH %d\r\n%s" % (len(items), b"".join(items))
# admin verbs
def cleared(count: int) -> bytes:
    return b"CLEARED %d\r\n" % count
# -- recurring jobs --------------------------------------------------------------------------------
REMOVED = b"REMOVED\r\n"


def scheduled(next_due_ms: int) -> bytes:
    """schedule-add's answer: when the schedule first ticks (ms since the epoch)."""
    return b"SCHEDULED %d\r\n" % next_due_ms


def progress(job_id: int, seq: int, data: bytes) -> bytes:
    """``wait ... progress=N``'s answer for a living job: its ``seq``-th progress report."""
    return b"PROGRESS %d %d %d\r\n%s\r\n" % (job_id, seq, len(data), data)


# put-with notify-ms's frame says one of these instead of how the job ended: its time ran out
# first (the job lives on), or the job is gone with no end kept (a duplicate's).
END_TIMED_OUT = "timed-out"
END_NOT_FOUND = "not-found"


def end_frame(job_id: int, how: str, data: bytes) -> bytes:
    """put-with notify-ms's frame, sent unasked between whole replies: how job ``job_id``
    ended (as :func:`ended`), or END_TIMED_OUT / END_NOT_FOUND."""
    return b"END %d %s %d\r\n%s\r\n" % (job_id, how.encode(), len(data), data)


def ended(job_id: int, how: str, data: bytes) -> bytes:
    """``wait``'s answer: how job ``job_id`` ended, with its result or reason as the body."""
    return b"ENDED %d %s %d\r\n%s\r\n" % (job_id, how.encode(), len(data), data)
