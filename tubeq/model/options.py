"""The ``name=value`` options of tubeq's extension commands, sans-IO: grammar and vocabulary.

Owns which option names each extension accepts, the type and range of each value, and the one
grammar they share (protocol.md, "Extensions"): after a command's positional arguments come
zero or more ``name=value`` tokens, separated by spaces, the last one ending the line. Rules:

* Nothing is ignored. A token without ``=`` (or a trailing space) is ``BAD_FORMAT``; a name the
  command does not know, a name given twice, or a value out of its range is ``BAD_OPTION
  <name>``, so the client learns which option was refused. Nothing is stored in either case.
* Durations are whole milliseconds and say so in their name (``-ms``); counts are plain
  integers; ``0`` always means "none" (no limit, no delay, no expiry), so every numeric option
  can be reset.
* The parsed options are a tuple of ``(name, value)`` pairs in the order the spec lists them
  (not the order sent), so equal option sets compare equal and scripts get a fixed layout.

Imports neither asyncio nor redis: the grammar (:mod:`tubeq.protocol.grammar`) calls :func:`parse`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

from tubeq.model.names import MAX_TUBE_NAME, TUBE_NAME_CHARS

OptionValue: TypeAlias = int | str
Options: TypeAlias = tuple[tuple[str, OptionValue], ...]

# An option name as it may be echoed in BAD_OPTION: short, lowercase words and hyphens. A
# "name" that is not even shaped like one is BAD_FORMAT (nothing of it is echoed back).
_NAME: Final = re.compile(rb"[a-z][a-z0-9-]{0,31}")
_DIGITS: Final = re.compile(rb"[0-9]{1,20}")
# A dedupe key: 1-200 printable ASCII bytes without space (the line's separator) and without
# '=' so a token splits unambiguously; 200 as for tube names.
_KEY: Final = re.compile(rb"[!-<>-~]{1,200}")
# A tube name (tubeq.model.names): its bytes, not starting with '-'.
_TUBE: Final = re.compile(b"(?!-)[" + re.escape(TUBE_NAME_CHARS) + b"]{1,%d}" % MAX_TUBE_NAME)

# The longest delay or duration: beanstalkd's delays are u32 seconds, so tubeq's in ms reach
# the same instant (about 136 years); a larger value is surely a mistake.
MAX_MS: Final = (2**32 - 1) * 1000
U32_MAX: Final = 2**32 - 1


# after=: at most this many parents, each a job id (1 to 2^64-1), joined by commas. A fan-in
# of a thousand fits the line (protocol.limits.EXT_LINE_MAX: 1,000 ids of 15 digits) and one
# script call checks them all (put.lua, includes/after.lua).
MAX_PARENTS: Final = 1000
_ID: Final = re.compile(rb"[1-9][0-9]{0,19}")
U64_MAX: Final = 2**64 - 1

# traceparent=: a W3C Trace Context traceparent (https://www.w3.org/TR/trace-context/),
# version 00 as that recommendation writes it: lowercase hex, a trace id and a parent span id
# that are not all zeros. Stored as given, so what a worker reads back is what the producer
# sent; a later version's longer form is refused rather than cut.
_TRACEPARENT: Final = re.compile(rb"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def _job_ids(raw: bytes) -> str | None:
    """``after=``'s value: the ids in the order given, once each, joined by commas."""
    parts = raw.split(b",")
    if len(parts) > MAX_PARENTS or any(_ID.fullmatch(p) is None or int(p) > U64_MAX
                                       for p in parts):
        return None
    return ",".join(dict.fromkeys(p.decode("ascii") for p in parts))


@dataclass(frozen=True, slots=True)
class Spec:
    """One option: an unsigned integer up to ``maximum``, one of ``choices``, a key, a tube
    name, a list of job ids, or a W3C traceparent."""

    maximum: int = 0
    choices: tuple[str, ...] = ()
    key: bool = False
    tube: bool = False
    ids: bool = False
    traceparent: bool = False

    def convert(self, raw: bytes) -> OptionValue | None:
        """The value of ``raw``, or None if it is not one this option takes."""
        if self.ids:
            return _job_ids(raw)
        if self.traceparent:
            return raw.decode("ascii") if _TRACEPARENT.fullmatch(raw) else None
        if self.key:
            return raw.decode("ascii") if _KEY.fullmatch(raw) else None
        if self.tube:
            return raw.decode("ascii") if _TUBE.fullmatch(raw) else None
        if self.choices:
            text = raw.decode("ascii", "replace")
            return text if text in self.choices else None
        if _DIGITS.fullmatch(raw) is None:
            return None
        value = int(raw)
        return value if value <= self.maximum else None


_MS: Final = Spec(maximum=MAX_MS)
_COUNT: Final = Spec(maximum=U32_MAX)

# What a job may carry (put-with) and a tube may set as the default for its jobs (tube-set).
# Job policies: max-tries (reserves that ended in a TTR timeout or a release before the job is
# buried with reason max-tries), backoff-ms / backoff-max-ms (exponential retry delay after a
# TTR timeout, with jitter, capped), ttl-ms (time to live from the put), on-expire (what an
# expired job becomes).
JOB_POLICIES: Final[Mapping[str, Spec]] = {
    "max-tries": _COUNT,
    "backoff-ms": _MS,
    "backoff-max-ms": _MS,
    "ttl-ms": _MS,
    "on-expire": Spec(choices=("bury", "delete")),
}

# A put's own options besides the job policies: its delay in ms, a dedupe key, wait-ms (put,
# then wait for the job's end that long, in one command: request/reply), after (held until
# those jobs finished: dependencies), result-ttl-ms (how long its result is kept, instead
# of the server's --result-ttl) and traceparent (the producer's OpenTelemetry context, which
# travels with the job to its worker: protocol.md, "Traces").
PUT_OPTIONS: Final[Mapping[str, Spec]] = {
    "delay-ms": _MS,
    **JOB_POLICIES,
    "key": Spec(key=True),
    "wait-ms": _MS,
    "after": Spec(ids=True),
    "result-ttl-ms": _MS,
    "group": Spec(tube=True),  # its group in the tube (round robin): spelled as a tube name
    "traceparent": Spec(traceparent=True),
}
# A put-many entry's options (name=value tokens after its four numbers): its group and its
# traceparent.
PUT_MANY_OPTIONS: Final[Mapping[str, Spec]] = {
    "group": PUT_OPTIONS["group"], "traceparent": PUT_OPTIONS["traceparent"]}
# put-with's options on the wire: a put's, tube=<name> (put into that tube instead of the
# used one, which stays: a request/reply is then one command) and notify-ms (wait-ms without
# holding the connection: the end comes later as a frame, so calls share a connection). The
# HTTP put's tube is its route's, so it takes PUT_OPTIONS.
PUT_WITH_OPTIONS: Final[Mapping[str, Spec]] = {**PUT_OPTIONS, "tube": Spec(tube=True),
                                                "notify-ms": _MS}
# fail's options: the worker's retry policy, used where neither the job (put-with) nor its
# tube (tube-set) has one (the bundled client's consumer sends its own this way).
FAIL_OPTIONS: Final[Mapping[str, Spec]] = {
    "max-tries": _COUNT,
    "backoff-ms": _MS,
    "backoff-max-ms": _MS,
}
# push's options: cancels=1, a frame CANCELLED <id> as soon as a job it holds is cancelled;
# quiet=1, a frame QUIET when the server asks its consumers to stop taking jobs.
PUSH_OPTIONS: Final[Mapping[str, Spec]] = {
    "cancels": Spec(maximum=1),
    "quiet": Spec(maximum=1),
}
# wait's options: progress=N, answer a progress report past the N-th as well as an end.
WAIT_OPTIONS: Final[Mapping[str, Spec]] = {
    "progress": _COUNT,
}
# put-with's options that wait for the job's end (not stored: the job is marked WAITED instead).
END_WAIT_OPTIONS: Final = frozenset({"wait-ms", "notify-ms"})
# The option a put-with's wait-ms becomes for the store: mark the job waited from its birth
# (ms to keep its end; lua/includes/policies.lua start_policies).
WAITED: Final = "waited"
# The option put-with's after= brings the store besides it: how long (ms) the parents' ends are
# kept (the result lifetime: a child reads its parents' results with wait).
AFTER_KEEP: Final = "after-keep"

# Per tube: the job policies' defaults, plus the tube's reserve rate limit (reserves per second
# across all processes), concurrency cap (jobs reserved at once) and the most jobs it may hold
# in every state together (a put past it answers OUT_OF_MEMORY).
TUBE_SETTINGS: Final[Mapping[str, Spec]] = {
    **JOB_POLICIES,
    "rate": _COUNT,
    "concurrency": _COUNT,
    "max-jobs": _COUNT,
    "group-concurrency": _COUNT,
    "group-rate": _COUNT,
}

# The defaults a setting has until a tube-set changes it (and after it is set back to them).
DEFAULTS: Final[Mapping[str, OptionValue]] = {
    name: "bury" if name == "on-expire" else 0 for name in TUBE_SETTINGS
}


class BadFormat(Exception):
    """The options are not ``name=value`` tokens: the reply is BAD_FORMAT."""


class BadOption(Exception):
    """A well-formed option the command refuses: the reply is ``BAD_OPTION <name>``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def parse(text: bytes, specs: Mapping[str, Spec]) -> Options:
    """The options in ``text`` (the rest of a line after the positional arguments).

    ``text`` is empty or starts with the space(s) that separate it from the last positional
    argument; tokens are separated by one or more spaces; nothing may follow the last.
    Raises :class:`BadFormat` or :class:`BadOption`.
    """
    if not text:
        return ()
    if not text.startswith(b" ") or text.endswith(b" "):
        raise BadFormat
    found: dict[str, OptionValue] = {}
    for token in text.split(b" "):
        if not token:  # the separator: one or more spaces, as between beanstalkd's arguments
            continue
        raw_name, equals, raw_value = token.partition(b"=")
        if not equals or _NAME.fullmatch(raw_name) is None:
            raise BadFormat
        name = raw_name.decode("ascii")
        spec = specs.get(name)
        if spec is None or name in found:
            raise BadOption(name)
        value = spec.convert(raw_value)
        if value is None:
            raise BadOption(name)
        found[name] = value
    return tuple((name, found[name]) for name in specs if name in found)

# Recurring jobs (schedule-add): when a schedule ticks and what its job is.
# `cron` is a cron expression with its fields joined by `_` (checked by tubeq.model.recurring),
# `every-ms` an interval; a schedule takes exactly one of the two. `pri` and `ttr` are put's
# (ttr in whole seconds, as put's: it is beanstalkd's unit for it), `delay-ms` delays each job.
SCHEDULE_OPTIONS: Final[Mapping[str, Spec]] = {
    "cron": Spec(key=True),
    "every-ms": _MS,
    "pri": _COUNT,
    "ttr": _COUNT,
    "delay-ms": _MS,
}
