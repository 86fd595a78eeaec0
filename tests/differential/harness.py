"""The differential harness: one scripted conversation, played against beanstalkd and the target.

A scenario is a function that writes a :class:`Script`: steps over named raw TCP connections
(send bytes whole, in pieces or one byte per write; expect one reply; expect silence for a while;
expect the server to close; half-close; close; sleep; signal the server). The runner plays the
script against the reference (beanstalkd 1.12) and the target at the same time, records what each
recording step observed, normalises both transcripts and compares them entry by entry.

Normalisation, i.e. everything two correct servers may legitimately disagree on:

* job ids become ``#1``, ``#2`` ... by order of appearance in one run's replies (or ``a+2``, a raw
  delta from a captured id, where a scenario measures id allocation);
* tube names carry the run's unique token and are shown as ``<label>``; ``list-tubes`` keeps only
  ``default`` and this scenario's tubes, so concurrent scenarios do not see each other;
* ``age``, ``time-left`` and ``pause-time-left`` are equal within ±1;
* ``stats``: key order exact, process-specific values ignored, other values by shape only;
  counters are compared as deltas by :meth:`Client.stats_delta` on pristine servers;
* ``OK`` byte counts are checked against their data on each side, then dropped (an id with more
  digits is not a difference);
* YAML lists are compared as sets unless the step says ``ordered``.

Outcomes other than a reply are recorded too: ``<no reply>`` (nothing within the bound),
``<closed>`` (the server closed), and ``<malformed ...>`` (bytes outside the reply grammar).

Scenarios whose reference behaviour is a 1.12 accident tubeq chose not to copy are listed in
:data:`DOCUMENTED_DIFFERENCES`; they carry both expected transcripts and are checked exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import secrets
import signal
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tests.differential.grammar import Malformed, Reply, split_reply

if TYPE_CHECKING:
    from tests.support.servers import ServerKind, ServerProcess

CRLF = b"\r\n"

# --- Bounds. Every wait in a scenario is one of these; none is asserted as a duration. ---------
# A reply that should come: generous, because many scenarios share two cores with Redis.
REPLY_TIMEOUT_S = 4.0
# Once a connection has missed one reply, later waits on it are short so a broken target fails
# fast instead of paying the full bound for every remaining step.
DEGRADED_REPLY_TIMEOUT_S = 0.5
# How long "no reply" must hold: long enough for a local server to have answered a command.
SILENCE_S = 0.4
# One whole scenario, all steps, one server.
SCENARIO_TIMEOUT_S = 45.0
# Gap between the writes of a fragmented send, so they leave as separate segments.
FRAGMENT_GAP_S = 0.002
# Scenarios played at the same time (each plays reference and target concurrently).
CONCURRENT_SCENARIOS = 16


# The 1.12 accidents tubeq does not copy. One line each; protocol.md copies this table.
DOCUMENTED_DIFFERENCES: dict[str, str] = {
    "stray_cr_hides_line_end":
        "beanstalkd 1.12 looks only at the first CR in its buffer, so a CR not followed by LF "
        "hides the real line end and the commands behind it are lost until 224 bytes pile up; "
        "tubeq ends every line at its first CRLF and answers each line.",
    "line_225_bytes_swallows_next":
        "beanstalkd 1.12 never sees the CRLF of a 225-byte line (the CR is the last byte of its "
        "full buffer), answers nothing for it and then swallows the next line; tubeq answers "
        "BAD_FORMAT for the over-long line and then the next line normally.",
    "list_tubes_order_after_delete":
        "beanstalkd 1.12 fills a deleted tube's slot in list-tubes with the last tube; tubeq "
        "keeps creation order (list-tubes is compared as a set everywhere else).",
}


# ================================================================================================
# Scripts: what a scenario writes
# ================================================================================================

@dataclass(frozen=True, slots=True)
class Documented:
    """Expected transcripts of a documented difference, each entry as ``' | '``-joined lines."""

    reference: tuple[str, ...]
    tubeq: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Send:
    conn: str
    data: bytes
    pieces: tuple[int, ...] | None = None  # sizes of the writes; None = one write
    bytewise: bool = False


@dataclass(frozen=True, slots=True)
class Expect:
    """Read the next reply on ``conn``; record it unless ``record`` is False."""

    conn: str
    record: bool = True
    capture: str | None = None  # store the reply's job id under this name, for later sends
    ordered: bool = False  # YAML lists: compare order too
    raw_id_base: str | None = None  # show the id as a delta from this captured id
    timeout: float = REPLY_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class ExpectSilence:
    """Nothing may arrive on ``conn`` for ``seconds``; whatever does arrive is recorded."""

    conn: str
    seconds: float = SILENCE_S


@dataclass(frozen=True, slots=True)
class RepliesUntilQuiet:
    """Record every reply that arrives until ``conn`` stays quiet for ``seconds``, as one entry."""

    conn: str
    seconds: float = SILENCE_S


@dataclass(frozen=True, slots=True)
class ExpectClosed:
    conn: str
    timeout: float = REPLY_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class HalfClose:
    conn: str


@dataclass(frozen=True, slots=True)
class Close:
    conn: str


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class SignalServer:
    signum: signal.Signals
    settle_s: float = 0.5


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """Read global ``stats`` on ``conn`` and keep it (not recorded) for a later delta."""

    conn: str
    name: str


@dataclass(frozen=True, slots=True)
class StatsDelta:
    """Read global ``stats`` on ``conn`` and record every counter's change since a snapshot."""

    conn: str
    since: str


Step = (Send | Expect | ExpectSilence | RepliesUntilQuiet | ExpectClosed | HalfClose | Close
        | Sleep | SignalServer | StatsSnapshot | StatsDelta)


class Script:
    """The steps of one scenario, plus the tube names it uses (unique to this run)."""

    def __init__(self, name: str, token: str) -> None:
        self.name = name
        self.token = token
        self.steps: list[Step] = []
        self.tube_labels: dict[bytes, str] = {b"default": "default"}

    def tube(self, label: str, length: int | None = None) -> str:
        """A tube name unique to this run, shown as ``<label>``; padded to ``length`` if given."""
        name = f"{self.token}-{label}"
        if length is not None:
            if length < len(name):
                raise ValueError(f"tube {label!r} cannot be shorter than {len(name)} bytes")
            name = name + "x" * (length - len(name))
        self.tube_labels[name.encode()] = f"<{label}>"
        return name

    def conn(self, name: str) -> Client:
        return Client(self, name)

    def add(self, step: Step) -> None:
        self.steps.append(step)

    def sleep(self, seconds: float) -> None:
        self.add(Sleep(seconds))

    def signal_server(self, signum: signal.Signals) -> None:
        self.add(SignalServer(signum))


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode("latin-1") if isinstance(data, str) else data


class Client:
    """Steps on one named connection. Methods return ``self`` so short sequences chain."""

    def __init__(self, script: Script, name: str) -> None:
        self.script = script
        self.name = name

    # --- raw steps -------------------------------------------------------------------------
    def send(self, data: bytes | str, *, pieces: Iterable[int] | None = None,
             bytewise: bool = False) -> Client:
        """Send ``data`` (``{name}`` is replaced by a captured id) in one write or several."""
        sizes = tuple(pieces) if pieces is not None else None
        self.script.add(Send(self.name, _as_bytes(data), sizes, bytewise))
        return self

    def line(self, text: bytes | str) -> Client:
        """Send ``text`` followed by CRLF."""
        return self.send(_as_bytes(text) + CRLF)

    def expect(self, *, capture: str | None = None, ordered: bool = False,
               raw_id_base: str | None = None, timeout: float = REPLY_TIMEOUT_S) -> Client:
        self.script.add(Expect(self.name, True, capture, ordered, raw_id_base, timeout))
        return self

    def expect_many(self, count: int) -> Client:
        for _ in range(count):
            self.expect()
        return self

    def skip_reply(self, *, capture: str | None = None) -> Client:
        """Read the next reply without comparing it (setup noise, or a nudge's answer)."""
        self.script.add(Expect(self.name, False, capture))
        return self

    def no_reply(self, seconds: float = SILENCE_S) -> Client:
        self.script.add(ExpectSilence(self.name, seconds))
        return self

    def replies_until_quiet(self, seconds: float = SILENCE_S) -> Client:
        self.script.add(RepliesUntilQuiet(self.name, seconds))
        return self

    def expect_closed(self, timeout: float = REPLY_TIMEOUT_S) -> Client:
        self.script.add(ExpectClosed(self.name, timeout))
        return self

    def half_close(self) -> Client:
        self.script.add(HalfClose(self.name))
        return self

    def close(self) -> Client:
        self.script.add(Close(self.name))
        return self

    # --- commands --------------------------------------------------------------------------
    def cmd(self, text: bytes | str, *, capture: str | None = None) -> Client:
        """Send one command line and record its reply (capturing its job id if asked)."""
        return self.line(text).expect(capture=capture)

    def cmds(self, *texts: bytes | str) -> Client:
        for text in texts:
            self.cmd(text)
        return self

    def quietly(self, *texts: bytes | str) -> Client:
        """Commands whose replies are read but not compared (setup the scenario is not about)."""
        for text in texts:
            self.line(text).skip_reply()
        return self

    def on_tube(self, tube: str) -> Client:
        """Use and watch only ``tube`` (so the shared servers' ``default`` never matters)."""
        return self.cmds(f"use {tube}", f"watch {tube}", "ignore default")

    def watch_only(self, *tubes: str) -> Client:
        for tube in tubes:
            self.cmd(f"watch {tube}")
        return self.cmd("ignore default")

    def put(self, body: bytes | str = b"job", *, pri: int = 0, delay: int = 0, ttr: int = 60,
            capture: str | None = None, raw_id_base: str | None = None) -> Client:
        data = _as_bytes(body)
        self.send(b"put %d %d %d %d\r\n%s\r\n" % (pri, delay, ttr, len(data), data))
        return self.expect(capture=capture, raw_id_base=raw_id_base)

    def reserve(self, *, timeout: int = 0, capture: str | None = None,
                wait: float = REPLY_TIMEOUT_S) -> Client:
        self.line(f"reserve-with-timeout {timeout}")
        return self.expect(capture=capture, timeout=wait)

    def stats_job(self, job: str) -> Client:
        return self.cmd(f"stats-job {{{job}}}")

    def stats_tube(self, tube: str) -> Client:
        return self.cmd(f"stats-tube {tube}")

    def nudge(self) -> Client:
        """A command whose reply is not compared: makes beanstalkd look at this connection's
        TTR deadlines (it can miss them on an idle connection, checklist section 8)."""
        return self.quietly("list-tube-used")

    def stats_snapshot(self, name: str) -> Client:
        self.script.add(StatsSnapshot(self.name, name))
        return self

    def stats_delta(self, since: str) -> Client:
        self.script.add(StatsDelta(self.name, since))
        return self


# ================================================================================================
# Scenario registry
# ================================================================================================

Builder = Callable[[Script], None]


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    name: str
    build: Builder
    pristine: bool = False
    documented: Documented | None = None

    @property
    def quirk(self) -> bool:
        return self.documented is not None


SCENARIOS: dict[str, ScenarioSpec] = {}


def register(name: str, build: Builder, *, pristine: bool = False,
             documented: Documented | None = None) -> None:
    if name in SCENARIOS:
        raise ValueError(f"scenario {name!r} registered twice")
    if (documented is not None) != (name in DOCUMENTED_DIFFERENCES):
        raise ValueError(f"scenario {name!r}: documented transcripts and DOCUMENTED_DIFFERENCES "
                         "must name the same scenarios")
    SCENARIOS[name] = ScenarioSpec(name, build, pristine, documented)


def scenario(*, pristine: bool = False,
             documented: Documented | None = None) -> Callable[[Builder], Builder]:
    """Register the decorated builder under its function name."""

    def decorate(build: Builder) -> Builder:
        register(build.__name__, build, pristine=pristine, documented=documented)
        return build

    return decorate


# ================================================================================================
# Playing a script against one server
# ================================================================================================

@dataclass(frozen=True, slots=True)
class Silence:
    """Nothing complete arrived within the bound."""


@dataclass(frozen=True, slots=True)
class Closed:
    """The server closed the connection; ``leftover`` is any incomplete reply before the close."""

    leftover: bytes = b""


Outcome = Reply | Malformed | Silence | Closed


class WireConnection:
    """A raw TCP connection with a reply buffer: replies are cut out by the reply grammar."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.eof = False
        self.degraded = False

    @classmethod
    async def open(cls, host: str, port: int) -> WireConnection:
        reader, writer = await asyncio.open_connection(host, port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    async def send(self, data: bytes, pieces: tuple[int, ...] | None, bytewise: bool) -> None:
        if bytewise:
            pieces = (1,) * len(data)
        chunks = _split(data, pieces) if pieces else [data]
        try:
            for index, chunk in enumerate(chunks):
                if index:
                    await asyncio.sleep(FRAGMENT_GAP_S)
                self.writer.write(chunk)
                await self.writer.drain()
        except (ConnectionError, OSError):
            self.eof = True  # the server closed first; the next read reports it

    async def next_reply(self, timeout: float) -> Outcome:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (min(timeout, DEGRADED_REPLY_TIMEOUT_S) if self.degraded
                                  else timeout)
        while True:
            parsed = split_reply(self.buffer)
            if parsed is not None:
                outcome, used = parsed
                del self.buffer[:used]
                return outcome
            if self.eof:
                leftover = bytes(self.buffer)
                self.buffer.clear()
                return Closed(leftover)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return Silence()
            try:
                chunk = await asyncio.wait_for(self.reader.read(65536), remaining)
            except TimeoutError:
                return Silence()
            except (ConnectionError, OSError):
                chunk = b""
            if chunk:
                self.buffer += chunk
            else:
                self.eof = True

    def half_close(self) -> None:
        if not self.writer.is_closing() and self.writer.can_write_eof():
            try:
                self.writer.write_eof()
            except (ConnectionError, OSError):
                self.eof = True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


def _split(data: bytes, pieces: tuple[int, ...]) -> list[bytes]:
    chunks: list[bytes] = []
    position = 0
    for size in pieces:
        if position >= len(data):
            break
        chunks.append(data[position:position + size])
        position += size
    if position < len(data):
        chunks.append(data[position:])
    return chunks


@dataclass
class Entry:
    """One recorded observation: where it happened, its normalised lines, and the raw bytes."""

    where: str
    lines: tuple[str, ...]
    raw: bytes = b""

    @property
    def summary(self) -> str:
        return " | ".join(self.lines)


@dataclass
class Run:
    """The state of one script playing against one server."""

    script: Script
    server: ServerProcess
    conns: dict[str, WireConnection] = field(default_factory=dict)
    captured: dict[str, bytes] = field(default_factory=dict)
    id_labels: dict[int, str] = field(default_factory=dict)
    snapshots: dict[str, dict[str, str]] = field(default_factory=dict)
    last_sent: dict[str, bytes] = field(default_factory=dict)
    replies_since_send: dict[str, int] = field(default_factory=dict)
    transcript: list[Entry] = field(default_factory=list)

    async def conn(self, name: str) -> WireConnection:
        if name not in self.conns:
            self.conns[name] = await WireConnection.open(self.server.host, self.server.port)
        return self.conns[name]

    def where(self, index: int, conn: str) -> str:
        """Where an observation was made: the step, the connection and what it last sent (and
        which of the replies to that send, when one send carried several commands)."""
        sent = self.last_sent.get(conn)
        after = f" after {_clip(sent)}" if sent is not None else ""
        nth = self.replies_since_send.get(conn, 0)
        which = f" (reply {nth})" if nth > 1 else ""
        return f"step {index} [{conn}]{after}{which}"

    def substitute(self, data: bytes) -> bytes:
        def replace(match: re.Match[bytes]) -> bytes:
            return self.captured.get(match.group(1).decode(), match.group(0))

        return _PLACEHOLDER.sub(replace, data)

    def record(self, index: int, conn: str, lines: Iterable[str], raw: bytes = b"") -> None:
        self.replies_since_send[conn] = self.replies_since_send.get(conn, 0) + 1
        self.transcript.append(Entry(self.where(index, conn), tuple(lines), raw))


_PLACEHOLDER = re.compile(rb"\{([a-z][a-z0-9_]*)\}")


def _clip(data: bytes, limit: int = 60) -> str:
    text = repr(data)
    return text if len(text) <= limit else text[:limit] + f"...({len(data)} bytes)"


async def play(script: Script, server: ServerProcess) -> tuple[list[Entry], str | None]:
    """Play ``script`` against ``server``: the transcript, and an error if the play broke off."""
    run = Run(script, server)
    error: str | None = None
    try:
        async with asyncio.timeout(SCENARIO_TIMEOUT_S):
            for index, step in enumerate(script.steps, start=1):
                await _play_step(run, index, step)
    except TimeoutError:
        error = f"the scenario did not finish within {SCENARIO_TIMEOUT_S:.0f} s"
    except (ConnectionError, OSError) as exc:
        error = f"connection error: {exc!r}"
    finally:
        for conn in run.conns.values():
            await conn.close()
    return run.transcript, error


async def _play_step(run: Run, index: int, step: Step) -> None:
    match step:
        case Send(conn, data, pieces, bytewise):
            payload = run.substitute(data)
            run.last_sent[conn] = payload
            run.replies_since_send[conn] = 0
            await (await run.conn(conn)).send(payload, pieces, bytewise)
        case Expect(conn, record, capture, ordered, raw_id_base, timeout):
            wire = await run.conn(conn)
            outcome = await wire.next_reply(timeout)
            if isinstance(outcome, Silence):
                wire.degraded = True
            if capture is not None and isinstance(outcome, Reply):
                _capture_id(run, capture, outcome)
            if record:
                run.record(index, conn,
                           render(run, outcome, ordered=ordered, raw_id_base=raw_id_base),
                           _raw(outcome))
        case ExpectSilence(conn, seconds):
            outcome = await (await run.conn(conn)).next_reply(seconds)
            run.record(index, conn, render(run, outcome), _raw(outcome))
        case RepliesUntilQuiet(conn, seconds):
            wire = await run.conn(conn)
            collected: list[str] = []
            raw = b""
            while not isinstance(outcome := await wire.next_reply(seconds), Silence):
                collected.extend(render(run, outcome))
                raw += _raw(outcome)
                if isinstance(outcome, Closed):
                    break
            run.record(index, conn, collected or ["<no reply>"], raw)
        case ExpectClosed(conn, timeout):
            outcome = await (await run.conn(conn)).next_reply(timeout)
            observed = ["<still open>"] if isinstance(outcome, Silence) else render(run, outcome)
            run.record(index, conn, observed, _raw(outcome))
        case HalfClose(conn):
            (await run.conn(conn)).half_close()
        case Close(conn):
            if conn in run.conns:
                await run.conns.pop(conn).close()
        case Sleep(seconds):
            await asyncio.sleep(seconds)
        case SignalServer(signum, settle_s):
            run.server.send_signal(signum)
            await asyncio.sleep(settle_s)
        case StatsSnapshot(conn, name):
            run.snapshots[name] = await _read_stats(run, conn)
        case StatsDelta(conn, since):
            current = await _read_stats(run, conn)
            run.record(index, conn, stats_delta_lines(run.snapshots.get(since, {}), current))


async def _read_stats(run: Run, conn: str) -> dict[str, str]:
    wire = await run.conn(conn)
    await wire.send(b"stats\r\n", None, False)
    run.last_sent[conn] = b"stats\r\n"
    run.replies_since_send[conn] = 0
    outcome = await wire.next_reply(REPLY_TIMEOUT_S)
    if isinstance(outcome, Reply) and outcome.data is not None:
        return dict(_yaml_pairs(outcome.data))
    return {}


def _raw(outcome: Outcome) -> bytes:
    if isinstance(outcome, Reply | Malformed):
        return outcome.raw
    if isinstance(outcome, Closed):
        return outcome.leftover
    return b""


def _capture_id(run: Run, name: str, reply: Reply) -> None:
    words = reply.words
    if len(words) >= 2 and words[0] in _ID_REPLIES and words[1].isdigit():
        run.captured[name] = words[1]


_ID_REPLIES = frozenset({b"INSERTED", b"BURIED", b"RESERVED", b"FOUND"})


# ================================================================================================
# Normalisation: an outcome becomes lines two correct servers agree on
# ================================================================================================

# Values that belong to one process and say nothing about the protocol.
PROCESS_SPECIFIC_STATS = frozenset({
    "pid", "version", "rusage-utime", "rusage-stime", "uptime", "id", "hostname", "os",
    "platform", "total-connections",
})
# Values that are the same on every correctly configured server, whatever its history.
CONSTANT_STATS = frozenset({
    "max-job-size", "binlog-oldest-index", "binlog-current-index", "binlog-records-migrated",
    "binlog-records-written", "binlog-max-size", "draining",
})
# Seconds measured from a clock: equal within ±1 (truncated on both sides, taken at
# slightly different instants).
TIME_FIELDS = frozenset({"age", "time-left", "pause-time-left"})

BODY_SHOWN_UP_TO = 80
_TIME_LINE = re.compile(r"^(.*): ~(-?\d+)$")
_SECONDS_VALUE = re.compile(r"\d+\.\d{6}")


def id_label(run: Run, job_id: bytes, raw_id_base: str | None = None) -> str:
    if not job_id.isdigit():
        return job_id.decode("latin-1")
    value = int(job_id)
    if raw_id_base is not None:
        base = run.captured.get(raw_id_base)
        if base is not None:
            # A split namespace (tubeq --shards N) numbers a tube's jobs N apart.
            stride = int(run.server.extra.get("shards", 1))
            return f"{raw_id_base}{(value - int(base)) // stride:+d}"
    if value not in run.id_labels:
        run.id_labels[value] = f"#{len(run.id_labels) + 1}"
    return run.id_labels[value]


def tube_label(run: Run, name: bytes) -> str:
    label = run.script.tube_labels.get(name)
    if label is not None:
        return label
    return f"<foreign tube {name.decode('latin-1')!r}>"


def _ours(run: Run, name: bytes) -> bool:
    return name in run.script.tube_labels or run.script.token.encode() in name


def render_body(data: bytes) -> str:
    if len(data) <= BODY_SHOWN_UP_TO:
        return repr(data)
    return f"<{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}>"


def render(run: Run, outcome: Outcome, *, ordered: bool = False,
           raw_id_base: str | None = None) -> list[str]:
    """The normalised lines for one outcome (see the module docstring for the rules)."""
    match outcome:
        case Silence():
            return ["<no reply>"]
        case Closed(leftover):
            return [f"<closed after an incomplete reply {leftover!r}>" if leftover else "<closed>"]
        case Malformed(raw, why):
            return [f"<malformed: {why}: {_clip(raw, 120)}>"]
        case Reply():
            return _render_reply(run, outcome, ordered, raw_id_base)
    raise AssertionError(outcome)


def _render_reply(run: Run, reply: Reply, ordered: bool, raw_id_base: str | None) -> list[str]:
    words = reply.words
    word = words[0].decode("latin-1")
    if words[0] in (b"INSERTED", b"BURIED") and len(words) == 2:
        return [f"{word} {id_label(run, words[1], raw_id_base)}"]
    if words[0] in (b"RESERVED", b"FOUND") and reply.data is not None:
        return [f"{word} {id_label(run, words[1], raw_id_base)} {words[2].decode()}",
                f"  body {render_body(reply.data)}"]
    if words[0] == b"USING" and len(words) == 2:
        return [f"USING {tube_label(run, words[1])}"]
    if words[0] == b"OK" and reply.data is not None:
        return _render_yaml(run, reply.data, ordered)
    return [reply.head.decode("latin-1")]


def _yaml_pairs(data: bytes) -> list[tuple[str, str]]:
    pairs = []
    for line in data.decode("latin-1").split("\n")[1:-1]:
        key, _, value = line.partition(": ")
        pairs.append((key, value))
    return pairs


def _render_yaml(run: Run, data: bytes, ordered: bool) -> list[str]:
    if not (data.startswith(b"---\n") and data.endswith(b"\n")):
        return [f"<malformed: OK data is not a YAML document: {_clip(data, 120)}>"]
    body_lines = data[4:-1].split(b"\n") if len(data) > 4 else []
    if body_lines and all(line.startswith(b"- ") for line in body_lines):
        names = [line[2:] for line in body_lines]
        items = [f"- {tube_label(run, name)}" for name in names if _ours(run, name)]
        return ["OK list" + (" (ordered)" if ordered else "")] + (
            items if ordered else sorted(items))
    pairs = _yaml_pairs(data)
    keys = [key for key, _ in pairs]
    if keys[:1] == ["id"]:
        return ["OK stats-job", *(_job_stat(run, key, value) for key, value in pairs)]
    if keys[:1] == ["name"]:
        return ["OK stats-tube", *(_tube_stat(run, key, value) for key, value in pairs)]
    if keys[:1] == ["current-jobs-urgent"]:
        return ["OK stats", *(f"{key}: {_server_stat_shape(key, value)}" for key, value in pairs)]
    return ["OK <unrecognised document>", *data.decode("latin-1").split("\n")]


def _job_stat(run: Run, key: str, value: str) -> str:
    if key == "id":
        return f"id: {id_label(run, value.encode())}"
    if key == "tube":
        return f"tube: {tube_label(run, value.encode())}"
    if key in TIME_FIELDS:
        return f"{key}: ~{value}"
    return f"{key}: {value}"


def _tube_stat(run: Run, key: str, value: str) -> str:
    if key == "name":
        return f"name: {tube_label(run, value.encode())}"
    if key in TIME_FIELDS:
        return f"{key}: ~{value}"
    return f"{key}: {value}"


def _server_stat_shape(key: str, value: str) -> str:
    if key in CONSTANT_STATS:
        return value
    if key in ("id", "hostname", "os", "platform"):
        return "<ignored>"
    if key == "version":
        return "<quoted>" if len(value) >= 2 and value[0] == value[-1] == '"' else value
    if value.isdigit():
        return "<count>"
    if _SECONDS_VALUE.fullmatch(value):
        return "<seconds>"
    return f"<unexpected value {value!r}>"


def stats_delta_lines(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Every counter's change between two ``stats`` documents (process-specific ones left out)."""
    if not before or not after:
        return ["<stats unavailable>"]
    lines = ["stats delta"]
    for key, value in after.items():
        if key in PROCESS_SPECIFIC_STATS or key in CONSTANT_STATS:
            continue
        old = before.get(key)
        if old is None or not (value.isdigit() and old.isdigit()):
            lines.append(f"{key}: <not a counter: {old!r} -> {value!r}>")
        else:
            lines.append(f"{key}: {int(value) - int(old):+d}")
    return lines


# ================================================================================================
# Comparing two transcripts
# ================================================================================================

def lines_match(expected: str, got: str) -> bool:
    if expected == got:
        return True
    a, b = _TIME_LINE.match(expected), _TIME_LINE.match(got)
    return bool(a and b and a.group(1) == b.group(1)
                and abs(int(a.group(2)) - int(b.group(2))) <= 1)


def entries_match(expected: Entry, got: Entry) -> bool:
    return len(expected.lines) == len(got.lines) and all(
        lines_match(x, y) for x, y in zip(expected.lines, got.lines, strict=True))


def transcript_differences(reference: list[Entry], target: list[Entry]) -> list[str]:
    """Human-readable differences, one per differing entry (empty when the two agree)."""
    differences = []
    for index in range(max(len(reference), len(target))):
        ref = reference[index] if index < len(reference) else None
        got = target[index] if index < len(target) else None
        if ref is not None and got is not None and entries_match(ref, got):
            continue
        differences.append(_describe_difference(index + 1, ref, got))
    return differences


def _describe_difference(number: int, ref: Entry | None, got: Entry | None) -> str:
    located = ref if ref is not None else got
    text = [f"entry {number}, {located.where if located is not None else '?'}:"]
    for side, entry in (("expected", ref), ("got     ", got)):
        if entry is None:
            text.append(f"  {side}: <no such entry>")
            continue
        text.append(f"  {side}: {entry.summary}")
        text.append(f"  {'':8}  raw {_clip(entry.raw, 1000)}")
    return "\n".join(text)


def format_transcript(entries: list[Entry]) -> str:
    return "\n".join(f"  {n:>3}. {entry.where}: {entry.summary}"
                     for n, entry in enumerate(entries, start=1))


# ================================================================================================
# Running scenarios
# ================================================================================================

@dataclass
class ScenarioOutcome:
    """What one scenario observed on both servers, and whether that is acceptable."""

    spec: ScenarioSpec
    target_kind: ServerKind
    reference: list[Entry]
    target: list[Entry]
    errors: list[str]
    target_log: str = ""

    def problems(self) -> list[str]:
        problems = list(self.errors)
        documented = self.spec.documented
        if documented is None:
            problems += transcript_differences(self.reference, self.target)
            return problems
        problems += _documented_problems("reference (beanstalkd 1.12)", documented.reference,
                                         self.reference)
        expected_target = documented.tubeq if self.target_kind == "tubeq" else documented.reference
        problems += _documented_problems(f"target ({self.target_kind})", expected_target,
                                         self.target)
        return problems

    def report(self) -> str:
        problems = self.problems()
        parts = [f"scenario {self.spec.name}: {len(problems)} problem(s)", *problems,
                 "reference transcript:", format_transcript(self.reference),
                 "target transcript:", format_transcript(self.target)]
        if self.spec.documented is not None:
            parts.insert(1, f"documented difference: {DOCUMENTED_DIFFERENCES[self.spec.name]}")
        if self.target_log.strip():
            parts += ["target server output (tail):", self.target_log]
        return "\n".join(parts)


def dump_transcripts(outcomes: Iterable[ScenarioOutcome]) -> str:
    """Every scenario's two transcripts as text (``--wire-dump``), for reading and for docs."""
    parts = []
    for outcome in sorted(outcomes, key=lambda o: o.spec.name):
        verdict = "FAIL" if outcome.problems() else "PASS"
        parts += [f"=== {outcome.spec.name}: {verdict}", "reference:",
                  format_transcript(outcome.reference), "target:",
                  format_transcript(outcome.target), ""]
    return "\n".join(parts)


def _documented_problems(side: str, expected: tuple[str, ...], got: list[Entry]) -> list[str]:
    summaries = [entry.summary for entry in got]
    if summaries == list(expected):
        return []
    return [f"{side} does not show the documented transcript:\n"
            f"  expected: {list(expected)}\n  got:      {summaries}"]


def new_run_token() -> str:
    """A short token unique to this run of the suite; every tube name starts with it."""
    return "w" + secrets.token_hex(3)


async def run_scenario(spec: ScenarioSpec, token: str, reference: ServerProcess,
                       target: ServerProcess) -> ScenarioOutcome:
    script = Script(spec.name, token)
    spec.build(script)
    (ref_transcript, ref_error), (target_transcript, target_error) = await asyncio.gather(
        play(script, reference), play(script, target))
    errors = [f"reference: {ref_error}"] if ref_error else []
    if target_error:
        errors.append(f"target: {target_error}")
    if not target.alive():
        errors.append(f"target server {target.describe()} died "
                      f"(exit status {target.proc.returncode})")
    log = target.log_tail(3000) if target.kind == "tubeq" else ""
    problems_possible = bool(errors) or _would_fail(spec, ref_transcript, target_transcript)
    return ScenarioOutcome(spec, target.kind, ref_transcript, target_transcript, errors,
                           log if problems_possible else "")


def _would_fail(spec: ScenarioSpec, reference: list[Entry], target: list[Entry]) -> bool:
    return spec.documented is None and bool(transcript_differences(reference, target))


PairFactory = Callable[[], "tuple[ServerProcess, ServerProcess]"]


async def run_scenarios(specs: Iterable[ScenarioSpec], *, token: str, reference: ServerProcess,
                        target: ServerProcess,
                        pristine_pair: PairFactory) -> dict[str, ScenarioOutcome]:
    """Run every scenario (shared servers, or a fresh pair for pristine ones), a few at a time."""
    gate = asyncio.Semaphore(CONCURRENT_SCENARIOS)

    async def one(spec: ScenarioSpec) -> ScenarioOutcome:
        async with gate:
            if not spec.pristine:
                return await run_scenario(spec, f"{token}-{_short(spec.name)}", reference,
                                          target)
            fresh_reference, fresh_target = await asyncio.to_thread(pristine_pair)
            try:
                return await run_scenario(spec, f"{token}-{_short(spec.name)}", fresh_reference,
                                          fresh_target)
            finally:
                await asyncio.to_thread(fresh_reference.stop)
                await asyncio.to_thread(fresh_target.stop)

    outcomes = await asyncio.gather(*(one(spec) for spec in specs))
    return {outcome.spec.name: outcome for outcome in outcomes}


def _short(name: str) -> str:
    """A short, stable, name-safe tag for a scenario (tube names must stay under 200 bytes)."""
    return hashlib.sha1(name.encode()).hexdigest()[:6]
