"""The job verbs, once for every front: the protocol handlers and the HTTP API call these.

Owns what a verb does around its store call: the draining and ``--max-jobs`` refusals of a put,
telling the scheduler of an instant it must act at (a delayed put's or release's due time, a
touched job's new deadline, a pause's end), and sending this process's ``use`` counts ahead of
a read that depends on them.

Not here: the ``cmd-*`` counter of the command (the protocol counts each parsed command, the
HTTP API each route's one command), ``total-jobs`` (the scripts that store a job count it), the
connection's own state (its held jobs, its tubes) and
how an outcome is rendered (reply bytes, JSON). Each verb returns the store call's future, or,
where it was given an ``answer``, a future of what ``answer`` made of the outcome (for put, the
answer runs in the Redis reply's decoder: no future hop of its own on the hot path).

Rule: a put refused while draining uses up a job id, over either front, as beanstalkd's
does (its id is taken before the draining check): ids then follow one sequence whichever
front a put came by.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Final, TypeVar

from tubeq.model.options import AFTER_KEEP, END_WAIT_OPTIONS, WAITED, Options
from tubeq.redisio.futures import OneReadAtATime, discard, then
from tubeq.server import end_waits
from tubeq.server.context import ServerContext
from tubeq.server.end_waits import EndWait
from tubeq.server.runs import CallRun, DeleteRun, FinishRun, PutRun
from tubeq.server.scheduler import DELAYED, TTR
from tubeq.server.tracing import JobTracer
from tubeq.store.records import FINISHED_HERE, Failed, JobEnd, Progress, PutOutcome, TubeCounts

T = TypeVar("T")

# What a put's answer gets instead of a new job's id (ids start at 1).
TUBE_FULL: Final = 0  # Redis refused it: the tube holds its max-jobs (tube-set)
NAMESPACE_FULL: Final = -1  # the namespace held --max-jobs jobs at its last count
DRAINING: Final = -2  # the server is draining (an id was used up, as beanstalkd does)

# The least time between two starts of one whole-namespace read (stats' counts, the scrapes'
# tube overview) in one process. A monitor polling stats or a scrape every second never waits
# for it; a client that asks without pause (issue 35's storm: 20 stats pipelined per round,
# over a thousand rounds a second) is answered 20 times a second. Why 50 ms: each answer is a
# burst of the process's time (20 replies rendered and written: ~0.5 ms on 2 cores), which
# another client's command may wait behind; at 5 ms apart those bursts filled a tenth of the
# time and lifted another client's put p99 to 1.8-2.5x its idle p99, at 50 ms they fill ~1 %
# and it stayed within 1.0-1.4x (bench/RESULTS-hardening.md). Every answer is still read
# after its caller asked.
NAMESPACE_READ_SPACING_S: Final = 0.05


def put(ctx: ServerContext, tube: str, pri: int, delay: int, ttr: int, body: bytes,
        answer: Callable[[int], T], *, run: PutRun | None = None) -> T | asyncio.Future[T]:
    """Store a job; ``answer`` gets its id or why there is none (TUBE_FULL, NAMESPACE_FULL,
    DRAINING). A TTR of 0 is stored as 1, as beanstalkd does. ``run``: the connection's puts
    of this turn, which a put the store takes joins."""
    store = ctx.store
    if ctx.draining:
        if run is not None:
            run.send()  # the puts before it take their ids first
        return then(store.burn_id(tube), lambda _: answer(DRAINING))
    if ctx.full:
        return answer(NAMESPACE_FULL)
    if run is not None:
        call = run.add(tube, pri, delay, max(ttr, 1), body, answer)
    else:
        call = store.put(tube, pri, delay, max(ttr, 1), body, answer)
    if delay > 0:
        _note_due_when_done(ctx, call, store.clock() + delay * 1000)
    return call


def put_with(ctx: ServerContext, tube: str, pri: int, delay: int, ttr: int, body: bytes,
             options: Options, *, run: CallRun | None = None) -> asyncio.Future[PutOutcome]:
    """Store a job with options (tubeq.model.options.PUT_OPTIONS): the outcome names the new
    job, or the living job whose dedupe key it carries; ``PutOutcome(DRAINING | NAMESPACE_FULL
    | TUBE_FULL, False)`` when refused. ``run``: the connection's calls of this turn, which a
    plain call (runs.joins_calls: its only option is ``waited``) the store takes joins."""
    store = ctx.store
    if ctx.draining:
        if run is not None:
            run.send()  # the calls before it take their ids first
        return then(store.burn_id(tube), lambda _: PutOutcome(DRAINING, False))
    if ctx.full:
        refused: asyncio.Future[PutOutcome] = asyncio.get_running_loop().create_future()
        refused.set_result(PutOutcome(NAMESPACE_FULL, False))
        return refused
    if run is not None:
        return run.add(tube, pri, max(ttr, 1), body)
    opts = dict(options)
    if "after" in opts:  # the parents' ends are kept as long as results are (wait reads them)
        options = (*options, (AFTER_KEEP, ctx.result_ttl_ms))
    delay_ms = int(opts.get("delay-ms", delay * 1000))
    ttl_ms = int(opts.get("ttl-ms", 0))  # the job's own; a tube's ttl-ms is the sweep's to find
    now = store.clock()
    # put-with traceparent=, on a process that exports traces: the put's span (tracing.py)
    traced = ctx.tracer is not None and "traceparent" in opts

    def stored(outcome: PutOutcome) -> PutOutcome:
        if outcome.id and outcome.inserted and (delay_ms > 0 or ttl_ms > 0):
            for due in (delay_ms, ttl_ms):
                if due > 0:
                    ctx.scheduler.note_due(now + due, DELAYED)  # (TTLs: promote.lua too)
        if traced and ctx.tracer is not None:
            ctx.tracer.put(str(opts["traceparent"]), tube, store.keys.prefix, now,
                           max(outcome.id, 0), _put_outcome(outcome))
        return outcome

    call = store.put_with(tube, pri, delay, max(ttr, 1), body, options)
    # (nothing to note or trace: the store's future itself, one future and callback less)
    return then(call, stored) if delay_ms > 0 or ttl_ms > 0 or traced else call


def _put_outcome(outcome: PutOutcome) -> str:
    """A put-with's outcome as its span says it."""
    if outcome.inserted:
        return "inserted"
    if outcome.unknown_parent:
        return "unknown-parent"
    return "duplicate" if outcome.id > 0 else "refused"


Waited = JobEnd | Progress | bool | None  # what wait_for_end answers


def put_and_wait(ctx: ServerContext, tube: str, pri: int, delay: int, ttr: int, body: bytes,
                 options: Options, wait_ms: int, *, calls: CallRun | None = None
                 ) -> tuple[EndWait, asyncio.Future[PutOutcome], asyncio.Future[Waited]]:
    """put-with's wait-ms and notify-ms: store the job (as :func:`put_with`, marked waited
    from its birth, so no end of it is missed), then wait up to ``wait_ms`` for it (or, for a
    duplicate, the living job that has its key) to end. The wait (to give up early), the put's
    outcome, and then :func:`wait_for_end`'s (None when the put was refused or the wait timed
    out). ``calls``: the connection's plain calls of this turn, which this one joins."""
    wait = EndWait(0)
    marked = (*((name, value) for name, value in options if name not in END_WAIT_OPTIONS),
              (WAITED, ctx.result_ttl_ms))
    put = put_with(ctx, tube, pri, delay, ttr, body, marked, run=calls)

    async def run() -> Waited:
        outcome = await put
        if outcome.id <= 0:
            return None
        wait.job_id = outcome.id
        return await end_waits.wait_for_end(
            ctx.store, ctx.end_waits, wait, wait_ms, ctx.result_ttl_ms,
            read_first=not outcome.inserted)  # a duplicate's job was not marked by this put

    return wait, put, ctx.end_waits.loop.create_task(run())


def put_many(ctx: ServerContext, tube: str, jobs: list[tuple[int, int, int, bytes]], *,
             send_now: bool = False, groups: list[str] | None = None,
             traceparents: list[str] | None = None) -> asyncio.Future[list[int]]:
    """Store ``(pri, delay, ttr, body)`` jobs in one script call: their ids, 0 for each the
    tube refused (its max-jobs). The caller checks draining and --max-jobs first: a batch
    refused whole uses no id. ``send_now``: the call goes to Redis at once, not at the end of
    the loop's turn (a part of a batch whose rest is still being read). ``groups``: each job's
    group ("" for none), or None when no job has one; ``traceparents`` the same of their
    traceparents (each traced job's put gets its span, as put-with's: tracing.py)."""
    store = ctx.store
    now = store.clock()
    call = store.put_many(tube, [(pri, delay, max(ttr, 1), body)
                                 for pri, delay, ttr, body in jobs], send_now=send_now,
                          groups=groups, traceparents=traceparents)
    delays = [delay for _, delay, _, _ in jobs if delay > 0]
    if delays:
        _note_due_when_done(ctx, call, now + min(delays) * 1000)
    if ctx.tracer is not None and traceparents is not None:
        call.add_done_callback(functools.partial(
            _trace_put_many, ctx.tracer, traceparents, tube, store.keys.prefix, now))
    return call


def _trace_put_many(tracer: JobTracer, traceparents: list[str], tube: str, prefix: str,
                    start_ms: int, call: asyncio.Future[list[int]]) -> None:
    """Each traced job's put span once its batch is stored (none for a call that failed)."""
    if call.cancelled() or call.exception() is not None:
        return
    for traceparent, job_id in zip(traceparents, call.result(), strict=True):
        if traceparent:
            tracer.put(traceparent, tube, prefix, start_ms, job_id,
                       "inserted" if job_id else "refused")


def delete(ctx: ServerContext, token: str, job_id: int, answer: Callable[[bool], T], *,
           behind: int = 0, run: DeleteRun | None = None) -> asyncio.Future[T]:
    """Delete a job ``token`` holds (or, with no token, one nobody holds). ``run``: the
    connection's deletes of this turn, which it joins unless it is sent ``behind`` reserves
    (then it may be deferred, and goes alone)."""
    if run is not None and not behind:
        return run.add(job_id, answer)
    return ctx.store.delete(token, job_id, answer, behind=behind)


def release(ctx: ServerContext, token: str, job_id: int, pri: int,
            delay: int) -> asyncio.Future[bool]:
    """Put a job ``token`` holds back to ready, or delayed by ``delay`` seconds."""
    store = ctx.store
    call = store.release(token, job_id, pri, delay)
    if delay > 0:
        _note_due_when_done(ctx, call, store.clock() + delay * 1000)
    return call


def hand_back(ctx: ServerContext, token: str, job_id: int) -> asyncio.Future[int]:
    """A job ``token`` holds back to ready at once, its try not counted (the holder is
    shutting down): 1 done, 0 not held, CANCELLED (it was cancelled, and is gone)."""
    return ctx.store.hand_back(token, job_id)


def quiet(ctx: ServerContext, scope: str, target: str = "") -> asyncio.Future[int]:
    """Push consumers in ``scope`` ("all"; "tube" ``target``; "conn" ``target``, a connection's
    token) stop taking jobs, on every process (told over pub/sub, this one's too): the
    processes that heard it."""
    return ctx.store.quiet(scope, target)


def bury(ctx: ServerContext, token: str, job_id: int, pri: int, *,
         behind: int = 0) -> asyncio.Future[bool]:
    """Put a job ``token`` holds aside (buried)."""
    return ctx.store.bury(token, job_id, pri, behind=behind)


def touch(ctx: ServerContext, token: str, job_id: int, *,
          behind: int = 0) -> asyncio.Future[int]:
    """A full TTR again from now for a job ``token`` holds: its new deadline (ms), 0 if not
    held. The deadline is this process's to act on (expire.lua at that instant)."""

    return _noting_deadline(ctx, ctx.store.touch(token, job_id, behind=behind))


def _noting_deadline(ctx: ServerContext, call: asyncio.Future[int]) -> asyncio.Future[int]:
    """A touch's (or progress's) new TTR deadline, told to the scheduler (expire.lua runs
    then in this process); 0 and CANCELLED pass through."""

    def touched(deadline: int) -> int:
        if deadline > 0:
            ctx.scheduler.note_due(deadline, TTR)
        return deadline

    return then(call, touched)


def finish(ctx: ServerContext, token: str, job_id: int, result: bytes, *,
           behind: int = 0, run: FinishRun | None = None) -> asyncio.Future[bool | int]:
    """Delete a job ``token`` holds as done, keeping ``result`` for --result-ttl (False: not
    held; CANCELLED: it was cancelled, and is gone). When only this process waited for it
    (a request/reply of its own), its waits hear the end from here: it was not published.
    ``run``: the connection's finishes of this turn, which it joins unless it is sent
    ``behind`` reserves (as a delete)."""
    if run is not None and not behind:
        call = run.add(job_id, result)
    else:
        call = ctx.store.finish(token, job_id, result, ctx.result_ttl_ms, behind=behind)

    def finished(f: asyncio.Future[bool | int]) -> None:
        if not f.cancelled() and f.exception() is None and f.result() == FINISHED_HERE:
            # At once: another connection's call hears its END ahead of the finisher's
            # FINISHED (a call of the finishing connection itself waits for that reply:
            # Connection._end_frame).
            ctx.end_waits.ended(job_id, JobEnd("finished", result))

    call.add_done_callback(finished)
    return call


def cancel(ctx: ServerContext, job_id: int) -> asyncio.Future[int]:
    """The job is not to run again: deleted now (1), or, reserved, marked so that its holder
    hears it (2); 0 no such job."""
    return ctx.store.cancel(job_id)


def fail(ctx: ServerContext, token: str, job_id: int, error: bytes, *,
         behind: int = 0, worker_policy: Options = ()) -> asyncio.Future[Failed | None]:
    """A job ``token`` holds failed with ``error``: it follows its policies, as a TTR timeout
    does (back to ready, delayed by its backoff, or buried when its tries run out);
    ``worker_policy`` (FAIL_OPTIONS) where neither the job nor its tube has one."""

    def failed(outcome: Failed | None) -> Failed | None:
        if outcome is not None and outcome.due_ms:
            ctx.scheduler.note_due(outcome.due_ms, DELAYED)
        return outcome

    return then(ctx.store.fail(token, job_id, error, behind=behind,
                               worker_policy=worker_policy), failed)


def wait_for_end(ctx: ServerContext, job_id: int, timeout_ms: int,
                 progress_after: int | None = None
                 ) -> tuple[EndWait, asyncio.Future[Waited]]:
    """Wait for job ``job_id`` to end (or, with ``progress_after``, to report a progress past
    that count), at most ``timeout_ms``: the wait (to give up early) and its outcome
    (tubeq.server.end_waits.wait_for_end: the end or progress, False no such job, None timed
    out). The job's end is then kept for --result-ttl for the waits after it."""
    wait = EndWait(job_id)
    return wait, asyncio.ensure_future(end_waits.wait_for_end(
        ctx.store, ctx.end_waits, wait, timeout_ms, ctx.result_ttl_ms,
        progress_after=progress_after))


def progress(ctx: ServerContext, token: str, job_id: int, data: bytes, *,
             behind: int = 0) -> asyncio.Future[int]:
    """A job ``token`` holds reports its progress, and gets a full TTR as with :func:`touch`
    (the new deadline; 0 not held; CANCELLED)."""
    return _noting_deadline(ctx, ctx.store.progress(token, job_id, data, behind=behind))


def kick(ctx: ServerContext, tube: str, bound: int) -> asyncio.Future[int]:
    """Up to ``bound`` buried jobs of ``tube`` (none buried: delayed ones) to ready."""
    return ctx.store.kick(tube, bound)


def kick_job(ctx: ServerContext, job_id: int) -> asyncio.Future[bool]:
    """One buried or delayed job to ready."""
    return ctx.store.kick_job(job_id)


def pause(ctx: ServerContext, tube: str, delay: int) -> asyncio.Future[int]:
    """No reserves from ``tube`` for ``delay`` seconds (0 resumes): the pause's end (ms), -1
    when resumed at once, 0 when the tube does not exist."""
    sync_using(ctx)

    def paused(until_ms: int) -> int:
        if until_ms > 0:
            ctx.scheduler.note_due(until_ms, DELAYED)  # a pause's end: promote.lua
        return until_ms

    return then(ctx.store.pause(tube, delay), paused)


def sync_using(ctx: ServerContext) -> None:
    """Before a read of tube references or existence: this process's ``use`` counts reach
    Redis first (sent ahead of the read, on the same Redis connection)."""
    in_redis = ctx.using.flush()
    if in_redis is not None:
        in_redis.add_done_callback(discard)


def namespace_counts(ctx: ServerContext) -> asyncio.Future[tuple[list[int], dict[str, int]]]:
    """The namespace's counts behind ``stats`` (the job states, tubes, gauges and shared
    counters), read after this process's counts reached Redis. One read is out at a time per
    namespace; callers that come meanwhile share the next, so a client that pipelines stats
    costs Redis and this process two reads per round, whatever its pipeline's depth; and two
    reads start at least NAMESPACE_READ_SPACING_S apart."""
    read = ctx.shared_reads.get("counts")
    if read is None:
        def counts() -> asyncio.Future[tuple[list[int], dict[str, int]]]:
            sync_counts(ctx)
            return ctx.store.server_counts()

        read = ctx.shared_reads["counts"] = OneReadAtATime(counts, NAMESPACE_READ_SPACING_S)
    return read()


def namespace_counts_start_later(ctx: ServerContext) -> bool:
    """Whether the last caller of :func:`namespace_counts` gets its answer from a read not
    sent yet (the spacing, or a read out): a connection then holds its next commands until
    it is answered, so a stats never shows what the same connection did after it."""
    read = ctx.shared_reads.get("counts")
    return read is not None and read.starts_later


def tube_overview(ctx: ServerContext, limit: int
                  ) -> asyncio.Future[tuple[int, list[TubeCounts]]]:
    """The first ``limit`` tubes' counts and the rest's sum (the scrape, the dashboard and
    /api/tubes), read after this process's counts reached Redis; one read out at a time per
    namespace and limit, shared as :func:`namespace_counts` is."""
    read = ctx.shared_reads.get(("overview", limit))
    if read is None:
        def overview() -> asyncio.Future[tuple[int, list[TubeCounts]]]:
            ctx.counters.flush()
            return ctx.store.overview(limit)

        read = ctx.shared_reads[("overview", limit)] = OneReadAtATime(
            overview, NAMESPACE_READ_SPACING_S)
    return read()


def sync_counts(ctx: ServerContext) -> None:
    """Before a read of the namespace's counts (stats, stats-tube): this process's command
    counters and ``use`` counts reach Redis first."""
    ctx.counters.flush()
    sync_using(ctx)


def _note_due_when_done(ctx: ServerContext, call: asyncio.Future[Any], due_ms: int) -> None:
    """Tell the scheduler of a delayed job due at ``due_ms`` once ``call`` is answered (the
    job is in Redis then)."""
    call.add_done_callback(lambda _: ctx.scheduler.note_due(due_ms, DELAYED))
