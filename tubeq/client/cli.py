"""``tubeq-cli``: what operators do by hand to a tubeq (or beanstalkd) server, on the command line.

put, peek, kick, kick-job, bury, delete, pause, stats, list, and ``top``, a live view of every
tube refreshed in place; ``schedule add|list|remove`` for tubeq's recurring jobs; against tubeq
also put's job policies and dedupe key (put-with) and peek-key. Output is for people by default
and JSON with ``--json``. Every command runs through :mod:`tubeq.client`, pipelining what it can
on one connection.

Rules: a failure (cannot connect, no such job or tube, an error reply) exits 1 and a bad
argument exits 2, each with exactly one line on stderr (``tubeq-cli: ...``); nothing else is
written to stderr. ``top`` uses plain ANSI clear-and-redraw, no curses.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

from tubeq import __version__
from tubeq.client import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_PRIORITY,
    DEFAULT_TTR,
    U32_MAX,
    BadFormat,
    BadOption,
    CallTimedOut,
    Client,
    ClientConnectionError,
    ClientError,
    CommandError,
    Job,
    JobNotFinished,
    ListedJob,
    NotFound,
    Stats,
    TimedOut,
)
from tubeq.client.admin import CLEAR_STATES, LIST_JOBS_MAX, LIST_STATES

PROG = "tubeq-cli"
# How often top redraws unless told: often enough to watch a queue move, rarely enough that the
# per-tube stats round trips are no load on the server.
DEFAULT_INTERVAL_S = 2.0
DEFAULT_WAIT_S = 30.0  # call and wait: how long for a job's end
# ANSI: cursor home, then clear the screen.
CLEAR = "\x1b[H\x1b[2J"
EXIT_FAILURE = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A failure to report as one line on stderr, exit status 1."""


class UsageError(Exception):
    """A bad argument, found after parsing: one line on stderr, exit status 2."""


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``tubeq-cli: error: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{PROG}: error: {message} (see {PROG} --help)\n")


def _add_connection_options(parser: argparse.ArgumentParser, *, in_subcommand: bool) -> None:
    # Accepted before or after the subcommand: in a subcommand they default to "not given", so
    # they never overwrite what was given before it.
    def default(value: object) -> object:
        return argparse.SUPPRESS if in_subcommand else value

    parser.add_argument("-H", "--host", default=default(DEFAULT_HOST),
                        help=f"server address ({DEFAULT_HOST})")
    parser.add_argument("-p", "--port", type=int, default=default(DEFAULT_PORT),
                        help=f"server port ({DEFAULT_PORT})")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print JSON instead of text")
    parser.add_argument("--timeout", type=float, default=default(5.0), metavar="SECONDS",
                        help="connect timeout (5)")


def _job_id(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a job id: {text!r}")
    return int(text)


def _uint(text: str) -> int:
    if not text.isdigit() or int(text) > U32_MAX:
        raise argparse.ArgumentTypeError(f"not an integer from 0 to {U32_MAX}: {text!r}")
    return int(text)


def _ms(text: str) -> int:
    if not text.isdigit() or int(text) > U32_MAX * 1000:
        raise argparse.ArgumentTypeError(
            f"not a number of milliseconds from 0 to {U32_MAX * 1000}: {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def _with_a_job(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A command that puts one job (put, call): its body, tube, priority and TTR."""
    command.add_argument("body", nargs="?", help="the job body (default: read stdin)")
    command.add_argument("-f", "--file", type=Path, help="read the body from FILE ('-': stdin)")
    command.add_argument("-t", "--tube", default="default", help="tube (default)")
    command.add_argument("--pri", type=_uint, default=DEFAULT_PRIORITY,
                         help=f"priority, 0 most urgent ({DEFAULT_PRIORITY})")
    command.add_argument("--ttr", type=_uint, default=DEFAULT_TTR,
                         help=f"seconds a worker may hold it ({DEFAULT_TTR})")
    return command


def _wait_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= U32_MAX:
        raise argparse.ArgumentTypeError(f"not a number of seconds from 0 to {U32_MAX}: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Operate a tubeq or beanstalkd server.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _add_connection_options(parser, in_subcommand=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)

    def command(name: str, help: str, aliases: Sequence[str] = ()) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, aliases=list(aliases))
        _add_connection_options(sub, in_subcommand=True)
        return sub

    put = _with_a_job(command("put", "put a job (body from an argument, --file, or stdin)"))
    put.add_argument("--delay", type=_uint, default=0, help="seconds before it is ready (0)")

    peek = command("peek", "show a job: by id, or the next ready/delayed/buried one of a tube")
    peek.add_argument("which", metavar="{ready,delayed,buried,ID}")
    peek.add_argument("-t", "--tube", default="default", help="tube for ready/delayed/buried")

    kick = command("kick", "kick up to BOUND buried jobs of a tube (delayed ones if none)")
    kick.add_argument("bound", type=_uint, nargs="?", default=1, help="how many (1)")
    kick.add_argument("-t", "--tube", default="default", help="tube (default)")

    kick_job = command("kick-job", "kick one buried or delayed job")
    kick_job.add_argument("id", type=_job_id)

    bury = command("bury", "bury a ready or delayed job (reserves it, then buries it)")
    bury.add_argument("id", type=_job_id)
    bury.add_argument("--pri", type=_uint, default=None, help="priority (its own)")

    delete = command("delete", "delete jobs")
    delete.add_argument("ids", type=_job_id, nargs="+", metavar="ID")

    pause = command("pause", "hold reserves from a tube for SECONDS (0 resumes)")
    pause.add_argument("tube")
    pause.add_argument("seconds", type=_uint)

    stats = command("stats", "server stats, or a tube's (-t), or a job's (-j)")
    which = stats.add_mutually_exclusive_group()
    which.add_argument("-t", "--tube", help="stats of this tube")
    which.add_argument("-j", "--job", type=_job_id, help="stats of this job")

    command("list", "list the tubes", aliases=["list-tubes"])

    # batches
    put_many = command("put-many", "put one job per non-blank line of stdin (or --file), in one "
                                   "round trip")
    put_many.add_argument("-f", "--file", type=Path, help="read the lines from FILE ('-': stdin)")
    put_many.add_argument("-t", "--tube", default="default", help="tube (default)")
    put_many.add_argument("--pri", type=_uint, default=DEFAULT_PRIORITY,
                          help=f"priority of every job ({DEFAULT_PRIORITY})")
    put_many.add_argument("--delay", type=_uint, default=0, help="seconds before ready (0)")
    put_many.add_argument("--ttr", type=_uint, default=DEFAULT_TTR,
                          help=f"seconds a worker may hold one ({DEFAULT_TTR})")

    top = command("top", "a live view of every tube, refreshed in place")
    top.add_argument("-n", "--interval", type=_seconds, default=DEFAULT_INTERVAL_S,
                     metavar="SECONDS", help=f"seconds between frames ({DEFAULT_INTERVAL_S:g})")
    top.add_argument("--once", action="store_true",
                     help="print one frame (rates measured over one interval) and exit")

    # job policies and deduplicated put (tubeq): put's options, peek-key
    for flag, kind, help_text in (
            ("--delay-ms", _ms, "milliseconds before it is ready (instead of --delay)"),
            ("--max-tries", _uint, "bury it (reason max-tries) after this many "
                                   "timeouts/releases"),
            ("--backoff-ms", _ms, "after a TTR timeout, delay it by this, doubling per try"),
            ("--backoff-max-ms", _ms, "the cap of that delay"),
            ("--ttl-ms", _ms, "expire it this long after the put, unless deleted")):
        put.add_argument(flag, type=kind, default=None, help=f"tubeq: {help_text}")
    put.add_argument("--on-expire", choices=("bury", "delete"), default=None,
                     help="tubeq: what an expired job becomes (the tube's setting, bury)")
    put.add_argument("--key", default=None,
                     help="tubeq: dedupe key: no second job while one with KEY lives")
    put.add_argument("--after", type=_job_ids, default=None, metavar="ID[,ID...]",
                     help="tubeq: hold it until these jobs finished (dependencies)")
    put.add_argument("--group", default=None, metavar="KEY",
                     help="tubeq: the job's group: a tube's groups take turns")
    # jobs that answer (tubeq): request/reply, and waiting for a job's end
    call = _with_a_job(command("call", "tubeq: put a job and wait for a worker's result "
                                       "(request/reply)"))
    call.add_argument("--key", default=None,
                      help="dedupe key: while a job with KEY lives, wait for that one")
    call.add_argument("--wait", type=_wait_s, default=DEFAULT_WAIT_S, metavar="SECONDS",
                      help=f"how long to wait for the result ({DEFAULT_WAIT_S:g})")
    wait = command("wait", "tubeq: wait for a job to end; its result when a worker finished it")
    wait.add_argument("id", type=_job_id)
    wait.add_argument("--wait", type=_wait_s, default=DEFAULT_WAIT_S, metavar="SECONDS",
                      help=f"how long to wait (0: do not wait; {DEFAULT_WAIT_S:g})")
    peek_key = command("peek-key", "tubeq: show the living job put with a dedupe key")
    peek_key.add_argument("key")
    # admin verbs (tubeq only; protocol.md "Admin verbs")
    clear = command("clear", "delete a tube's jobs: all of them or one state (never reserved)")
    clear.add_argument("tube")
    clear.add_argument("--state", choices=CLEAR_STATES, default="all", help="which jobs (all)")

    jobs = command("jobs", "list a tube's jobs in one state (id, pri, due time)")
    jobs.add_argument("tube")
    jobs.add_argument("--state", choices=LIST_STATES, default="ready", help="which (ready)")
    jobs.add_argument("--count", type=_page_size, default=100,
                      help=f"jobs per page, 1 to {LIST_JOBS_MAX} (100)")
    jobs.add_argument("--cursor", default="0", help="start after this cursor (0: the start)")
    jobs.add_argument("--all", action="store_true", help="every page, not only one")

    change_pri = command("change-pri", "give a job a new priority (any state)")
    change_pri.add_argument("id", type=_job_id)
    change_pri.add_argument("pri", type=_uint)

    change_delay = command("change-delay", "make a delayed job due MS milliseconds from now")
    change_delay.add_argument("id", type=_job_id)
    change_delay.add_argument("ms", type=_delay_ms)

    pause_forever = command("pause-forever", "pause a tube with no end (until resume)")
    pause_forever.add_argument("tube")

    resume = command("resume", "end a tube's pause, with or without an end")
    resume.add_argument("tube")
    quiet = command("quiet", "ask push consumers to stop taking jobs (a quiet shutdown)")
    scope = quiet.add_mutually_exclusive_group()
    scope.add_argument("--tube", help="only those watching TUBE (default: all)")
    scope.add_argument("--conn", metavar="TOKEN",
                       help="only the connection TOKEN (as the server's log names it)")
    # recurring jobs (tubeq only)
    schedule = command("schedule", "a tube's recurring jobs (tubeq): add, list, remove")
    actions = schedule.add_subparsers(dest="action", required=True, metavar="ACTION",
                                      parser_class=_Parser)
    add = actions.add_parser("add", help="add (or replace) a schedule",
                             description="Put a job into TUBE on every tick, exactly once "
                             "per tick across all tubeq processes.")
    _add_connection_options(add, in_subcommand=True)
    add.add_argument("tube")
    add.add_argument("name")
    add.add_argument("body", nargs="?", help="the job body (default: read stdin)")
    add.add_argument("-f", "--file", type=Path, help="read the body from FILE ('-': stdin)")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR",
                      help="5-field cron expression or @hourly-style alias, UTC "
                           "(e.g. '*/5 * * * *')")
    when.add_argument("--every-ms", type=_uint, metavar="MS", help="interval in ms (>= 100)")
    add.add_argument("--pri", type=_uint, default=DEFAULT_PRIORITY,
                     help=f"priority of its jobs ({DEFAULT_PRIORITY})")
    add.add_argument("--ttr", type=_uint, default=DEFAULT_TTR,
                     help=f"seconds a worker may hold one ({DEFAULT_TTR})")
    add.add_argument("--delay-ms", type=_uint, default=0, help="delay of each job in ms (0)")
    listing = actions.add_parser("list", help="list a tube's schedules")
    _add_connection_options(listing, in_subcommand=True)
    listing.add_argument("tube")
    remove = actions.add_parser("remove", help="remove a schedule (its jobs stay)")
    _add_connection_options(remove, in_subcommand=True)
    remove.add_argument("tube")
    remove.add_argument("name")
    return parser


def _page_size(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= LIST_JOBS_MAX:
        raise argparse.ArgumentTypeError(f"not an integer from 1 to {LIST_JOBS_MAX}: {text!r}")
    return int(text)


def _delay_ms(text: str) -> int:
    if not text.isdigit() or int(text) > U32_MAX * 1000:
        raise argparse.ArgumentTypeError(
            f"not a number of milliseconds from 0 to {U32_MAX * 1000}: {text!r}")
    return int(text)


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


@dataclass
class Output:
    json: bool
    out: TextIO = field(default_factory=lambda: sys.stdout)

    def emit(self, text: str, data: object) -> None:
        if self.json:
            self.out.write(json.dumps(data, sort_keys=False) + "\n")
        else:
            self.out.write(text if text.endswith("\n") or not text else text + "\n")
        self.out.flush()

    def body(self, body: bytes) -> None:
        """Write a job body as it is (bytes), ending with a newline."""
        self.out.flush()
        sys.stdout.buffer.write(body if body.endswith(b"\n") else body + b"\n")
        sys.stdout.buffer.flush()


def _body_json(body: bytes) -> dict[str, str]:
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_base64": base64.b64encode(body).decode("ascii")}


def _stats_text(stats: Stats) -> str:
    width = max((len(key) for key in stats), default=0)
    return "\n".join(f"{key:<{width}}  {_plain(value)}" for key, value in stats.items())


def _plain(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------

Command = Callable[[Client, argparse.Namespace, Output], Awaitable[None]]


def _read_body(args: argparse.Namespace) -> bytes:
    if args.body is not None and args.file is not None:
        raise UsageError("give the body as an argument or with --file, not both")
    if args.body is not None:
        return str(args.body).encode("utf-8")
    if args.file is None or str(args.file) == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(args.file).read_bytes()
    except OSError as error:
        raise CliError(f"cannot read {args.file}: {error.strerror or error}") from error


async def cmd_put(client: Client, args: argparse.Namespace, out: Output) -> None:
    body = _read_body(args)
    await client.use(args.tube)
    if any(getattr(args, name) is not None for name in PUT_WITH_OPTIONS):
        await _put_with(client, args, body, out)
        return
    job_id = await client.put(body, pri=args.pri, delay=args.delay, ttr=args.ttr)
    out.emit(f"inserted job {job_id} into tube {args.tube}",
             {"id": job_id, "tube": args.tube, "bytes": len(body)})


async def cmd_peek(client: Client, args: argparse.Namespace, out: Output) -> None:
    which = str(args.which)
    peekers = {"ready": client.peek_ready, "delayed": client.peek_delayed,
               "buried": client.peek_buried}
    try:
        if which in peekers:
            await client.use(args.tube)
            job = await peekers[which]()
        elif which.isdigit():
            job = await client.peek(int(which))
        else:
            raise UsageError(f"peek what? ready, delayed, buried or a job id, not {which!r}")
    except NotFound as error:
        if which.isdigit():
            raise CliError(f"job {which} not found") from error
        raise CliError(f"no {which} job in tube {args.tube}") from error
    await _show_job(client, job, out)


async def _show_job(client: Client, job: Job, out: Output) -> None:
    info: dict[str, object] = {"id": job.id}
    try:
        stats = await client.stats_job(job.id)
        info.update(tube=stats["tube"], state=stats["state"], pri=stats["pri"],
                    age=stats["age"], ttr=stats["ttr"])
    except NotFound:  # deleted between the two commands
        pass
    info["bytes"] = len(job.body)
    if out.json:
        out.emit("", info | _body_json(job.body))
        return
    details = ", ".join(f"{key} {value}" for key, value in info.items() if key != "id")
    out.emit(f"job {job.id} ({details})", None)
    out.body(job.body)


async def cmd_kick(client: Client, args: argparse.Namespace, out: Output) -> None:
    await client.use(args.tube)
    count = await client.kick(args.bound)
    out.emit(f"kicked {count} job{'s' if count != 1 else ''} in tube {args.tube}",
             {"kicked": count, "tube": args.tube})


async def cmd_kick_job(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        await client.kick_job(args.id)
    except NotFound as error:
        raise CliError(f"job {args.id} not found, or neither buried nor delayed") from error
    out.emit(f"kicked job {args.id}", {"id": args.id, "kicked": True})


async def cmd_bury(client: Client, args: argparse.Namespace, out: Output) -> None:
    # bury needs a reservation: reserve-job takes the job in any state but reserved.
    try:
        stats, job = await asyncio.gather(client.stats_job(args.id), client.reserve_job(args.id))
    except NotFound as error:
        raise CliError(f"job {args.id} not found, or reserved by a worker") from error
    pri = int(stats["pri"]) if args.pri is None else args.pri
    await job.bury(pri=pri)
    out.emit(f"buried job {args.id}", {"id": args.id, "buried": True, "pri": pri})


async def cmd_delete(client: Client, args: argparse.Namespace, out: Output) -> None:
    # One round trip: delete-many where the server has it, pipelined deletes otherwise.
    results = await client.delete_many(args.ids)
    missing = [job_id for job_id, done in zip(args.ids, results, strict=True) if not done]
    deleted = [job_id for job_id in args.ids if job_id not in missing]
    if deleted:
        out.emit("\n".join(f"deleted job {job_id}" for job_id in deleted),
                 {"deleted": deleted, "not_found": missing})
    if missing:
        ids = ", ".join(map(str, missing))
        raise CliError(f"job {ids} not found (or reserved by a worker)" if len(missing) == 1
                       else f"jobs {ids} not found (or reserved by a worker)")


async def cmd_pause(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        await client.pause_tube(args.tube, args.seconds)
    except NotFound as error:
        raise CliError(f"tube {args.tube} not found") from error
    text = (f"resumed tube {args.tube}" if args.seconds == 0
            else f"paused tube {args.tube} for {args.seconds} s")
    out.emit(text, {"tube": args.tube, "paused": args.seconds})


async def cmd_stats(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        if args.job is not None:
            stats = await client.stats_job(args.job)
        elif args.tube is not None:
            stats = await client.stats_tube(args.tube)
        else:
            stats = await client.stats()
    except NotFound as error:
        what = f"job {args.job}" if args.job is not None else f"tube {args.tube}"
        raise CliError(f"{what} not found") from error
    out.emit(_stats_text(stats), stats)


async def cmd_list(client: Client, args: argparse.Namespace, out: Output) -> None:
    tubes = await client.list_tubes()
    out.emit("\n".join(tubes), tubes)


# -- top ---------------------------------------------------------------------------------------


@dataclass
class Sample:
    """One reading of the server: its stats and every tube's, at ``at`` (monotonic seconds)."""

    at: float
    server: Stats
    tubes: dict[str, Stats]


async def take_sample(client: Client) -> Sample:
    """stats, list-tubes, then every stats-tube pipelined on the one connection."""
    server, names = await asyncio.gather(client.stats(), client.list_tubes())
    results = await asyncio.gather(*(client.stats_tube(name) for name in names),
                                   return_exceptions=True)
    tubes: dict[str, Stats] = {}
    for name, result in zip(names, results, strict=True):
        if isinstance(result, NotFound):  # the tube went away in between
            continue
        if isinstance(result, BaseException):
            raise result
        tubes[name] = result
    return Sample(time.monotonic(), server, tubes)


def _rate(now: Stats, before: Stats | None, key: str, seconds: float) -> float | None:
    if before is None or seconds <= 0:
        return None
    delta = int(now[key]) - int(before[key])
    return delta / seconds if delta >= 0 else None  # negative: the tube was re-created


TOP_COLUMNS = ("ready", "delayed", "reserved", "buried", "waiting", "put/s", "delete/s", "paused")


def top_frame(sample: Sample, previous: Sample | None, address: str) -> dict[str, Any]:
    """The data of one top frame: the server line and a row per tube, with rates per second."""
    seconds = sample.at - previous.at if previous is not None else 0.0
    server, before = sample.server, previous.server if previous is not None else None
    rows = []
    for name, tube in sample.tubes.items():
        old = previous.tubes.get(name) if previous is not None else None
        rows.append({
            "tube": name,
            "ready": tube["current-jobs-ready"],
            "urgent": tube["current-jobs-urgent"],
            "delayed": tube["current-jobs-delayed"],
            "reserved": tube["current-jobs-reserved"],
            "buried": tube["current-jobs-buried"],
            "waiting": tube["current-waiting"],
            "watching": tube["current-watching"],
            "using": tube["current-using"],
            "total_jobs": tube["total-jobs"],
            "put_rate": _rate(tube, old, "total-jobs", seconds),
            "delete_rate": _rate(tube, old, "cmd-delete", seconds),
            "pause_time_left": tube["pause-time-left"],
        })
    return {
        "address": address,
        "version": server.get("version"),
        "uptime": server.get("uptime"),
        "interval": round(seconds, 3) if previous is not None else None,
        "connections": server.get("current-connections"),
        "workers": server.get("current-workers"),
        "waiting": server.get("current-waiting"),
        "total_jobs": server.get("total-jobs"),
        "put_rate": _rate(server, before, "total-jobs", seconds),
        "delete_rate": _rate(server, before, "cmd-delete", seconds),
        "tubes": rows,
    }


def _uptime(seconds: object) -> str:
    total = int(seconds) if isinstance(seconds, int) else 0
    hours, rest = divmod(total, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def _fmt_rate(rate: object) -> str:
    return "-" if not isinstance(rate, float) else f"{rate:.1f}"


def render_top(frame: dict[str, Any]) -> str:
    """A top frame as text: one server line, a header, a row per tube."""
    version = str(frame["version"]).removesuffix("-tubeq")
    server = "tubeq" if str(frame["version"]).endswith("-tubeq") else "beanstalkd"
    lines = [
        f"{frame['address']}  {server} {version}  up {_uptime(frame['uptime'])}  "
        f"{frame['connections']} connections  {frame['workers']} workers  "
        f"{frame['waiting']} waiting  put/s {_fmt_rate(frame['put_rate'])}  "
        f"delete/s {_fmt_rate(frame['delete_rate'])}",
        "",
    ]
    width = max([len("TUBE"), *(len(row["tube"]) for row in frame["tubes"])])
    header = f"{'TUBE':<{width}}" + "".join(f"{name.upper():>10}" for name in TOP_COLUMNS)
    lines.append(header)
    for row in frame["tubes"]:
        paused = f"{row['pause_time_left']}s" if row["pause_time_left"] else "-"
        cells = [row["ready"], row["delayed"], row["reserved"], row["buried"], row["waiting"],
                 _fmt_rate(row["put_rate"]), _fmt_rate(row["delete_rate"]), paused]
        lines.append(f"{row['tube']:<{width}}" + "".join(f"{cell!s:>10}" for cell in cells))
    return "\n".join(lines) + "\n"


async def cmd_top(client: Client, args: argparse.Namespace, out: Output) -> None:
    interval = float(args.interval)
    previous = await take_sample(client)
    if args.once:
        await asyncio.sleep(interval)
        sample = await take_sample(client)
        _draw(out, top_frame(sample, previous, client.address), clear=False)
        return
    clear = out.out.isatty() and not out.json
    _draw(out, top_frame(previous, None, client.address), clear=clear)
    while True:
        await asyncio.sleep(interval)
        sample = await take_sample(client)
        _draw(out, top_frame(sample, previous, client.address), clear=clear)
        previous = sample


def _draw(out: Output, frame: dict[str, Any], *, clear: bool) -> None:
    if out.json:
        out.emit("", frame)
        return
    text = render_top(frame)
    # On a terminal each frame replaces the last; piped, frames follow each other.
    out.out.write(CLEAR + text if clear else text + "\n")
    out.out.flush()


# -- job policies and deduplicated put (tubeq) -------------------------------------------------

PUT_WITH_OPTIONS = ("delay_ms", "max_tries", "backoff_ms", "backoff_max_ms", "ttl_ms",
                    "on_expire", "key", "after", "group")


def _job_ids(text: str) -> list[int]:
    """--after's value: job ids joined by commas."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: job ids joined by commas") from None


async def _put_with(client: Client, args: argparse.Namespace, body: bytes, out: Output) -> None:
    """``put`` with any tubeq option: put-with; a duplicate key is reported, not an error."""
    options = {name: getattr(args, name) for name in PUT_WITH_OPTIONS}
    result = await client.put_with(body, pri=args.pri, delay=args.delay, ttr=args.ttr,
                                   **options)
    data = {"id": result.id, "tube": args.tube, "bytes": len(body), "inserted": result.inserted}
    if result.inserted:
        out.emit(f"inserted job {result.id} into tube {args.tube}", data)
    else:
        out.emit(f"not inserted: job {result.id} already has key {args.key}", data)


async def cmd_call(client: Client, args: argparse.Namespace, out: Output) -> None:
    body = _read_body(args)
    try:
        result = await client.call(args.tube, body, timeout=args.wait, pri=args.pri,
                                   ttr=args.ttr, key=args.key)
    except CallTimedOut as error:
        again = "" if error.job_id is None else f"; tubeq-cli wait {error.job_id} goes on"
        raise CliError(f"no result within {args.wait:g} s{again}") from error
    except JobNotFinished as error:
        raise CliError(_not_finished(error)) from error
    _show_result(out, None, result)


async def cmd_wait(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        end = await client.wait_end(args.id, timeout=args.wait)
    except TimedOut as error:
        raise CliError(f"job {args.id} has not ended within {args.wait:g} s") from error
    except NotFound as error:
        raise CliError(f"job {args.id} not found, and no end of it kept") from error
    if end.how != "finished":
        raise CliError(_not_finished(JobNotFinished(end.id, end.how, end.data)))
    _show_result(out, end.id, end.data)


def _not_finished(error: JobNotFinished) -> str:
    detail = error.data.decode("utf-8", "replace").replace("\n", " / ")
    return f"job {error.job_id} ended {error.how}" + (f": {detail}" if detail else "")


def _show_result(out: Output, job_id: int | None, result: bytes) -> None:
    """A finished job's result: as it is, or in JSON as a body is."""
    if out.json:
        out.emit("", {**({} if job_id is None else {"id": job_id}), "ended": "finished",
                      **_body_json(result)})
    else:
        out.body(result)


async def cmd_peek_key(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        job = await client.peek_key(args.key)
    except NotFound as error:
        raise CliError(f"no living job has key {args.key}") from error
    await _show_job(client, job, out)
async def cmd_put_many(client: Client, args: argparse.Namespace, out: Output) -> None:
    if args.file is None or str(args.file) == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            data = Path(args.file).read_bytes()
        except OSError as error:
            raise CliError(f"cannot read {args.file}: {error.strerror or error}") from error
    bodies = [line.removesuffix(b"\r") for line in data.split(b"\n") if line.strip()]
    await client.use(args.tube)
    results = await client.put_many(bodies, pri=args.pri, delay=args.delay, ttr=args.ttr)
    ids = [r for r in results if isinstance(r, int)]
    refused = [(n, r) for n, r in enumerate(results, 1) if not isinstance(r, int)]
    out.emit("\n".join(f"inserted job {job_id} into tube {args.tube}" for job_id in ids),
             {"tube": args.tube, "ids": ids,
              "refused": [{"line": n, "error": str(r)} for n, r in refused]})
    if refused:
        first_line, first_error = refused[0]
        raise CliError(f"{len(refused)} of {len(results)} jobs refused (line {first_line}: "
                       f"{first_error})")
# -- admin verbs (tubeq only) -------------------------------------------------------------------


async def cmd_clear(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        count = await client.clear_tube(args.tube, args.state)
    except NotFound as error:
        raise CliError(f"tube {args.tube} not found") from error
    which = "" if args.state == "all" else f" {args.state}"
    out.emit(f"cleared {count}{which} job{'s' if count != 1 else ''} from tube {args.tube}",
             {"tube": args.tube, "state": args.state, "cleared": count})


async def cmd_jobs(client: Client, args: argparse.Namespace, out: Output) -> None:
    listed: list[ListedJob] = []
    cursor = str(args.cursor)
    try:
        while True:
            page = await client.list_jobs(args.tube, args.state, cursor=cursor,
                                          count=args.count)
            listed += page.jobs
            cursor = page.cursor
            if page.last or not args.all:
                break
    except NotFound as error:
        raise CliError(f"tube {args.tube} not found") from error
    due = {"delayed": "due_ms", "reserved": "deadline_ms"}.get(args.state)
    rows = [{"id": job.id, "pri": job.pri, **({due: job.due_ms} if due else {})}
            for job in listed]
    now_ms = int(time.time() * 1000)
    lines = []
    for job in listed:
        line = f"{job.id:>10}  pri {job.pri:>10}"
        if job.due_ms is not None:
            left = max(0, job.due_ms - now_ms) / 1000
            line += f"  {'due' if args.state == 'delayed' else 'ttr ends'} in {left:.1f} s"
        lines.append(line)
    if cursor != "0":
        lines.append(f"more: {PROG} jobs {args.tube} --state {args.state} --cursor {cursor}")
    elif not listed:
        lines.append(f"no {args.state} job in tube {args.tube}")
    out.emit("\n".join(lines), {"tube": args.tube, "state": args.state, "jobs": rows,
                                 "cursor": cursor})


async def cmd_change_pri(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        await client.change_pri(args.id, args.pri)
    except NotFound as error:
        raise CliError(f"job {args.id} not found") from error
    out.emit(f"job {args.id} now has priority {args.pri}", {"id": args.id, "pri": args.pri})


async def cmd_change_delay(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        await client.change_delay(args.id, args.ms)
    except NotFound as error:
        raise CliError(f"job {args.id} not found, or not delayed") from error
    text = (f"job {args.id} is ready now" if args.ms == 0
            else f"job {args.id} is due in {args.ms} ms")
    out.emit(text, {"id": args.id, "delay_ms": args.ms})


async def cmd_pause_forever(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        await client.tube_pause(args.tube)
    except NotFound as error:
        raise CliError(f"tube {args.tube} not found") from error
    out.emit(f"paused tube {args.tube} until resumed", {"tube": args.tube, "paused": "forever"})


async def cmd_resume(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        await client.tube_resume(args.tube)
    except NotFound as error:
        raise CliError(f"tube {args.tube} not found") from error
    out.emit(f"resumed tube {args.tube}", {"tube": args.tube, "paused": 0})


async def cmd_quiet(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        await client.quiet(tube=args.tube, conn=args.conn)
    except ValueError as error:
        raise CliError(str(error)) from error
    target = (f"watching tube {args.tube}" if args.tube is not None
              else f"on connection {args.conn}" if args.conn is not None else "all")
    out.emit(f"asked push consumers ({target}) to stop taking jobs",
             {"quieting": "tube" if args.tube is not None
              else "conn" if args.conn is not None else "all",
              **({"tube": args.tube} if args.tube is not None else {}),
              **({"conn": args.conn} if args.conn is not None else {})})


# -- schedule (recurring jobs) -----------------------------------------------------------------


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


async def cmd_schedule(client: Client, args: argparse.Namespace, out: Output) -> None:
    try:
        if args.action == "add":
            body = _read_body(args)
            first = await client.schedule_add(args.tube, args.name, body, cron=args.cron,
                                              every_ms=args.every_ms, pri=args.pri,
                                              ttr=args.ttr, delay_ms=args.delay_ms)
            out.emit(f"schedule {args.name} of tube {args.tube} first ticks at {_utc(first)}",
                     {"tube": args.tube, "name": args.name, "next_ms": first})
        elif args.action == "list":
            rows = await client.schedule_list(args.tube)
            lines = [f"{r.name}  {f'cron {r.cron}' if r.cron else f'every {r.every_ms} ms'}"
                     f"  next {_utc(r.next_ms)}  ticks {r.ticks}  last job {r.last_job or '-'}"
                     for r in rows]
            out.emit("\n".join(lines), [dataclasses.asdict(r) for r in rows])
        else:
            await client.schedule_remove(args.tube, args.name)
            out.emit(f"removed schedule {args.name} of tube {args.tube}",
                     {"tube": args.tube, "name": args.name, "removed": True})
    except BadOption as error:
        what = "cron expression" if error.option == "cron" else f"--{error.option}"
        raise UsageError(f"the server refused the {what}") from error
    except NotFound as error:
        raise CliError(f"tube {args.tube} has no schedule {args.name}") from error


COMMANDS: dict[str, Command] = {
    "put": cmd_put,
    "peek": cmd_peek,
    "kick": cmd_kick,
    "kick-job": cmd_kick_job,
    "bury": cmd_bury,
    "delete": cmd_delete,
    "pause": cmd_pause,
    "stats": cmd_stats,
    "list": cmd_list,
    "list-tubes": cmd_list,
    "top": cmd_top,
    "peek-key": cmd_peek_key,  # tubeq
    "call": cmd_call,  # jobs that answer (tubeq)
    "wait": cmd_wait,
    "put-many": cmd_put_many,  # batches
    # admin verbs (tubeq only)
    "clear": cmd_clear,
    "jobs": cmd_jobs,
    "change-pri": cmd_change_pri,
    "change-delay": cmd_change_delay,
    "pause-forever": cmd_pause_forever,
    "resume": cmd_resume,
    "quiet": cmd_quiet,  # quiet shutdowns
    "schedule": cmd_schedule,
}


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    client = Client(args.host, args.port, connect_timeout=args.timeout, reconnect=False)
    try:
        await client.connect()
        await COMMANDS[args.command](client, args, Output(json=args.json))
    finally:
        await client.aclose()


def _fail(status: int, message: str) -> int:
    sys.stdout.flush()
    sys.stderr.write(f"{PROG}: {message}\n")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``tubeq-cli`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        asyncio.run(run(args))
    except KeyboardInterrupt:
        return 0 if args.command == "top" else 130
    except (UsageError, ValueError) as error:
        return _fail(EXIT_USAGE, f"error: {error}")
    except CliError as error:
        return _fail(EXIT_FAILURE, str(error))
    except ClientConnectionError as error:
        return _fail(EXIT_FAILURE, str(error))
    except BadFormat as error:
        return _fail(EXIT_USAGE, f"error: the server rejected {error.command} as malformed "
                                 f"(BAD_FORMAT): check the tube name")
    except CommandError as error:
        return _fail(EXIT_FAILURE, f"{args.host}:{args.port} answered {error}")
    except ClientError as error:
        return _fail(EXIT_FAILURE, f"{args.host}:{args.port}: {error}")
    except BrokenPipeError:  # `tubeq-cli top | head`
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
