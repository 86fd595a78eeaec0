"""GET /metrics: the Prometheus exposition of this process's counters and the namespace's jobs.

At scrape time, and only then, this reads what the hot path counted in plain Python
(tubeq.server.stats.CommandCounters, tubeq.server.metrics.Metrics) and what lives in Redis (the
first --metrics-max-tubes tubes' job counts and the rest's sum in one overview.lua call, the
shared stats; neither reads every tube), and hands a snapshot to prometheus_client through a
custom collector. The hot path never touches prometheus_client.

Two kinds of series, named so a dashboard cannot mix them up:

* per process (``tubeq_commands_total``, histograms, connections...): what this process did;
  sum them over the processes of a namespace.
* namespace-wide, read from Redis (``tubeq_jobs``, ``tubeq_tube_*``, ``tubeq_namespace_*``,
  ``tubeq_job_timeouts_total``): every process of the namespace reports the same value; take
  ``max`` over them, never ``sum``.

The metric list, with types and labels, is in README.md ("Operating tubeq").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from tubeq import __version__
from tubeq.http.common import server_of
from tubeq.server import ops
from tubeq.server.metrics import OTHER_TUBE, Histogram, Metrics
from tubeq.server.process import Server
from tubeq.store.records import TubeCounts

STATES = ("ready", "reserved", "delayed", "buried")


@dataclass
class Snapshot:
    """What one scrape reports, gathered before rendering (the collector itself is sync)."""

    server: Server
    metrics: Metrics
    commands: dict[str, int]
    tube_count: int
    tubes: list[TubeCounts]
    gauges: list[int]  # stats.lua's: urgent ... waiting
    named: dict[str, int]  # the namespace's shared stats counters
    instances: int
    waiting_here: int


class SnapshotCollector(Collector):
    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        s = self.snap
        m = s.metrics
        ctx = s.server.ctx
        assert ctx is not None

        info = GaugeMetricFamily("tubeq_info", "This tubeq process.",
                                 labels=["version", "instance_id", "prefix"])
        info.add_metric([__version__, s.server.instance_id, s.server.config.prefix], 1)
        yield info

        commands = CounterMetricFamily(
            "tubeq_commands", "Commands received by this process, by name (the counts behind "
            "the stats reply's cmd-* fields, which sum them over the namespace).",
            labels=["command"])
        for name, n in sorted(s.commands.items()):
            commands.add_metric([name], n)
        yield commands

        outcomes = CounterMetricFamily(
            "tubeq_command_outcomes", "Replies this process sent, by command and outcome (the "
            "reply's first word: INSERTED, NOT_FOUND, TIMED_OUT...).",
            labels=["command", "outcome"])
        for (name, word), n in sorted(m.outcomes.items()):
            outcomes.add_metric([name, word.decode(errors="replace")], n)
        yield outcomes

        def transitions(name: str, doc: str, value: int) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc)
            family.add_metric([], value)
            return family

        yield transitions("tubeq_job_releases", "Jobs released by this process's clients.",
                          _outcome(m, "release", b"RELEASED"))
        yield transitions("tubeq_job_buries", "Jobs buried by this process's clients.",
                          _outcome(m, "bury", b"BURIED"))
        yield transitions("tubeq_job_kicks", "Jobs kicked by this process's clients.",
                          m.jobs_kicked)
        yield transitions("tubeq_job_timeouts", "Reservations whose TTR ran out, in the "
                          "namespace (stats job-timeouts; namespace-wide).",
                          s.named.get("job-timeouts", 0))
        yield transitions("tubeq_slow_commands", "Commands slower than --slow-ms (each also "
                          "logged).", m.slow_commands)

        jobs = GaugeMetricFamily(
            "tubeq_jobs", "Jobs by tube and state (namespace-wide). Tubes past "
            f"--metrics-max-tubes are summed under tube=\"{OTHER_TUBE}\".",
            labels=["tube", "state"])
        urgent = GaugeMetricFamily("tubeq_jobs_urgent", "Ready jobs with pri < 1024, by tube "
                                   "(namespace-wide).", labels=["tube"])
        puts = CounterMetricFamily("tubeq_tube_puts", "Jobs ever put to the tube (its "
                                   "total-jobs; namespace-wide; restarts when the tube is "
                                   f"removed; under tube=\"{OTHER_TUBE}\": every other tube's, "
                                   "removed tubes' included).", labels=["tube"])
        deletes = CounterMetricFamily("tubeq_tube_deletes", "Deletes in the tube (its "
                                      "cmd-delete; namespace-wide).", labels=["tube"])
        paused = GaugeMetricFamily("tubeq_tube_paused", "1 while the tube is paused.",
                                   labels=["tube"])
        now = ctx.store.clock()
        for row in s.tubes:
            tube = row.name or OTHER_TUBE
            for state, value in zip(STATES, (row.ready, row.reserved, row.delayed, row.buried),
                                    strict=True):
                jobs.add_metric([tube, state], value)
            urgent.add_metric([tube], row.urgent)
            puts.add_metric([tube], row.total)
            if row.name:  # the summed row has no deletes or pause: not summed (overview.lua)
                deletes.add_metric([tube], row.deletes)
                paused.add_metric([tube], 1 if row.pause_until_ms > now else 0)
        yield from (jobs, urgent, puts, deletes, paused)
        yield _gauge("tubeq_tubes", "Tubes in the namespace (all of them, past the cap too).",
                     s.tube_count)

        yield _tube_histograms("tubeq_job_wait_seconds", "Time from ready to reserved of the "
                               "jobs this process's clients reserved, by tube.", m.wait.by_tube)
        yield _tube_histograms("tubeq_job_run_seconds", "Time from reserved to deleted of the "
                               "jobs this process's clients deleted, by tube.", m.held.by_tube)
        yield _histogram("tubeq_delayed_lateness_seconds", "How late delayed jobs became ready "
                         "(promotion time - due time), promoted by this process.", m.lateness)
        yield _histogram("tubeq_redis_round_trip_seconds", "Redis round trips of this "
                         "process's command connection (a batch written -> its last reply).",
                         m.redis_rtt)
        errors = CounterMetricFamily("tubeq_redis_errors", "Redis error replies (by code) and "
                                     "lost connections (connection_lost).", labels=["kind"])
        for kind, n in sorted(m.redis_errors.items()):
            errors.add_metric([kind], n)
        yield errors

        yield _gauge("tubeq_connections", "Open client connections of this process.",
                     len(ctx.connections))
        opened = CounterMetricFamily("tubeq_connections_opened", "Client connections this "
                                     "process accepted.")
        opened.add_metric([], m.connections_opened)
        yield opened
        yield _gauge("tubeq_waiting_reserves", "Reserves (and HTTP long polls) of this process "
                     "blocked waiting for a job.", s.waiting_here)
        yield _gauge("tubeq_draining", "1 in drain mode (puts answer DRAINING).",
                     1 if ctx.draining else 0)
        (_, _, _, _, _, _, conns, producers, workers, waiting) = s.gauges
        yield _gauge("tubeq_namespace_connections", "Client connections of every process of "
                     "the namespace (stats current-connections).", conns)
        yield _gauge("tubeq_namespace_producers", "stats current-producers.", producers)
        yield _gauge("tubeq_namespace_workers", "stats current-workers.", workers)
        yield _gauge("tubeq_namespace_waiting_reserves", "stats current-waiting.", waiting)
        yield _gauge("tubeq_namespace_servers", "tubeq processes in the namespace.",
                     s.instances)


def _outcome(m: Metrics, command: str, word: bytes) -> int:
    return m.outcomes.get((command, word), 0)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    running = 0
    for bound, n in zip((*h.bounds, float("inf")), h.counts, strict=True):
        running += n
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return out


def _histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc)
    family.add_metric([], _buckets(h), h.sum)
    return family


def _tube_histograms(name: str, doc: str, by_tube: dict[str, Histogram]
                     ) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["tube"])
    for tube, h in sorted(by_tube.items()):
        family.add_metric([tube], _buckets(h), h.sum)
    return family


async def metrics(request: web.Request) -> web.Response:
    server = server_of(request)
    ctx, m = server.ctx, server.metrics
    assert ctx is not None and m is not None
    # Both reads send this process's counts first, so its totals below include everything.
    tube_count, tubes = await ops.tube_overview(ctx, server.config.metrics_max_tubes)
    gauges, named = await ops.namespace_counts(ctx)
    instances = await ctx.store.instances()
    snap = Snapshot(server, m, dict(ctx.counters.totals), tube_count, tubes, gauges, named,
                    len(instances), ctx.registry.count())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snap))
    ProcessCollector(registry=registry)
    return web.Response(body=generate_latest(registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})
