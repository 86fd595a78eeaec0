"""The JSON API: jobs and tubes over HTTP, in the style of lmstfy and camellia.

Every route runs the same store call, so the same Lua script, as the protocol command it
mirrors, and counts the ``cmd-*`` counter of that one command (``stats`` shows HTTP puts as
puts; no ``use`` or ``watch`` is counted, as no connection changed its tubes: protocol.md's
route table has a "counts" column, which a test holds to this code). Routes,
bodies and replies are documented in protocol.md ("HTTP API"), each with a curl example.

Input: a route's options come from the query string or from a JSON object body (a put with a
raw body takes its options from the query string). Options are looked up in one table per
route (``PUT_OPTIONS``...), so a later option (max-tries, ttl-ms, a dedupe key) is a new row
and a new check, and an unknown or misspelt one is a 400 today rather than silently ignored.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any, Final, NoReturn, TypeVar

from aiohttp import web

from tubeq.http.common import (
    Handler,
    HttpError,
    QueryValue,
    body_fields,
    job_id,
    namespace_of,
    read_options,
    server_of,
    tube_name,
    unsigned,
)
from tubeq.http.reservations import MAX_POLL_S, HttpReservations
from tubeq.model import options as job_options
from tubeq.protocol import replies
from tubeq.server import ops
from tubeq.server.context import ServerContext
from tubeq.server.handlers import TUBE_POLICY_COUNTERS
from tubeq.server.process import Server
from tubeq.server.stats import job_pairs, server_pairs, tube_pairs
from tubeq.store.records import CANCELLED, HANDED_BACK_EXPIRED, JobEnd, JobInfo, Progress

# Defaults of a put with no options, as pheanstalk has them: 1024 is the first priority that
# is not "urgent" (stats' current-jobs-urgent counts pri < 1024); a TTR of 60 s.
DEFAULT_PRI: Final = 1024
DEFAULT_TTR: Final = 60
# The most jobs a job list returns in one state.
MAX_LIST: Final = 200
STATES: Final = ("ready", "delayed", "buried", "reserved", "held")

# put's own three, and put-with's options (tubeq.model.options.PUT_OPTIONS: delay-ms, max-tries,
# backoff-ms, backoff-max-ms, ttl-ms, on-expire, key) under the same names.
PUT_OPTIONS: Final = frozenset({"pri", "delay", "ttr", *job_options.PUT_OPTIONS})
PUT_JSON_KEYS: Final = PUT_OPTIONS | {"body", "body_base64"}
RESERVE_OPTIONS: Final = frozenset({"timeout"})
RESULT_OPTIONS: Final = frozenset({"wait-ms", "progress"})  # the result long poll
RELEASE_OPTIONS: Final = frozenset({"reservation", "pri", "delay"})
BURY_OPTIONS: Final = frozenset({"reservation", "pri"})
OWNER_OPTIONS: Final = frozenset({"reservation"})
QUIET_OPTIONS: Final = frozenset({"tube", "conn"})
KICK_OPTIONS: Final = frozenset({"bound"})
PAUSE_OPTIONS: Final = frozenset({"delay"})
LIST_OPTIONS: Final = frozenset({"state", "limit"})

# One registry of HTTP reservations per namespace context, by its key root.
T = TypeVar("T")

RESERVATIONS: Final = web.AppKey("reservations", dict[str, HttpReservations])


def add_routes(app: web.Application, server: Server) -> None:
    assert server.ctx is not None
    app[RESERVATIONS] = {ctx.store.keys.root: HttpReservations(ctx)
                         for ctx in server.namespaces.values()}
    app.router.add_post("/api/tubes/{tube}/jobs", put)
    app.router.add_get("/api/tubes/{tube}/jobs", list_jobs)
    app.router.add_get("/api/tubes", _taking_no_options(tubes))
    app.router.add_get("/api/tubes/{tube}", _taking_no_options(stats_tube))
    app.router.add_get("/api/tubes/{tube}/peek/{state}", _taking_no_options(peek_state))
    app.router.add_post("/api/tubes/{tube}/kick", kick)
    app.router.add_post("/api/tubes/{tube}/pause", pause)
    app.router.add_post("/api/tubes/{tubes}/reserve", reserve)
    app.router.add_get("/api/jobs/{id}", _taking_no_options(job))
    app.router.add_get("/api/jobs/{id}/result", result)
    app.router.add_delete("/api/jobs/{id}", delete)
    app.router.add_post("/api/jobs/{id}/kick", kick_job)
    app.router.add_post("/api/jobs/{id}/release", release)
    app.router.add_post("/api/jobs/{id}/bury", bury)
    app.router.add_post("/api/jobs/{id}/touch", touch)
    app.router.add_post("/api/jobs/{id}/hand-back", hand_back)
    app.router.add_post("/api/quiet", quiet)
    app.router.add_get("/api/stats", _taking_no_options(stats))
    app.router.add_get("/api/servers", _taking_no_options(servers))


def _taking_no_options(route: Handler) -> Handler:
    """A route that takes no option: any query parameter but the token is a 400, as on the
    routes that take some (after the token is checked, so no token is still a 401)."""
    async def checked(request: web.Request) -> web.StreamResponse:
        namespace_of(request)
        await read_options(request, frozenset(), json_body=False)
        return await route(request)

    return checked


def _ctx(request: web.Request) -> ServerContext:
    return namespace_of(request)


def _outcome(request: web.Request, command: str, reply: bytes) -> None:
    """Count the outcome as the protocol reply it mirrors (tubeq_command_outcomes_total, and
    the release/bury/kick counts derived from it), so HTTP clients count as protocol ones."""
    metrics = server_of(request).metrics
    if metrics is not None:
        metrics.answered(command, reply)


# -- jobs -------------------------------------------------------------------------------------

async def put(request: web.Request) -> web.Response:
    """put: a job from a raw body (options in the query) or a JSON object."""
    ctx = _ctx(request)
    tube = tube_name(request.match_info["tube"])
    body: bytes | None
    if request.content_type == "application/json":
        options = await read_options(request, PUT_JSON_KEYS)
        body = _json_job_body(options)
    else:
        options = await read_options(request, PUT_OPTIONS, json_body=False)
        body = await _raw_body(request, ctx.max_job_size)
    pri = unsigned("pri", options.get("pri", DEFAULT_PRI))
    delay = unsigned("delay", options.get("delay", 0))
    ttr = unsigned("ttr", options.get("ttr", DEFAULT_TTR))
    ctx.counters.incr("put")
    if body is None or len(body) > ctx.max_job_size:
        size = len(body) if body is not None else request.content_length
        told = f"{size} bytes" if size is not None else "more bytes"
        raise HttpError(413, f"job body too big: {told}, at most {ctx.max_job_size}")
    extras = _traced(request, _put_with_options(options))
    if extras:
        opts = dict(extras)
        if delay and "delay-ms" in opts:
            raise HttpError(400, "give the delay as one of 'delay' (s) and 'delay-ms'")
        if "wait-ms" in opts:  # request/reply, as the protocol's put-with wait-ms
            wait_ms = unsigned("wait-ms", opts["wait-ms"], MAX_POLL_S * 1000)
            _, put, waited = ops.put_and_wait(ctx, tube, pri, delay, ttr, body, extras, wait_ms)
            end = await waited
            outcome = put.result()
            if isinstance(end, JobEnd):
                return web.json_response({"id": outcome.id, "tube": tube, "ended": end.how,
                                          **_end_data(end.data)})
        else:
            outcome = await ops.put_with(ctx, tube, pri, delay, ttr, body, extras)
        if outcome.unknown_parent:
            raise HttpError(422, f"after: job {outcome.unknown_parent} is unknown (never put, "
                                 f"or ended without a kept end)")
        if outcome.id > 0 and not outcome.inserted:
            return web.json_response({"id": outcome.id, "tube": tube, "duplicate": True})
        new_id = outcome.id
        delayed = int(opts.get("delay-ms", delay * 1000)) > 0
        if "after" in opts and new_id > 0:  # held, or buried or free at once: as it is now
            info = await ctx.store.job_info(new_id)
            _outcome(request, "put", replies.inserted(new_id))
            return web.json_response({"id": new_id, "tube": tube,
                                      "state": info.state if info else "gone"}, status=201)
    else:
        new_id = await _settled(ops.put(ctx, tube, pri, delay, ttr, body, int))
        delayed = delay > 0
    if new_id <= 0:
        _refuse_put(new_id, tube)
    _outcome(request, "put", replies.inserted(new_id))
    return web.json_response({"id": new_id, "tube": tube,
                              "state": "delayed" if delayed else "ready"}, status=201)


def _traced(request: web.Request, extras: job_options.Options) -> job_options.Options:
    """A put's options with the request's W3C ``traceparent`` header as the job's context
    (an instrumented HTTP client sends its span's), unless the option gives one. A header that
    is not a valid traceparent is ignored, as W3C Trace Context says a receiver does (the
    option, a client's deliberate choice, is checked: 400)."""
    header = request.headers.get("traceparent")
    if header is None or any(name == "traceparent" for name, _ in extras):
        return extras
    value = job_options.PUT_OPTIONS["traceparent"].convert(header.strip().encode("latin-1"))
    return extras if value is None else (*extras, ("traceparent", value))


def _end_data(data: bytes) -> dict[str, Any]:
    """A job end's data (its result, or why it was buried) in JSON, as a body is."""
    fields = body_fields(data)
    return {"data": fields["body"], "data_base64": fields["body_base64"]}


def _refuse_put(refusal: int, tube: str) -> NoReturn:
    if refusal == ops.DRAINING:
        raise HttpError(503, "draining: this server takes no new jobs")
    if refusal == ops.NAMESPACE_FULL:
        raise HttpError(507, "the namespace is full (--max-jobs)")
    raise HttpError(507, f"tube {tube} is full (its max-jobs setting)")


async def _settled(result: T | asyncio.Future[T]) -> T:
    """An operation's outcome, whether it was known at once or a store call was needed."""
    return await result if isinstance(result, asyncio.Future) else result


async def _raw_body(request: web.Request, limit: int) -> bytes | None:
    """A raw put's body, or None when it is longer than ``limit``: no more than ``limit + 1``
    bytes of it are read (aiohttp drops the rest with the connection)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    body = bytearray()
    while len(body) <= limit:
        chunk = await request.content.read(limit + 1 - len(body))
        if not chunk:
            return bytes(body)
        body += chunk
    return None


def _put_with_options(options: dict[str, Any]) -> job_options.Options:
    """put-with's options among a put's, checked as the protocol checks them (a 400 names a
    refused one), in tubeq.model.options's order. In JSON a number is a JSON number and a
    word or key a JSON string; the query spells both as text."""
    parsed: list[tuple[str, job_options.OptionValue]] = []
    for name, spec in job_options.PUT_OPTIONS.items():
        if name in options:
            given = options[name]
            if spec.ids and isinstance(given, list) and all(type(i) is int for i in given):
                given = ",".join(map(str, given))  # after: a JSON list of ids, or "1,2,3"
            textual = (spec.key or bool(spec.choices) or spec.ids or spec.tube
                       or spec.traceparent)
            if not (isinstance(given, QueryValue) or (
                    isinstance(given, str) if textual else type(given) is int)):
                raise HttpError(400, f"bad value for option '{name}' (a JSON "
                                     f"{'string' if textual else 'number'})")
            value = spec.convert(str(given).encode("utf-8", "replace"))
            if value is None:
                raise HttpError(400, f"bad value for option '{name}'")
            parsed.append((name, value))
    return tuple(parsed)


def _json_job_body(options: dict[str, Any]) -> bytes:
    text, encoded = options.pop("body", None), options.pop("body_base64", None)
    if (text is None) == (encoded is None):
        raise HttpError(400, "give the job's body as exactly one of 'body' (text) and "
                             "'body_base64'")
    if text is not None:
        if not isinstance(text, str):
            raise HttpError(400, "'body' must be a string")
        return text.encode()
    if not isinstance(encoded, str):
        raise HttpError(400, "'body_base64' must be a string")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise HttpError(400, "'body_base64' is not valid base64") from None


def _job_json(info: JobInfo, body: bytes | None, now_ms: int) -> dict[str, Any]:
    out: dict[str, Any] = dict(job_pairs(info, now_ms))
    del out["file"]  # beanstalkd's binlog file number: always 0 here
    if body is not None:
        out.update(body_fields(body))
    return out


async def job(request: web.Request) -> web.Response:
    """peek + stats-job: a job's stats and body; a job gone, how it ended (its end kept)."""
    ctx = _ctx(request)
    jid = job_id(request.match_info["id"])
    ctx.counters.incr("stats-job")
    return web.json_response(await job_document(ctx, jid))


async def job_document(ctx: ServerContext, jid: int) -> dict[str, Any]:
    """Job ``jid`` in JSON (the API's job route and the dashboard's job page): a living job's
    stats-job fields, body, ``failures`` and ``error``; a job gone whose end is kept (a
    finish's always, for --result-ttl; another end when a wait marked the job) ``{"id",
    "ended", "data", "data_base64"}`` as the result route answers; else a 404.

    The reads mark nothing. wait.lua marks a *living* job (its end is then kept and
    published), so the end is read only once the job's own record is gone, and ids are never
    used twice: a job gone stays gone. The one race left is an id read just before its put:
    the job is then born between the reads, wait.lua marks it with a keep of 0 (its end, but
    a finish's, is dropped as soon as it is written) and this answers the 404 it would have
    answered a moment earlier."""
    store = ctx.store
    # Sent together (one round trip), each a plain read of the job's hash.
    info, body, policies = await asyncio.gather(store.job_info(jid), store.peek(jid),
                                                store.job_policies(jid))
    if info is None or body is None or policies is None:
        end = await store.wait_end(jid, 0)
        if not isinstance(end, JobEnd):
            raise HttpError(404, f"job {jid} not found, and no end of it kept")
        return {"id": jid, "ended": end.how, **_end_data(end.data)}
    out = _job_json(info, body, store.clock())
    # fail's count and last error (stats-job's extra keys)
    out["failures"] = policies.failures
    out["error"] = policies.error.decode("utf-8", "replace")
    # progress (the latest report, as a body is given) and a held job's parents to come
    out["progress_reports"] = policies.progress_seq
    progress = body_fields(policies.progress)
    out["progress"], out["progress_base64"] = progress["body"], progress["body_base64"]
    out["parents_pending"] = policies.parents_pending
    out["traceparent"] = policies.traceparent  # put-with traceparent=, or ""
    return out


async def result(request: web.Request) -> web.Response:
    """wait: how a job ended (its result when finished), a long poll of up to ``wait-ms``."""
    ctx = _ctx(request)
    jid = job_id(request.match_info["id"])
    options = await read_options(request, RESULT_OPTIONS, json_body=False)
    wait_ms = unsigned("wait-ms", options.get("wait-ms", 0), MAX_POLL_S * 1000)
    after = options.get("progress")
    _, outcome = ops.wait_for_end(ctx, jid, wait_ms,
                                  None if after is None else unsigned("progress", after))
    end = await outcome
    if end is None:
        return web.Response(status=204)  # not ended in time, as a long poll's reserve
    if isinstance(end, Progress):
        return web.json_response({"id": jid, "progress": end.seq, **_end_data(end.data)})
    if not isinstance(end, JobEnd):
        raise HttpError(404, f"job {jid} not found, and no end of it kept")
    return web.json_response({"id": jid, "ended": end.how, **_end_data(end.data)})


async def delete(request: web.Request) -> web.Response:
    """delete: any job not reserved; a reserved one only with its reservation token."""
    ctx = _ctx(request)
    jid = job_id(request.match_info["id"])
    options = await read_options(request, OWNER_OPTIONS, json_body=False)
    ctx.counters.incr("delete")
    token = _reservation(options, required=False)
    deleted = await ops.delete(ctx, token, jid, bool)
    _outcome(request, "delete", replies.DELETED if deleted else replies.NOT_FOUND)
    if not deleted:
        raise HttpError(404, f"job {jid} not found (or reserved under another reservation)")
    _reservation_ended(ctx, token, jid, "deleted")
    return web.json_response({"deleted": jid})


async def kick_job(request: web.Request) -> web.Response:
    """kick-job: a buried or delayed job to ready."""
    ctx = _ctx(request)
    jid = job_id(request.match_info["id"])
    await read_options(request, frozenset())
    kicked = await ops.kick_job(ctx, jid)
    _outcome(request, "kick-job", replies.KICKED if kicked else replies.NOT_FOUND)
    if not kicked:
        raise HttpError(404, f"job {jid} not found, or neither buried nor delayed")
    return web.json_response({"kicked": jid})


async def release(request: web.Request) -> web.Response:
    """release: a job this reservation holds back to ready (or delayed)."""
    ctx = _ctx(request)
    jid = job_id(request.match_info["id"])
    options = await read_options(request, RELEASE_OPTIONS)
    token = _reservation(options)
    delay = unsigned("delay", options.get("delay", 0))
    pri = await _priority(ctx, jid, options)
    ctx.counters.incr("release")
    released = await ops.release(ctx, token, jid, pri, delay)
    _outcome(request, "release", replies.RELEASED if released else replies.NOT_FOUND)
    if not released:
        raise HttpError(404, f"job {jid} is not reserved under this reservation")
    _reservation_ended(ctx, token, jid, "released")
    return web.json_response({"released": jid, "state": "delayed" if delay else "ready"})


async def bury(request: web.Request) -> web.Response:
    """bury: a job this reservation holds, put aside."""
    ctx = _ctx(request)
    jid = job_id(request.match_info["id"])
    options = await read_options(request, BURY_OPTIONS)
    token = _reservation(options)
    pri = await _priority(ctx, jid, options)
    ctx.counters.incr("bury")
    buried = await ops.bury(ctx, token, jid, pri)
    _outcome(request, "bury", replies.BURIED if buried else replies.NOT_FOUND)
    if not buried:
        raise HttpError(404, f"job {jid} is not reserved under this reservation")
    _reservation_ended(ctx, token, jid, "buried")
    return web.json_response({"buried": jid})


async def touch(request: web.Request) -> web.Response:
    """touch: a full TTR again from now."""
    ctx = _ctx(request)
    jid = job_id(request.match_info["id"])
    token = _reservation(await read_options(request, OWNER_OPTIONS))
    ctx.counters.incr("touch")
    deadline = await ops.touch(ctx, token, jid)
    _outcome(request, "touch", replies.TOUCHED if deadline else replies.NOT_FOUND)
    if not deadline:
        raise HttpError(404, f"job {jid} is not reserved under this reservation")
    if ctx.tracer is not None:
        ctx.tracer.moved(token, jid, deadline)
    return web.json_response({"touched": jid, "deadline_ms": deadline})


async def hand_back(request: web.Request) -> web.Response:
    """hand-back: a job this reservation holds back to ready at once, its try not counted."""
    ctx = _ctx(request)
    jid = job_id(request.match_info["id"])
    token = _reservation(await read_options(request, OWNER_OPTIONS))
    done = await ops.hand_back(ctx, token, jid)
    if done == CANCELLED:
        _outcome(request, "hand-back", replies.CANCELLED)
        _reservation_ended(ctx, token, jid, "cancelled")
        raise HttpError(410, f"job {jid} was cancelled: it is gone")
    _outcome(request, "hand-back", replies.RELEASED if done else replies.NOT_FOUND)
    if not done:
        raise HttpError(404, f"job {jid} is not reserved under this reservation")
    _reservation_ended(ctx, token, jid, "hand-back")
    return web.json_response({"handed_back": jid,
                              "state": "expired" if done == HANDED_BACK_EXPIRED else "ready"})


async def quiet(request: web.Request) -> web.Response:
    """quiet: push consumers (all, those watching ``tube``, or connection ``conn``) stop
    taking jobs, on every process."""
    ctx = _ctx(request)
    options = await read_options(request, QUIET_OPTIONS)
    if len(options) > 1:
        raise HttpError(400, "give 'tube' or 'conn', or neither (all)")
    scope, target = next(iter(options.items()), ("all", ""))
    if scope != "all" and (not isinstance(target, str) or not target or " " in target):
        raise HttpError(400, f"'{scope}' must be a name without spaces")
    if scope == "tube":
        target = tube_name(target)
    await ops.quiet(ctx, scope, target)
    return web.json_response({"quieting": scope, **({scope: target} if target else {})},
                             status=202)


def _reservation_ended(ctx: ServerContext, token: str, jid: int, how: str) -> None:
    """An HTTP reservation's job settled ``how``: its span ends (tubeq.server.tracing), as a
    connection's settle ends it (Connection.settled); ``token`` "": none (a job not reserved)."""
    if ctx.tracer is not None and token:
        ctx.tracer.ended(token, (jid,), how)


def _reservation(options: dict[str, Any], *, required: bool = True) -> str:
    token = options.get("reservation")
    if token is None and not required:
        return ""  # no owner: deletes only jobs that are not reserved
    if not isinstance(token, str) or not token:
        raise HttpError(400, "'reservation' (the token a reserve returned) is required")
    return token


async def _priority(ctx: ServerContext, jid: int, options: dict[str, Any]) -> int:
    """The ``pri`` option, or the job's own priority when none is given."""
    if "pri" in options:
        return unsigned("pri", options["pri"])
    info = await ctx.store.job_info(jid)
    if info is None:
        raise HttpError(404, f"job {jid} not found")
    return int(info.pri)


# -- consuming --------------------------------------------------------------------------------

async def reserve(request: web.Request) -> web.StreamResponse:
    """reserve-with-timeout over one or more tubes (comma separated): a long poll."""
    ctx = _ctx(request)
    names = request.match_info["tubes"].split(",")
    tubes = tuple(dict.fromkeys(tube_name(t) for t in names))
    if 0 < ctx.max_watch < len(tubes):
        raise HttpError(400, f"at most {ctx.max_watch} tubes (--max-watch), not {len(tubes)}")
    options = await read_options(request, RESERVE_OPTIONS)
    timeout = unsigned("timeout", options.get("timeout", 0), MAX_POLL_S)
    ctx.counters.incr("reserve-with-timeout")
    got = await request.app[RESERVATIONS][ctx.store.keys.root].reserve(tubes, timeout)
    if got is None:
        _outcome(request, "reserve-with-timeout", replies.TIMED_OUT)
        return web.Response(status=204)
    token, job_ = got
    _outcome(request, "reserve-with-timeout", b"RESERVED %d\r\n" % job_.id)
    return web.json_response({
        "id": job_.id, "tube": job_.tube, "ttr": job_.ttr, "reservation": token,
        "deadline_ms": job_.deadline_ms, **body_fields(job_.body)})


# -- tubes ------------------------------------------------------------------------------------

async def tubes(request: web.Request) -> web.Response:
    """Every tube with its counts (and this process's wait and run times, for the dashboard)."""
    server = server_of(request)
    ctx = _ctx(request)
    # Not counted as list-tubes: the dashboard polls it every second, and cmd-list-tubes
    # should keep counting what clients ask.
    count, rows = await ops.tube_overview(ctx, server.config.metrics_max_tubes)
    ends = await tube_ends(ctx, [row.name for row in rows])
    now = ctx.store.clock()
    metrics = server.metrics
    out = []
    for row in rows:
        finished, failed = ends.get(row.name, (None, None))
        item: dict[str, Any] = {
            "name": row.name, "urgent": row.urgent, "ready": row.ready,
            "reserved": row.reserved, "delayed": row.delayed, "buried": row.buried,
            "total_jobs": row.total, "deletes": row.deletes, "finished": finished,
            "failed": failed, "paused": row.pause_until_ms > now, "waiting": row.waiting,
            "watching": row.watching, "using": row.using}
        if metrics is not None:
            for key, family in (("wait", metrics.wait), ("run", metrics.held)):
                h = family.by_tube.get(row.name)
                item[key] = {"count": h.count if h else 0, "sum_s": h.sum if h else 0.0}
        out.append(item)
    if rows and rows[-1].name == "":  # the tubes past the cap, summed: their jobs only
        out[-1].update(name=None, deletes=None, paused=None, waiting=None, watching=None,
                       using=None)
    return web.json_response({"count": count, "tubes": out, "time_ms": now})


async def stats_tube(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    tube = tube_name(request.match_info["tube"])
    ctx.counters.incr("stats-tube")
    ops.sync_counts(ctx)
    counts, policy_counts, groups = await asyncio.gather(
        _tube_counts(ctx, tube), ctx.store.tube_policy_counts(tube), ctx.store.tube_groups(tube))
    out: dict[str, Any] = dict(tube_pairs(tube, counts, ctx.store.clock()))
    # stats-tube's extra counters (total-expired ... total-finished, total-failed)
    out.update(zip(TUBE_POLICY_COUNTERS, policy_counts, strict=True))
    # its groups (put-with group=): how many have ready jobs, the busiest first
    out["groups"] = groups.count
    out["groups_busiest"] = [{"group": g.group, "ready": g.ready, "reserved": g.reserved}
                             for g in groups.busiest]
    return web.json_response(out)


async def tube_ends(ctx: ServerContext, names: list[str]) -> dict[str, tuple[int, int]]:
    """Each named tube's jobs finished and failures reported (stats-tube's total-finished and
    total-failed), one read per tube sent at once; "" (the summed row of the tubes past the
    cap) is left out: their counters are not summed anywhere."""
    named = [name for name in names if name]
    reads = await asyncio.gather(*(ctx.store.tube_policy_counts(name) for name in named))
    ends = {}
    for name, read in zip(named, reads, strict=True):
        counts = dict(zip(TUBE_POLICY_COUNTERS, read, strict=True))
        ends[name] = (counts["total-finished"], counts["total-failed"])
    return ends


async def _tube_counts(ctx: ServerContext, tube: str) -> list[int]:
    ops.sync_using(ctx)
    counts: list[int] | None = await ctx.store.tube_counts(tube)
    if counts is None:
        raise HttpError(404, f"tube {tube!r} not found")
    return counts


async def list_jobs(request: web.Request) -> web.Response:
    """The first jobs of a tube in one state (body truncated to 200 bytes)."""
    ctx = _ctx(request)
    tube = tube_name(request.match_info["tube"])
    options = await read_options(request, LIST_OPTIONS, json_body=False)
    state = options.get("state", "ready")
    if state not in STATES:
        raise HttpError(400, f"state must be one of {', '.join(STATES)}")
    # At least 1: a page of none is surely a mistake (the protocol's list-jobs refuses a count
    # of 0 too), and browse.lua's ZRANGE 0 -1 would return every job in the state.
    limit = unsigned("limit", options.get("limit", 20), MAX_LIST, minimum=1)
    await _tube_counts(ctx, tube)
    now = ctx.store.clock()
    jobs = await ctx.store.browse(tube, state, limit)
    return web.json_response({"tube": tube, "state": state, "jobs": [
        {"id": j.id, "pri": j.pri, "age": (now - j.created_ms) // 1000,
         "time_left": max(0, (j.due_ms - now) // 1000) if j.due_ms else 0,
         "reserves": j.reserves, **body_fields(j.body_head)} for j in jobs]})


async def peek_state(request: web.Request) -> web.Response:
    """peek-ready / peek-delayed / peek-buried of a tube."""
    ctx = _ctx(request)
    tube = tube_name(request.match_info["tube"])
    state = request.match_info["state"]
    if state not in STATES[:3]:
        raise HttpError(400, "state must be one of ready, delayed, buried")
    ctx.counters.incr(f"peek-{state}")
    found = await ctx.store.peek_state(state, tube)
    if found is None:
        raise HttpError(404, f"no {state} job in tube {tube!r}")
    return web.json_response({"id": found[0], "tube": tube, **body_fields(found[1])})


async def kick(request: web.Request) -> web.Response:
    """kick: up to ``bound`` buried jobs (or, with none buried, delayed ones) to ready."""
    ctx = _ctx(request)
    tube = tube_name(request.match_info["tube"])
    options = await read_options(request, KICK_OPTIONS)
    bound = unsigned("bound", options.get("bound", 1))
    ctx.counters.incr("kick")
    kicked = await ops.kick(ctx, tube, bound)
    _outcome(request, "kick", replies.kicked(kicked))
    return web.json_response({"kicked": kicked})


async def pause(request: web.Request) -> web.Response:
    """pause-tube: no reserves from the tube for ``delay`` seconds (0 resumes)."""
    ctx = _ctx(request)
    tube = tube_name(request.match_info["tube"])
    options = await read_options(request, PAUSE_OPTIONS)
    if "delay" not in options:
        raise HttpError(400, "'delay' (seconds; 0 resumes) is required")
    delay = unsigned("delay", options["delay"])
    ctx.counters.incr("pause-tube")
    until = await ops.pause(ctx, tube, delay)
    if until == 0:
        raise HttpError(404, f"tube {tube!r} not found")
    return web.json_response({"paused": tube, "delay": delay})


# -- the server -------------------------------------------------------------------------------

async def stats(request: web.Request) -> web.Response:
    """stats: the namespace's counts and this process's identity, as the YAML has them."""
    ctx = _ctx(request)
    ctx.counters.incr("stats")
    gauges, named = await ops.namespace_counts(ctx)
    return web.json_response(dict(server_pairs(ctx.identity, gauges, named, ctx.draining)))


async def servers(request: web.Request) -> web.Response:
    """The tubeq processes of the namespace (the instances registry)."""
    server = server_of(request)
    ctx = _ctx(request)
    now = ctx.store.clock()
    return web.json_response({"servers": [
        {"id": i.id, "self": i.id == server.instance_id, "addr": i.addr, "http": i.http,
         "heartbeat_age_ms": max(0, now - i.heartbeat_ms), "connections": i.connections,
         "producers": i.producers, "workers": i.workers, "waiting": i.waiting}
        for i in await ctx.store.instances()]})
