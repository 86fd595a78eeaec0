"""Counters and the YAML of stats, stats-tube, stats-job and the tube lists.

Command counters (``cmd-*``) are counted in process memory and added to Redis (counters.lua)
FLUSH_DELAY_S after the first count of a batch, in a write of their own: a put sent and
awaited alone does not wait for them. ``stats`` and ``stats-tube`` from any process see every
process's counts to within that delay, and exactly for their own process, since it sends its
counts ahead of the read. ``total-jobs`` is not counted here: the scripts that store jobs count
it, so it is exact from every process as soon as a put is answered. A send Redis refused (OOM,
a moved slot) or that found no connection is sent again a second later, so no count is lost
to an outage and none is counted twice. Field names and their order are beanstalkd 1.12's,
byte for byte; 1.12 leaves string values unquoted except ``version``.
"""

from __future__ import annotations

import asyncio
import os
import platform
import resource
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence

from tubeq import __version__
from tubeq.store.records import JobInfo, JobPolicies

COMMAND_COUNTERS = (
    "put", "peek", "peek-ready", "peek-delayed", "peek-buried", "reserve",
    "reserve-with-timeout", "delete", "release", "use", "watch", "ignore", "bury", "kick",
    "touch", "stats", "stats-job", "stats-tube", "list-tubes", "list-tube-used",
    "list-tubes-watched", "pause-tube",
)

# beanstalkd's default binlog size; reported for compatibility (tubeq has no binlog: Redis's
# AOF is its durability).
BINLOG_MAX_SIZE = 10485760


# Counts wait this long for more before they go to Redis: well past a lone put's round trip, so
# they are not in its write (Redis answers a write's commands together), and short enough that
# another process's stats reads them at once for a human or a monitor.
FLUSH_DELAY_S = 0.01
# Counts Redis refused (OOM, a moved slot) or that found no connection are sent again after
# this pause, with whatever was counted meanwhile.
RETRY_S = 1.0

Refused = Callable[[dict[str, int]], None]


class CommandCounters:
    """Per-process ``cmd-*`` counts, sent to Redis with ``send(fields, refused)``
    FLUSH_DELAY_S after the first count not yet sent, or at once by :meth:`flush` (before a
    read of the counters, at shutdown). ``refused(fields)`` takes back the part of a send that
    surely did not run, to be sent again after RETRY_S: counts are neither lost nor counted
    twice on a refusal. (A send whose connection was lost while it was out may have run: it
    is not sent again.)"""

    def __init__(self, send: Callable[[dict[str, int], Refused], None]) -> None:
        self._send = send
        self._pending: Counter[str] = Counter()  # by command stat name ("put", not "cmd-put")
        self._timer: asyncio.TimerHandle | None = None
        # Every count this process has sent, since it started: /metrics renders these
        # (tubeq_commands_total), the stats reply the sums in Redis. One source, two renderings.
        self.totals: Counter[str] = Counter()

    def incr(self, name: str, n: int = 1) -> None:
        """``n`` more commands counted as ``cmd-<name>``."""
        self._pending[name] += n
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_DELAY_S, self.flush)

    def flush(self) -> None:
        """Send what was counted since the last send, now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            self.totals.update(self._pending)
            fields = {"cmd-" + name: n for name, n in self._pending.items() if n}
            self._pending = Counter()
            if fields:
                self._send(fields, self.refused)

    def refused(self, fields: dict[str, int]) -> None:
        """Counts a send carried that did not run: counted again, sent again after RETRY_S."""
        for name, n in fields.items():
            self._pending[name[4:]] += n
            self.totals[name[4:]] -= n
        if self._timer is None:  # counts until then wait for the retry too
            self._timer = asyncio.get_running_loop().call_later(RETRY_S, self.flush)


def _yaml(pairs: Sequence[tuple[str, object]]) -> bytes:
    lines = ["---"]
    for key, value in pairs:
        if isinstance(value, bool):
            value = "true" if value else "false"
        lines.append(f"{key}: {value}")
    return ("\n".join(lines) + "\n").encode()


def yaml_list(items: Sequence[str]) -> bytes:
    return ("---\n" + "".join(f"- {item}\n" for item in items)).encode()


def _seconds(ms: int) -> int:
    """Whole seconds, truncated toward zero, as beanstalkd prints durations."""
    return int(ms / 1000)


def _seconds_left(ms: int) -> int:
    """Whole seconds left until a deadline ``ms`` away, never negative.

    beanstalkd truncates nanoseconds, so a full ``ttr`` just granted already shows ``ttr - 1``;
    with millisecond timestamps the same reading needs the deadline's own millisecond excluded.
    """
    return max(0, (ms - 1) // 1000)


# The *_pairs functions are the fields of stats-job, stats-tube and stats in wire order; the
# YAML replies and the HTTP API's JSON (tubeq.http) both render them.
Pairs = list[tuple[str, object]]


def job_yaml(job: JobInfo, now_ms: int, extra: Sequence[tuple[str, object]] = ()) -> bytes:
    """stats-job's document: beanstalkd 1.12's keys, then ``extra`` (tubeq's own, shown to a
    client that has used an extension: see Connection.extended)."""
    return _yaml([*job_pairs(job, now_ms), *extra])


def job_pairs(job: JobInfo, now_ms: int) -> Pairs:
    time_left = 0
    if job.state in ("reserved", "delayed"):
        time_left = _seconds_left(job.due_ms - now_ms)
    return [
        ("id", job.id), ("tube", job.tube), ("state", job.state), ("pri", job.pri),
        ("age", _seconds(now_ms - job.created_ms)), ("delay", job.delay), ("ttr", job.ttr),
        ("time-left", time_left), ("file", 0), ("reserves", job.reserves),
        ("timeouts", job.timeouts), ("releases", job.releases), ("buries", job.buries),
        ("kicks", job.kicks),
    ]


def tube_yaml(name: str, counts: Sequence[int], now_ms: int,
              extra: Sequence[tuple[str, object]] = ()) -> bytes:
    """stats-tube's document: beanstalkd 1.12's keys, then ``extra`` (tubeq's own, shown to a
    client that has used an extension: see Connection.extended)."""
    return _yaml([*tube_pairs(name, counts, now_ms), *extra])


def tube_pairs(name: str, counts: Sequence[int], now_ms: int) -> Pairs:
    (urgent, ready, reserved, delayed, buried, total, using, watching, waiting, deletes,
     pauses, pause, pause_until) = counts
    paused = pause_until > now_ms
    return [
        ("name", name), ("current-jobs-urgent", urgent), ("current-jobs-ready", ready),
        ("current-jobs-reserved", reserved), ("current-jobs-delayed", delayed),
        ("current-jobs-buried", buried), ("total-jobs", total), ("current-using", using),
        ("current-watching", watching), ("current-waiting", waiting), ("cmd-delete", deletes),
        ("cmd-pause-tube", pauses), ("pause", pause if paused else 0),
        ("pause-time-left", _seconds_left(pause_until - now_ms) if paused else 0),
    ]


# What a double-quoted YAML scalar escapes: the backslash, the quote, and every control
# character (an error text may span lines).
_YAML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t",
                 **{chr(n): f"\\x{n:02x}" for n in (*range(0x20), 0x7F) if n not in (9, 10, 13)}}
_YAML_ESCAPE_TABLE = str.maketrans(_YAML_ESCAPES)


def yaml_string(text: str) -> str:
    """``text`` as a double-quoted YAML scalar (a dedupe key may hold '#', ':' or quotes; an
    error text, line breaks)."""
    return '"' + text.translate(_YAML_ESCAPE_TABLE) + '"'


def job_policy_keys(policies: JobPolicies) -> list[tuple[str, object]]:
    """stats-job's extra keys of the job policies (protocol.md, put-with); ``traceparent``
    last, only for a job put with one (protocol.md, "Traces")."""
    keys: list[tuple[str, object]] = [
        ("reason", policies.reason or '""'), ("tries", policies.tries),
        ("max-tries", policies.max_tries), ("expires-at-ms", policies.expires_at_ms),
        ("key", yaml_string(policies.key)), ("failures", policies.failures),
        ("error", yaml_string(policies.error.decode("utf-8", "replace"))),
        ("progress-reports", policies.progress_seq), ("parents-pending", policies.parents_pending),
    ]
    if policies.traceparent:  # (lowercase hex and '-' only: a plain YAML scalar)
        keys.append(("traceparent", policies.traceparent))
    return keys


class ServerIdentity:
    """The process-specific part of ``stats``."""

    def __init__(self, max_job_size: int) -> None:
        self.max_job_size = max_job_size
        self.id = secrets.token_hex(8)
        self.started = time.monotonic()
        self.hostname = socket.gethostname()
        uname = os.uname()
        self.os = uname.version
        self.platform = uname.machine or platform.machine()


def server_yaml(identity: ServerIdentity, gauges: Sequence[int], named: dict[str, int],
                draining: bool) -> bytes:
    # 1.12 quotes the version, and only the version.
    return _yaml([(k, f'"{v}"' if k == "version" else v)
                  for k, v in server_pairs(identity, gauges, named, draining)])


def server_pairs(identity: ServerIdentity, gauges: Sequence[int], named: dict[str, int],
                 draining: bool) -> Pairs:
    urgent, ready, reserved, delayed, buried, tubes, conns, producers, workers, waiting = gauges
    usage = resource.getrusage(resource.RUSAGE_SELF)
    pairs: list[tuple[str, object]] = [
        ("current-jobs-urgent", urgent), ("current-jobs-ready", ready),
        ("current-jobs-reserved", reserved), ("current-jobs-delayed", delayed),
        ("current-jobs-buried", buried),
    ]
    pairs += [(f"cmd-{name}", named.get(f"cmd-{name}", 0)) for name in COMMAND_COUNTERS]
    pairs += [
        ("job-timeouts", named.get("job-timeouts", 0)), ("total-jobs", named.get("total-jobs", 0)),
        ("max-job-size", identity.max_job_size), ("current-tubes", tubes),
        ("current-connections", conns), ("current-producers", producers),
        ("current-workers", workers), ("current-waiting", waiting),
        ("total-connections", named.get("total-connections", 0)), ("pid", os.getpid()),
        ("version", f"{__version__}-tubeq"),
        ("rusage-utime", _rusage(usage.ru_utime)), ("rusage-stime", _rusage(usage.ru_stime)),
        ("uptime", int(time.monotonic() - identity.started)),
        ("binlog-oldest-index", 0), ("binlog-current-index", 0),
        ("binlog-records-migrated", 0), ("binlog-records-written", 0),
        ("binlog-max-size", BINLOG_MAX_SIZE), ("draining", draining), ("id", identity.id),
        ("hostname", identity.hostname), ("os", identity.os), ("platform", identity.platform),
    ]
    return pairs


def _rusage(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole}.{int((seconds - whole) * 1_000_000):06d}"
