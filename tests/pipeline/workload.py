"""A known workload, recorded by the test itself, and the lifecycle events it would produce.

``simulate()`` plays a seeded workload (puts with and without delays, reserves, touches, releases
with and without delays, TTR time-outs and jobs given back (disconnect, reaped), buries
(deliberate, max-tries, expired), kicks, deletes of reserved, buried and ready jobs, finishes
with results of known sizes, fails followed by a release or a max-tries bury, jobs left ready,
delayed, reserved or buried at the end) and keeps two things apart:

* the **record**: what the test did, in its own terms: every wait (reserve time minus the moment
  the simulation made the job ready), every processing time, every promotion's lateness, each
  job's tries, and each job's state as time intervals;
* the **events** that workload writes to the stream, in the ``tubeq.model.events`` schema, with
  stream ids in the order they happened.

The expected figures in the tests come from the record only, never from the events, so a report
that reads the events wrong cannot agree with them by accident.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tubeq.model.events import FIELDS

# 2026-11-29 10:17:00 UTC plus 23.456 s: buckets do not start on the first event.
BASE_MS = 1_795_947_443_456

TUBES = ("orders", "mail", "007", "reports.daily")


@dataclass
class Measure:
    tube: str
    time_ms: int  # when the event that measures it happened
    value: int


@dataclass
class JobRecord:
    id: int
    tube: str
    tries: int = 0
    failures: int = 0
    # (state, since_ms, until_ms or None): what the job was, from when, until when.
    states: list[tuple[str, int, int | None]] = field(default_factory=list)
    # (event, time_ms, delay_ms, due_ms, tries, reason, size, error, failures) in the order
    # they happened; size: a finish's result bytes or a fail's error bytes.
    steps: list[tuple[str, int, int, int, int, str, int, str, int]] = field(
        default_factory=list)


@dataclass
class Record:
    jobs: list[JobRecord] = field(default_factory=list)
    waits: list[Measure] = field(default_factory=list)
    processing: list[Measure] = field(default_factory=list)
    lateness: list[Measure] = field(default_factory=list)


class _Life:
    """One job's life being played: each call appends a step and moves the state."""

    def __init__(self, record: Record, job: JobRecord, pri: int, ttr_ms: int) -> None:
        self.record = record
        self.job = job
        self.pri = pri
        self.ttr_ms = ttr_ms
        self.now = 0
        self.ready_since: int | None = None
        self.reserved_since: int | None = None

    def _enter(self, state: str | None, at: int) -> None:
        states = self.job.states
        if states and states[-1][2] is None:
            last_state, since, _ = states[-1]
            states[-1] = (last_state, since, at)
        if state is not None:
            states.append((state, at, None))

    def step(self, event: str, at: int, state: str | None, *, delay_ms: int = 0,
             due_ms: int = 0, reason: str = "", size: int = 0, error: str = "") -> None:
        assert at >= self.now
        self.now = at
        failures = self.job.failures if event == "failed" else 0
        self.job.steps.append((event, at, delay_ms, due_ms, self.job.tries, reason, size, error,
                               failures))
        self._enter(state, at)
        if state == "ready":
            self.ready_since = at

    def fail(self, at: int) -> None:
        """Its holder fails it: a ``failed`` step (it stays reserved); its move comes next."""
        self.job.failures += 1
        error = f"RuntimeError: attempt {self.job.tries} of job {self.job.id}"
        self.step("failed", at, "reserved", size=len(error), error=error)


def simulate(seed: int = 9, jobs: int = 320, span_ms: int = 3 * 3_600_000) -> Record:
    """Play ``jobs`` job lives starting over ``span_ms`` from ``BASE_MS``."""
    rng = random.Random(seed)
    record = Record()
    for job_id in range(1, jobs + 1):
        tube = TUBES[job_id % len(TUBES)] if job_id % 7 else TUBES[0]
        job = JobRecord(job_id, tube)
        record.jobs.append(job)
        life = _Life(record, job, pri=rng.choice((0, 100, 1024)),
                     ttr_ms=rng.choice((1, 5, 30)) * 1000)
        put_at = BASE_MS + rng.randrange(span_ms)
        # Every third delayed promotion carries its due time itself; the others leave it to the
        # put or release that delayed the job (both shapes must give the same lateness).
        delay = rng.choice((0, 0, 0, 5_000, 90_000, 1_800_000))
        if job_id % 53 == 0:
            delay = 10 * 3_600_000  # still delayed when the recording ends
        _delayed(rng, life, "put", put_at, delay, job_id)
        if life.job.states[-1][0] == "delayed":
            continue
        if job_id % 41 == 0:
            life.step("deleted", life.now + rng.randrange(60_000), None)  # deleted while ready
            continue
        if job_id % 29 == 0:
            continue  # never reserved: ready to the end
        _attempts(rng, life, job_id)
    return record


def _delayed(rng: random.Random, life: _Life, event: str, at: int, delay: int,
             job_id: int, reason: str = "") -> None:
    """A put or release with ``delay`` (ms); a delayed job is then promoted, a little late."""
    due = at + delay if delay else 0
    life.step(event, at, "delayed" if delay else "ready", delay_ms=delay, due_ms=due,
              reason=reason)
    if not delay or delay > 5 * 3_600_000:
        return
    promoted = due + rng.choice((0, 0, 3, 17, 250, 1_250))
    life.step("promoted", promoted, "ready", due_ms=due if job_id % 3 == 0 else 0)
    life.record.lateness.append(Measure(life.job.tube, promoted, promoted - due))


def _attempts(rng: random.Random, life: _Life, job_id: int) -> None:
    record, job = life.record, life.job
    for _ in range(5):
        assert life.ready_since is not None
        reserved = life.now + rng.choice((0, 1, 40, 900, 4_000, 65_000, 200_000))
        job.tries += 1
        life.step("reserved", reserved, "reserved")
        record.waits.append(Measure(job.tube, reserved, reserved - life.ready_since))
        life.reserved_since = reserved
        if job_id % 31 == 0 and job.tries == 2:
            return  # still reserved when the recording ends
        outcome = rng.choices(("delete", "touch", "release", "release-later", "timeout", "bury"),
                              weights=(40, 10, 12, 8, 15, 15))[0]
        if outcome == "touch":
            life.step("touched", reserved + life.ttr_ms // 2, "reserved")
            outcome = "delete"
        if outcome == "delete":
            deleted = life.now + rng.randrange(1, 20_000)
            if job_id % 5 < 3:  # a finish: the same delete, answered
                life.step("deleted", deleted, None, reason="finished", size=job_id % 97)
            else:
                life.step("deleted", deleted, None)
            record.processing.append(Measure(job.tube, deleted, deleted - reserved))
            return
        if outcome in ("release", "release-later"):
            delay = 0 if outcome == "release" else rng.choice((2_000, 120_000))
            released = reserved + rng.randrange(10, 5_000)
            if job_id % 3 == 0:  # failed by its holder: a fail, then the release it makes
                life.fail(released)
                _delayed(rng, life, "released", released, delay, job_id, reason="failed")
            else:
                _delayed(rng, life, "released", released, delay, job_id)
        elif outcome == "timeout":
            reason = "disconnect" if job_id % 5 == 0 else "reaped" if job_id % 7 == 3 else ""
            life.step("timed-out", reserved + life.ttr_ms, "ready", reason=reason)
        else:
            # A job policy's bury names its reason; a client's has none.
            why = "max-tries" if job_id % 6 == 1 else "expired" if job_id % 6 == 2 else ""
            buried = reserved + rng.randrange(10, 8_000)
            if why == "max-tries" and job_id % 4 == 1:  # its last try ended by a fail
                life.fail(buried)
            life.step("buried", buried, "buried", reason=why)
            after = rng.choice(("kick", "kick", "delete", "stay"))
            if after == "stay":
                return
            if after == "delete":
                life.step("deleted", life.now + rng.randrange(1, 600_000), None)
                return
            life.step("kicked", life.now + rng.randrange(1, 600_000), "ready")


def events(record: Record) -> list[tuple[str | int, ...]]:
    """The stream the record's workload writes: rows in ``SPARK_DDL`` column order.

    Steps of all jobs are merged by time (ties keep each job's own order, and jobs' order);
    stream ids are ``<time_ms>-<seq>`` with ``seq`` counting within a millisecond, as Redis
    assigns them. The rows come back in a shuffled order: stream order is the report's job.
    """
    merged = [(step[1], job.id, index, job, step)
              for job in record.jobs for index, step in enumerate(job.steps)]
    merged.sort(key=lambda item: (item[0], item[1], item[2]))
    rows: list[tuple[str | int, ...]] = []
    last_ms, seq = -1, 0
    for at, job_id, _, job, (event, _, delay_ms, due_ms, tries, reason, size, error,
                             failures) in merged:
        seq = seq + 1 if at == last_ms else 0
        last_ms = at
        values: dict[str, str | int] = {
            "event": event, "id": job_id, "tube": job.tube, "pri": 100, "delay_ms": delay_ms,
            "ttr_ms": 5_000, "due_ms": due_ms, "tries": tries, "time_ms": at,
            "by": "sim-1", "reason": reason, "size": size, "error": error,
            "failures": failures,
        }
        rows.append((f"{at}-{seq}", *(values[name] for name in FIELDS)))
    random.Random(1).shuffle(rows)
    return rows
