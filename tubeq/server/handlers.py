"""The command handlers: one function per command, each returning its reply.

A handler gets the connection (as a :class:`~tubeq.server.context.Session`: the members it may
touch) and the parsed command and returns the reply bytes, or a future
of them when the store is involved (a Redis call in flight), or ``None`` for quit and for
a put-many's parts before its last (its one reply comes with the last). It reads
and updates the connection's own state (used tube, watch list, held jobs) and calls the store;
ordering and blocking are the connection's reserve queue's (tubeq.server.reserves), writing
the connection's own (tubeq.server.connection).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Final, TypeAlias

import structlog

from tubeq.model import admin, recurring
from tubeq.protocol import commands as c
from tubeq.protocol import replies
from tubeq.protocol.grammar import EXTENSION_NAMES
from tubeq.redisio.client import ran
from tubeq.redisio.futures import SentLater, discard, then
from tubeq.server import ops
from tubeq.server.context import Reply, ServerContext, Session
from tubeq.server.runs import joins_calls
from tubeq.server.scheduler import DELAYED, TICK
from tubeq.server.stats import job_policy_keys, job_yaml, server_yaml, tube_yaml, yaml_list
from tubeq.store.records import (
    CANCELLED,
    Failed,
    JobEnd,
    NoJob,
    Progress,
    PutOutcome,
    Reservation,
)

log = structlog.get_logger(__name__)


def _put(conn: Session, cmd: c.Put) -> Reply:
    conn.mark_producer()
    return ops.put(conn.ctx, conn.used, cmd.pri, cmd.delay, cmd.ttr, cmd.body, _put_reply,
                   run=conn.puts)


def _put_reply(job_id: int) -> bytes:
    return b"INSERTED %d\r\n" % job_id if job_id > 0 else _PUT_REFUSED[job_id]


# What a refused put answers (tubeq.server.ops's refusals).
_PUT_REFUSED: dict[int, bytes] = {
    ops.TUBE_FULL: replies.OUT_OF_MEMORY,
    ops.NAMESPACE_FULL: replies.OUT_OF_MEMORY,
    ops.DRAINING: replies.DRAINING,
}


def _put_expected_crlf(conn: Session, cmd: c.PutExpectedCrlf) -> Reply:
    conn.mark_producer()
    return then(conn.store.burn_id(conn.used), lambda _: replies.EXPECTED_CRLF)


def _put_too_big(conn: Session, cmd: c.PutTooBig) -> Reply:
    return replies.JOB_TOO_BIG


def _rejected(conn: Session, cmd: c.Rejected) -> Reply:
    if cmd.counted_as is not None:
        conn.ctx.counters.incr(cmd.counted_as)
    return cmd.reply


def _use(conn: Session, cmd: c.Use) -> Reply:
    reply = replies.using(cmd.tube)
    if cmd.tube == conn.used:
        return reply
    using = conn.ctx.using
    using.release(conn.used)
    conn.used = cmd.tube
    in_redis = using.acquire(cmd.tube)  # None: this process already holds the tube
    return reply if in_redis is None else then(in_redis, lambda _: reply)


def _watch(conn: Session, cmd: c.Watch) -> Reply:
    if cmd.tube in conn.watched:
        return replies.watching(len(conn.watched))
    if 0 < conn.ctx.max_watch <= len(conn.watched):  # --max-watch: the list is unchanged
        return replies.OUT_OF_MEMORY
    conn.watched = (*conn.watched, cmd.tube)
    conn.watches_changed()
    conn.ctx.using.watch(cmd.tube, 1)
    count = len(conn.watched)
    changed = conn.store.change_watches(conn.token, [("+w", cmd.tube)])
    changed.add_done_callback(lambda f: _undo_watch(conn, f, cmd.tube, added=True))
    return then(changed, lambda _: replies.watching(count))


def _undo_watch(conn: Session, change: asyncio.Future[Any], tube: str, *,
                added: bool) -> None:
    """A watch (``added``) or ignore that Redis did not take (the client got INTERNAL_ERROR):
    the connection's list is put back, so a retry goes to Redis again instead of being
    answered from this list."""
    if change.cancelled() or change.exception() is None:
        return
    if added and tube in conn.watched:
        conn.watched = tuple(t for t in conn.watched if t != tube)
        conn.ctx.using.watch(tube, -1)
    elif not added and tube not in conn.watched:
        conn.watched = (*conn.watched, tube)
        conn.ctx.using.watch(tube, 1)
    conn.watches_changed()
    conn.store.forget_watch_change(conn.token, tube, added=added)


def _ignore(conn: Session, cmd: c.Ignore) -> Reply:
    watched = conn.watched
    if cmd.tube not in watched:
        return replies.watching(len(watched))
    if len(watched) == 1:
        return replies.NOT_IGNORED
    # beanstalkd keeps the watch list as an array and fills a hole with the last entry.
    rest = list(watched)
    rest[rest.index(cmd.tube)] = rest[-1]
    rest.pop()
    conn.watched = tuple(rest)
    conn.watches_changed()
    conn.ctx.using.watch(cmd.tube, -1)
    count = len(rest)
    changed = conn.store.change_watches(conn.token, [("-w", cmd.tube)])
    changed.add_done_callback(lambda f: _undo_watch(conn, f, cmd.tube, added=False))
    return then(changed, lambda _: replies.watching(count))


def _reserve(conn: Session, cmd: c.Reserve) -> Reply:
    return conn.start_reserve(None)


def _reserve_with_timeout(conn: Session, cmd: c.ReserveWithTimeout) -> Reply:
    return conn.start_reserve(cmd.seconds if cmd.seconds >= 0 else None)


def _reserve_job(conn: Session, cmd: c.ReserveJob) -> Reply:
    def answer(r: Reservation | NoJob) -> bytes:
        if isinstance(r, NoJob):
            return replies.NOT_FOUND
        conn.mark_worker()
        return replies.reserved(r.id, r.body)

    return then(conn.track_grants(conn.store.reserve_job(conn.token, cmd.id)), answer)


# How a reservation ended, by the reply that settled it (for its span: tubeq.server.tracing).
_ENDED_BY: Final = {reply: reply.split()[0].decode().lower() for reply in (
    replies.DELETED, replies.RELEASED, replies.BURIED, replies.FINISHED, replies.FAILED,
    replies.CANCELLED)}


def _forget_on(conn: Session, job_id: int, ok: bytes,
               how: str = "") -> Callable[[bool], bytes]:
    """The answer of a command that ends ``job_id``'s reservation when it succeeds: ``ok``;
    ``how`` it ended (its span's outcome) when ``ok``'s word does not say it."""
    how = how or _ENDED_BY[ok]

    def answer(done: bool) -> bytes:
        if not done:
            return replies.NOT_FOUND
        conn.settled(job_id, how=how)
        return ok

    return answer


def _delete(conn: Session, cmd: c.Delete) -> Reply:
    return ops.delete(conn.ctx, conn.token, cmd.id, _forget_on(conn, cmd.id, replies.DELETED),
                      behind=conn.passing, run=conn.deletes)


def _release(conn: Session, cmd: c.Release) -> Reply:
    return then(ops.release(conn.ctx, conn.token, cmd.id, cmd.pri, cmd.delay),
                _forget_on(conn, cmd.id, replies.RELEASED))


def _bury(conn: Session, cmd: c.Bury) -> Reply:
    return then(ops.bury(conn.ctx, conn.token, cmd.id, cmd.pri, behind=conn.passing),
                _forget_on(conn, cmd.id, replies.BURIED))


def _touch(conn: Session, cmd: c.Touch) -> Reply:
    def answer(deadline: int) -> bytes:
        if not deadline:
            return replies.NOT_FOUND
        if deadline == CANCELLED:  # someone cancelled it: gone (only after a cancel)
            conn.settled(cmd.id, how="cancelled")
            # a beanstalkd client knows no CANCELLED: for it, as for beanstalkd, the job it
            # touches is no longer its own
            return replies.CANCELLED if conn.extended else replies.NOT_FOUND
        conn.reserved[cmd.id] = deadline
        return replies.TOUCHED

    return then(ops.touch(conn.ctx, conn.token, cmd.id, behind=conn.passing), answer)


def _finish(conn: Session, cmd: c.Finish) -> Reply:
    if len(cmd.result) > conn.ctx.max_result_size:  # (over -z, the parser answered already)
        return replies.JOB_TOO_BIG
    finished = _forget_on(conn, cmd.id, replies.FINISHED)
    cancelled = _forget_on(conn, cmd.id, replies.CANCELLED)
    return then(ops.finish(conn.ctx, conn.token, cmd.id, cmd.result, behind=conn.passing,
                           run=conn.finishes),
                lambda done: cancelled(True) if done == CANCELLED else finished(bool(done)))


def _fail(conn: Session, cmd: c.Fail) -> Reply:
    failed = _forget_on(conn, cmd.id, replies.FAILED)
    cancelled = _forget_on(conn, cmd.id, replies.CANCELLED)

    def answer(outcome: Failed | None) -> bytes:
        if outcome is not None and outcome.state == "cancelled":
            return cancelled(True)
        return failed(outcome is not None)

    return then(ops.fail(conn.ctx, conn.token, cmd.id, cmd.error, behind=conn.passing,
                         worker_policy=cmd.options), answer)


def _hand_back(conn: Session, cmd: c.HandBack) -> Reply:
    handed = _forget_on(conn, cmd.id, replies.RELEASED, how="hand-back")
    cancelled = _forget_on(conn, cmd.id, replies.CANCELLED)
    return then(ops.hand_back(conn.ctx, conn.token, cmd.id),
                lambda done: cancelled(True) if done == CANCELLED else handed(bool(done)))


def _cancel(conn: Session, cmd: c.Cancel) -> Reply:
    return then(ops.cancel(conn.ctx, cmd.id),
                lambda done: replies.CANCELLED if done else replies.NOT_FOUND)


def _progress(conn: Session, cmd: c.ReportProgress) -> Reply:
    if len(cmd.data) > conn.ctx.max_result_size:  # as a result is bounded
        return replies.JOB_TOO_BIG

    def answer(deadline: int) -> bytes:
        if not deadline:
            return replies.NOT_FOUND
        if deadline == CANCELLED:
            conn.settled(cmd.id, how="cancelled")
            return replies.CANCELLED
        conn.reserved[cmd.id] = deadline
        return replies.TOUCHED

    return then(ops.progress(conn.ctx, conn.token, cmd.id, cmd.data, behind=conn.passing),
                answer)


def _wait(conn: Session, cmd: c.Wait) -> Reply:
    """Blocks the connection (like a reserve) until the job ends or the timeout passes."""
    wait, outcome = ops.wait_for_end(conn.ctx, cmd.id, cmd.timeout_ms, cmd.progress_after)
    reply = then(outcome, functools.partial(_ended, cmd.id))
    conn.hold(reply, wait.give_up)
    return reply


def _ended(job_id: int, outcome: JobEnd | Progress | bool | None) -> bytes:
    if outcome is None:
        return replies.TIMED_OUT
    if isinstance(outcome, Progress):
        return replies.progress(job_id, outcome.seq, outcome.data)
    if outcome is False or outcome is True:
        return replies.NOT_FOUND
    return replies.ended(job_id, outcome.how, outcome.data)


def _found(job: tuple[int, bytes] | None) -> bytes:
    return replies.NOT_FOUND if job is None else replies.found(*job)


def _peek(conn: Session, cmd: c.Peek) -> Reply:
    return then(conn.store.peek(cmd.id),
                lambda body: replies.NOT_FOUND if body is None else replies.found(cmd.id, body))


def _peek_ready(conn: Session, cmd: c.PeekReady) -> Reply:
    return then(conn.store.peek_state("ready", conn.used), _found)


def _peek_delayed(conn: Session, cmd: c.PeekDelayed) -> Reply:
    return then(conn.store.peek_state("delayed", conn.used), _found)


def _peek_buried(conn: Session, cmd: c.PeekBuried) -> Reply:
    return then(conn.store.peek_state("buried", conn.used), _found)


def _kick(conn: Session, cmd: c.Kick) -> Reply:
    return then(ops.kick(conn.ctx, conn.used, cmd.bound), replies.kicked)


def _kick_job(conn: Session, cmd: c.KickJob) -> Reply:
    return then(ops.kick_job(conn.ctx, cmd.id),
                lambda ok: replies.KICKED if ok else replies.NOT_FOUND)


def _stats_job(conn: Session, cmd: c.StatsJob) -> Reply:
    if conn.extended:
        return _stats_job_extended(conn, cmd)  # job policies: their keys at the end
    now = conn.store.clock()
    return then(conn.store.job_info(cmd.id),
                lambda job: replies.NOT_FOUND if job is None else replies.ok(job_yaml(job, now)))


def _stats_tube(conn: Session, cmd: c.StatsTube) -> Reply:
    def answer(counts: list[int] | None) -> bytes:
        if counts is None:
            return replies.NOT_FOUND
        return replies.ok(tube_yaml(cmd.tube, counts, conn.store.clock()))

    ops.sync_counts(conn.ctx)  # this process's counts reach Redis before the read below
    if conn.extended:
        return _stats_tube_extended(conn, cmd)
    return then(conn.store.tube_counts(cmd.tube), answer)


def _stats_tube_extended(conn: Session, cmd: c.StatsTube) -> Reply:
    """stats-tube for a client that knows tubeq: beanstalkd's keys, then the tube's settings."""
    store = conn.store

    def answer(results: list[Any]) -> bytes:
        counts, settings, policy_counts, figures, groups = results
        if counts is None:
            return replies.NOT_FOUND
        now = store.clock()
        extra = list(settings.items())
        extra += zip(TUBE_POLICY_COUNTERS, policy_counts, strict=True)  # job policies
        # admin figures: the delay histogram, the oldest ready job's age
        if figures is not None:
            extra += figures.stats_keys(now)
        extra += groups.stats_keys()  # its groups (put-with group=)
        return replies.ok(tube_yaml(cmd.tube, counts, now, extra))

    return then(asyncio.gather(store.tube_counts(cmd.tube), store.tube_settings(cmd.tube),
                               store.tube_policy_counts(cmd.tube), store.tube_figures(cmd.tube),
                               store.tube_groups(cmd.tube)),
                answer)


def _stats(conn: Session, cmd: c.Stats) -> Reply:
    """A run of pipelined stats (no other command between them, in one turn of the
    connection's commands) shares one read, sent when the run ends: every one of them is
    counted in it, and nothing they follow is left out. A deferred stats sent again, outside
    a turn, reads on its own."""
    ctx = conn.ctx
    if conn.replaying:
        return then(ops.namespace_counts(ctx), functools.partial(_stats_reply, ctx))
    run = conn.turn_stats
    if run is None:
        run = conn.turn_stats = SentLater(functools.partial(ops.namespace_counts, ctx))
    return then(run.answer, functools.partial(_stats_reply, ctx))


def _stats_reply(ctx: ServerContext, counts: tuple[list[int], dict[str, int]]) -> bytes:
    """The stats reply of a read; the stats a client pipelined share one read
    (ops.namespace_counts), and so one rendering (the read is held with it, so the identity
    check cannot match a later object at its address)."""
    last = ctx.last_stats_reply
    if last is None or last[0] is not counts:
        last = ctx.last_stats_reply = (
            counts, replies.ok(server_yaml(ctx.identity, counts[0], counts[1], ctx.draining)))
    return last[1]


def _list_tubes(conn: Session, cmd: c.ListTubes) -> Reply:
    ops.sync_using(conn.ctx)
    return then(conn.store.list_tubes(), lambda tubes: replies.ok(yaml_list(tubes)))


def _list_tube_used(conn: Session, cmd: c.ListTubeUsed) -> Reply:
    return replies.using(conn.used)


def _list_tubes_watched(conn: Session, cmd: c.ListTubesWatched) -> Reply:
    return replies.ok(yaml_list(conn.watched))


def _pause_tube(conn: Session, cmd: c.PauseTube) -> Reply:
    return then(ops.pause(conn.ctx, cmd.tube, cmd.delay),
                lambda until_ms: replies.NOT_FOUND if until_ms == 0 else replies.PAUSED)


def _push(conn: Session, cmd: c.Push) -> Reply:
    return conn.start_push(cmd.credits, cancels=cmd.cancels, quiet=cmd.quiet)


def _quiet(conn: Session, cmd: c.Quiet) -> Reply:
    return then(ops.quiet(conn.ctx, cmd.scope, cmd.target), lambda _: replies.QUIETING)


def _extensions(conn: Session, cmd: c.Extensions) -> Reply:
    return replies.ok(yaml_list(EXTENSION_NAMES))


def _tube_set(conn: Session, cmd: c.TubeSet) -> Reply:
    return then(conn.store.set_tube(cmd.tube, cmd.settings), lambda _: replies.SET)


def _auth(conn: Session, cmd: c.Auth) -> Reply:
    gate = conn.ctx.gate
    target = gate.by_token(cmd.token) if gate is not None else None
    if target is None:
        conn.auth_failed()
        return replies.UNAUTHORIZED
    if conn.authenticated:  # once in, a connection stays in its namespace
        return replies.AUTHENTICATED if target is conn.ctx else replies.UNAUTHORIZED
    conn.enter(target)
    return replies.AUTHENTICATED
# -- job policies and deduplicated put (protocol.md: put-with, peek-key) --------------------------

# stats-tube's extra keys of the job policies, in Store.tube_policy_counts order.
TUBE_POLICY_COUNTERS = ("total-expired", "total-dead-lettered", "total-deduplicated",
                        "total-finished", "total-failed", "current-jobs-held",
                        "total-parent-failed")


def _put_with(conn: Session, cmd: c.PutWith) -> Reply:
    conn.mark_producer()
    given = dict(cmd.options)
    wait_ms, notify_ms = given.get("wait-ms"), given.get("notify-ms")
    tube, opts = conn.used, cmd.options
    if "tube" in given:  # this put's tube; the used one stays
        tube = str(given["tube"])
        opts = tuple(option for option in opts if option[0] != "tube")
    if wait_ms is None and notify_ms is None:
        return then(ops.put_with(conn.ctx, tube, cmd.pri, cmd.delay, cmd.ttr, cmd.body, opts),
                    _put_with_reply)
    # request/reply: wait-ms blocks the connection as wait does, and answers how the job
    # ended, or the put's own reply when it has not ended by then; notify-ms answers the put
    # at once and the end later, as a frame (Connection.notify_end)
    wait, put, end = ops.put_and_wait(conn.ctx, tube, cmd.pri, cmd.delay, cmd.ttr, cmd.body,
                                      opts, int(wait_ms or notify_ms or 0),
                                      calls=conn.calls if joins_calls(cmd) else None)
    if notify_ms is not None:
        conn.notify_end(wait, then(end, lambda ended: _end_frame(wait.job_id, ended)))
        return then(put, _put_with_reply)
    reply = then(end, lambda ended: _put_and_wait_reply(put.result(), ended))
    conn.hold(reply, wait.give_up)
    return reply


def _put_and_wait_reply(put: PutOutcome, end: JobEnd | Progress | bool | None) -> bytes:
    if isinstance(end, JobEnd):
        return replies.ended(put.id, end.how, end.data)
    return _put_with_reply(put)


def _end_frame(job_id: int, end: JobEnd | Progress | bool | None) -> bytes | None:
    """notify-ms's frame for job ``job_id`` (0: the put was refused, no frame): how it ended,
    or that the time ran out (None) or it is gone with no end kept (False)."""
    if not job_id:
        return None
    if isinstance(end, JobEnd):
        return replies.end_frame(job_id, end.how, end.data)
    how = replies.END_NOT_FOUND if end is False else replies.END_TIMED_OUT
    return replies.end_frame(job_id, how, b"")


def _put_with_reply(outcome: PutOutcome) -> bytes:
    if outcome.unknown_parent:
        return replies.unknown_parent(outcome.unknown_parent)
    if outcome.id <= 0:
        return _PUT_REFUSED[outcome.id]
    return replies.inserted(outcome.id) if outcome.inserted else replies.duplicate(outcome.id)


def _peek_key(conn: Session, cmd: c.PeekKey) -> Reply:
    return then(conn.store.peek_key(cmd.key), _found)


def _stats_job_extended(conn: Session, cmd: c.StatsJob) -> Reply:
    """stats-job for a client that knows tubeq: beanstalkd's keys, then the job's policies."""
    store = conn.store
    now = store.clock()

    def answer(results: list[Any]) -> bytes:
        job, policies = results
        if job is None or policies is None:
            return replies.NOT_FOUND
        return replies.ok(job_yaml(job, now, job_policy_keys(policies)))

    return then(asyncio.gather(store.job_info(cmd.id), store.job_policies(cmd.id)), answer)
# -- admin verbs -------------------------------------------------------------------------------


def _clear_tube(conn: Session, cmd: c.ClearTube) -> Reply:
    cleared = asyncio.ensure_future(conn.store.clear_tube(cmd.tube, cmd.states))
    return then(cleared, lambda n: replies.NOT_FOUND if n is None else replies.cleared(n))


def _list_jobs(conn: Session, cmd: c.ListJobs) -> Reply:
    def answer(page: admin.JobPage | None) -> bytes:
        if page is None:
            return replies.NOT_FOUND
        return replies.ok(admin.jobs_yaml(cmd.tube, cmd.state, page))

    return then(conn.store.list_jobs(cmd.tube, cmd.state, cmd.cursor, cmd.count), answer)


def _change_pri(conn: Session, cmd: c.ChangePri) -> Reply:
    return then(conn.store.change_pri(cmd.id, cmd.pri),
                lambda ok: replies.CHANGED if ok else replies.NOT_FOUND)


def _change_delay(conn: Session, cmd: c.ChangeDelay) -> Reply:
    def answer(due: int) -> bytes:
        if due == 0:
            return replies.NOT_FOUND
        if due > 0:
            conn.ctx.scheduler.note_due(due, DELAYED)
        return replies.CHANGED

    return then(conn.store.change_delay(cmd.id, cmd.delay_ms), answer)


def _tube_pause(conn: Session, cmd: c.TubePause) -> Reply:
    ops.sync_using(conn.ctx)
    return then(conn.store.tube_pause(cmd.tube, forever=True),
                lambda ok: replies.PAUSED if ok else replies.NOT_FOUND)


def _tube_resume(conn: Session, cmd: c.TubeResume) -> Reply:
    ops.sync_using(conn.ctx)  # resume may let the tube go: this process's users count first
    return then(conn.store.tube_pause(cmd.tube, forever=False),
                lambda ok: replies.RESUMED if ok else replies.NOT_FOUND)
# -- recurring jobs ----------------------------------------------------------------------------


def _schedule_add(conn: Session, cmd: c.ScheduleAdd) -> Reply:
    store = conn.store
    try:
        first = recurring.first_due(cmd.kind, cmd.spec, store.clock())
    except recurring.BadSchedule:  # parses, but never ticks (e.g. 0 0 30 2 *)
        return replies.bad_option("cron")

    def answer(result: tuple[int, bool]) -> bytes:
        conn.ctx.scheduler.note_due(result[0], TICK)
        return replies.scheduled(result[0])

    return then(store.schedule_add(cmd.tube, cmd.name, cmd.kind, cmd.spec, cmd.pri, cmd.ttr,
                                   cmd.delay_ms, cmd.body, first), answer)


def _schedule_list(conn: Session, cmd: c.ScheduleList) -> Reply:
    return then(conn.store.schedule_list(cmd.tube),
                lambda found: replies.ok(recurring.list_yaml(found)))


def _schedule_remove(conn: Session, cmd: c.ScheduleRemove) -> Reply:
    return then(conn.store.schedule_remove(cmd.tube, cmd.name),
                lambda removed: replies.REMOVED if removed else replies.NOT_FOUND)


def _extension(handler: Callable[[Session, Any], Reply | None],
               ) -> Callable[[Session, Any], Reply | None]:
    """An extension command's handler: the connection is marked as one that knows tubeq."""

    def handle(conn: Session, cmd: Any) -> Reply | None:
        conn.extended = True
        return handler(conn, cmd)

    return handle


def _quit(conn: Session, cmd: c.Quit) -> None:
    conn.quit()


# -- batches: put-many, reserve-many, delete-many -----------------------------------------------

# The bytes a RESERVED reply adds to its job's body (header line and CRLFs), for the bound on
# a reserve-many's reply below.
_RESERVED_FRAMING = 48


def _put_many(conn: Session, cmd: c.PutMany) -> Reply | None:
    """Insert the entries the parser accepted; every entry gets its reply (INSERTED <id>, or
    what the parser refused it with), in order, in one BATCH. A long batch comes in parts
    (``cmd.more``): each part is sent to Redis at once, stored while the next is read, and
    the reply waits for the last."""
    part = _put_many_part(conn, cmd.entries, send_now=cmd.more)
    if cmd.more:
        if conn.batch_parts is None:
            conn.batch_parts = []
        conn.batch_parts.append(part)
        return None
    parts = [*(conn.batch_parts or ()), part]
    conn.batch_parts = None
    return _batch_of_parts(parts)


# One part's replies: the entries' reply lines, or the part's store call and its entries (the
# lines come from its result).
_Part: TypeAlias = list[bytes] | tuple[asyncio.Future[list[int]], tuple[c.PutEntry | bytes, ...]]


def _put_many_part(conn: Session, entries: tuple[c.PutEntry | bytes, ...], *,
                   send_now: bool) -> _Part:
    """Store one part's jobs in one script call (``send_now``: sent to Redis at once)."""
    jobs = [e for e in entries if isinstance(e, c.PutEntry)]
    counters = conn.ctx.counters
    for _ in entries:  # cmd-put counts each entry, as it counts each put (refused ones too)
        counters.incr("put")
    if entries:
        conn.mark_producer()
    if jobs and conn.ctx.full:  # the namespace reached --max-jobs: every entry refused
        return [replies.OUT_OF_MEMORY if isinstance(e, c.PutEntry) else e for e in entries]
    if not jobs or conn.ctx.draining:
        # Nothing to store (refused entries use no id; while draining no job is taken).
        return [replies.DRAINING if isinstance(e, c.PutEntry) else e for e in entries]
    groups = [e.group for e in jobs] if any(e.group for e in jobs) else None
    traceparents = ([e.traceparent for e in jobs] if any(e.traceparent for e in jobs)
                    else None)
    call = ops.put_many(conn.ctx, conn.used, [(e.pri, e.delay, e.ttr, e.body) for e in jobs],
                        send_now=send_now, groups=groups, traceparents=traceparents)
    # Read even if the connection closes before the batch's last part (nothing else would:
    # asyncio would log its failure as never retrieved).
    call.add_done_callback(discard)
    return call, entries


def _part_replies(part: _Part) -> list[bytes]:
    """A part's reply lines once its call (if any) is done: a failed call answers each of its
    jobs INTERNAL_ERROR saying whether the part ran (put-many is an extension, so its
    connection is extended: replies.internal_error), as a lone put's would."""
    if isinstance(part, list):
        return part
    call, entries = part
    if call.cancelled() or call.exception() is not None:
        error = None if call.cancelled() else call.exception()
        if error is not None:
            log.warning("store call failed", error=repr(error))
        failed = replies.internal_error(None if error is None else ran(error), True)
        return [failed if isinstance(e, c.PutEntry) else e for e in entries]
    given = iter(call.result())  # one id per job, in order; 0: the tube was full

    def put_reply(job_id: int) -> bytes:
        return replies.inserted(job_id) if job_id else replies.OUT_OF_MEMORY

    return [put_reply(next(given)) if isinstance(e, c.PutEntry) else e for e in entries]


def _batch_of_parts(parts: list[_Part]) -> Reply:
    """The BATCH reply of a put-many's parts, once every part's call is done. Each part's
    lines are made as its call answers, while Redis still runs the parts after it."""
    lines: list[list[bytes] | None] = [p if isinstance(p, list) else None for p in parts]
    left = lines.count(None)

    def joined() -> bytes:
        return replies.batch([line for done in lines for line in done or ()])

    if not left:
        return joined()
    reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def answered(index: int, part: _Part, _: object) -> None:
        nonlocal left
        lines[index] = _part_replies(part)
        left -= 1
        if not left and not reply.done():
            reply.set_result(joined())

    for index, part in enumerate(parts):
        if isinstance(part, tuple):
            part[0].add_done_callback(functools.partial(answered, index, part))
    return reply


def _reserve_many(conn: Session, cmd: c.ReserveMany) -> Reply:
    # One reply of up to count jobs: at most half the connection's buffer cap of job data, so
    # the batch never gets the connection closed for holding too much (protocol.md).
    ctx = conn.ctx
    ctx.counters.incr("reserve-with-timeout")  # one wait with a timeout, however many jobs
    fits = max(1, ctx.max_client_buffer // 2 // (ctx.max_job_size + _RESERVED_FRAMING))
    return conn.start_reserve(cmd.seconds, count=min(cmd.count, fits))


def _delete_many(conn: Session, cmd: c.DeleteMany) -> Reply:
    if not conn.replaying:  # counted when first sent (a deferred one is sent again)
        # cmd-delete counts each id, as it counts each delete
        conn.ctx.counters.incr("delete", len(cmd.ids))

    def answer(done: list[bool]) -> bytes:
        conn.settled(*(job_id for job_id, deleted in zip(cmd.ids, done, strict=True)
                       if deleted), how="deleted")
        return replies.batch([replies.DELETED if deleted else replies.NOT_FOUND
                              for deleted in done])

    call = conn.store.delete_many(conn.token, cmd.ids, behind=conn.passing)
    if not conn.passing:  # nothing can defer it: pushed jobs' credits come back as it is sent
        conn.settling(cmd.ids)
    return then(call, answer)


HANDLERS: dict[type[c.Command], Callable[[Session, Any], Reply | None]] = {
    c.Put: _put,
    c.PutExpectedCrlf: _put_expected_crlf,
    c.PutTooBig: _put_too_big,
    c.Rejected: _rejected,
    c.Use: _use,
    c.Reserve: _reserve,
    c.ReserveWithTimeout: _reserve_with_timeout,
    c.ReserveJob: _reserve_job,
    c.Delete: _delete,
    c.Release: _release,
    c.Bury: _bury,
    c.Touch: _touch,
    c.Watch: _watch,
    c.Ignore: _ignore,
    c.Peek: _peek,
    c.PeekReady: _peek_ready,
    c.PeekDelayed: _peek_delayed,
    c.PeekBuried: _peek_buried,
    c.Kick: _kick,
    c.KickJob: _kick_job,
    c.StatsJob: _stats_job,
    c.StatsTube: _stats_tube,
    c.Stats: _stats,
    c.ListTubes: _list_tubes,
    c.ListTubeUsed: _list_tube_used,
    c.ListTubesWatched: _list_tubes_watched,
    c.Quit: _quit,
    c.PauseTube: _pause_tube,
    c.Push: _extension(_push),
    c.Quiet: _extension(_quiet),
    c.Extensions: _extension(_extensions),
    c.TubeSet: _extension(_tube_set),
    # recurring jobs
    c.ScheduleAdd: _extension(_schedule_add),
    c.ScheduleList: _extension(_schedule_list),
    c.ScheduleRemove: _extension(_schedule_remove),
    # admin verbs
    c.ClearTube: _extension(_clear_tube),
    c.ListJobs: _extension(_list_jobs),
    c.ChangePri: _extension(_change_pri),
    c.ChangeDelay: _extension(_change_delay),
    c.TubePause: _extension(_tube_pause),
    c.TubeResume: _extension(_tube_resume),
    # batches
    c.PutMany: _extension(_put_many),
    c.ReserveMany: _extension(_reserve_many),
    c.DeleteMany: _extension(_delete_many),
    # job policies and deduplicated put
    c.PutWith: _extension(_put_with),
    c.PeekKey: _extension(_peek_key),
    # ends
    c.Finish: _extension(_finish),
    c.Fail: _extension(_fail),
    c.ReportProgress: _extension(_progress),
    c.HandBack: _extension(_hand_back),
    c.Cancel: _extension(_cancel),
    c.Wait: _extension(_wait),
    c.WaitMs: _extension(_wait),
    c.Auth: _extension(_auth),
}


def _auth_required(conn: Session, cmd: c.Command) -> Reply:
    return replies.AUTH_REQUIRED


def _rejected_before_auth(conn: Session, cmd: c.Rejected) -> Reply:
    return cmd.reply  # BAD_FORMAT or UNKNOWN_COMMAND, counted nowhere


def _put_many_before_auth(conn: Session, cmd: c.PutMany) -> Reply | None:
    return None if cmd.more else replies.AUTH_REQUIRED  # one reply, after the last part


# A connection that must `auth` first (an access file, a listener bound to no namespace): every
# command but these answers AUTH_REQUIRED and stores nothing (a put's body is read and dropped).
GATE_HANDLERS: dict[type[c.Command], Callable[[Session, Any], Reply | None]] = {
    **{kind: _auth_required for kind in HANDLERS},
    c.Rejected: _rejected_before_auth,
    c.PutMany: _put_many_before_auth,
    c.Extensions: HANDLERS[c.Extensions],
    c.Auth: HANDLERS[c.Auth],
    c.Quit: _quit,
}
