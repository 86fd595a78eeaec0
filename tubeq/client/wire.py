"""The client's vocabulary: defaults, limits, and the beanstalkd reply grammar.

Owns the reply words and :data:`REPLY_ARITY` (the arguments each word may carry, which words are
followed by a body), the line and body limits the parser enforces, and the defaults of
:class:`~tubeq.client.Client`. Constants only, no I/O: every other module of the package builds
on these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from tubeq.protocol import replies

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 11300
DEFAULT_TUBE: Final = "default"
# The middle of the 32-bit range: as far from "urgent" (< 1024) as from the least urgent job, so
# callers can go either way without thinking about it.
DEFAULT_PRIORITY: Final = 2**31
# A minute: long enough for most jobs; workers that need more ask for it or touch the job.
DEFAULT_TTR: Final = 60

U32_MAX: Final = 2**32 - 1
# The longest duration in ms the server takes in an option (beanstalkd's u32 seconds, in ms).
MAX_MS: Final = U32_MAX * 1000
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


# Success replies. The ones without arguments are the server's own constants
# (tubeq.protocol.replies).
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
# put-with's answer when a living job has the dedupe key (tubeq only; see Client.put_with).
DUPLICATE: Final = b"DUPLICATE"
# An extension's refused option: BAD_OPTION <name> (tubeq only).
BAD_OPTION: Final = b"BAD_OPTION"
# The admin verbs' replies (tubeq only; see tubeq.client.admin).
CLEARED: Final = b"CLEARED"
CHANGED: Final = _word(replies.CHANGED)
RESUMED: Final = _word(replies.RESUMED)
# Recurring jobs' ``SCHEDULED <next-due-ms>`` and ``REMOVED`` (tubeq only; see
# Client.schedule_add).
SCHEDULED: Final = b"SCHEDULED"
REMOVED: Final = _word(replies.REMOVED)
# Ends (tubeq only; see Client.wait, Client.call, Job.finish, Job.fail): ``ENDED <id> <how>
# <bytes>`` and its body, and finish's and fail's answers.
ENDED: Final = b"ENDED"
FINISHED: Final = _word(replies.FINISHED)
FAILED: Final = _word(replies.FAILED)
CANCELLED: Final = _word(replies.CANCELLED)
PROGRESS: Final = b"PROGRESS"  # wait ... progress=N: PROGRESS <id> <n> <bytes>, and its body
# put-with notify-ms's frame (see Client.call): END <id> <how> <bytes> and its body, sent
# between whole replies, never a reply itself.
END: Final = b"END"
END_TIMED_OUT: Final = replies.END_TIMED_OUT.encode()  # its <how> when the call's time ran out
# Quiet shutdowns (tubeq only; see Client.push's on_quiet): the push frame QUIET.
QUIET: Final = _word(replies.QUIET)
QUIETING: Final = _word(replies.QUIETING)

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
    b"BATCH": frozenset({1}),  # batches: BATCH <n>, then n replies
    _word(replies.BAD_FORMAT): frozenset({0}),
    _word(replies.UNKNOWN_COMMAND): frozenset({0}),
    _word(replies.EXPECTED_CRLF): frozenset({0}),
    _word(replies.JOB_TOO_BIG): frozenset({0}),
    _word(replies.DRAINING): frozenset({0}),
    _word(replies.OUT_OF_MEMORY): frozenset({0}),
    _word(replies.INTERNAL_ERROR): frozenset({0, 1}),  # tubeq adds whether it ran
    _word(replies.NOT_FOUND): frozenset({0}),
    _word(replies.NOT_IGNORED): frozenset({0}),
    _word(replies.DEADLINE_SOON): frozenset({0}),
    _word(replies.TIMED_OUT): frozenset({0}),
    # job policies and deduplicated put
    DUPLICATE: frozenset({1}),
    b"UNKNOWN_PARENT": frozenset({1}),  # dependencies: put-with after= names no known job
    BAD_OPTION: frozenset({0, 1}),  # the option's name; a bare word is still the error
    # admin verbs (tubeq)
    CLEARED: frozenset({1}),
    CHANGED: frozenset({0}),
    RESUMED: frozenset({0}),
    # recurring jobs
    SCHEDULED: frozenset({1}),
    REMOVED: frozenset({0}),
    # ends
    ENDED: frozenset({3}),
    FINISHED: frozenset({0}),
    FAILED: frozenset({0}),
    CANCELLED: frozenset({0, 1}),  # with the id: a push frame (push ... cancels=1)
    PROGRESS: frozenset({3}),
    END: frozenset({3}),  # a frame (put-with notify-ms)
    QUIET: frozenset({0}),  # a push frame (push ... quiet=1)
    QUIETING: frozenset({0}),
}
BODY_WORDS: Final = frozenset({RESERVED, FOUND, OK, ENDED, PROGRESS, END})
TEXT_ARG_WORDS: Final = frozenset({USING, BAD_OPTION, _word(replies.INTERNAL_ERROR), ENDED, END})

# -- batches (tubeq's put-many, reserve-many, delete-many) ---------------------------------------
# ``BATCH <n>`` is followed by n whole replies, one per job (see ReplyParser). A put-many or a
# reserve-many carries at most 1000 (the server's limit, PUT_MANY_MAX), a delete-many as many
# ids as fit its 16 KiB line (8,192 one-digit ids): a larger count is not a tubeq server.
BATCH: Final = b"BATCH"
MAX_BATCH_ITEMS: Final = 8192
# The most jobs one put-many / reserve-many may carry (tubeq.protocol.batch_framing.PUT_MANY_MAX).
PUT_MANY_MAX: Final = 1000
# The longest delete-many line a server takes, CRLF included (tubeq.protocol.limits.EXT_LINE_MAX).
EXT_LINE_MAX: Final = 16384
