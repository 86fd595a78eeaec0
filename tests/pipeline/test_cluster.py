"""The pipeline on a real Spark cluster, run as a user runs it, with the figures of a local run.

A Spark standalone Master and two Workers (each its own JVM, tests/pipeline/sparkcluster.py) run
``tubeq-pipeline --master spark://... archive --once`` and ``report``; a Spark Connect server on
that cluster runs ``tubeq-pipeline --remote sc://... report``. Every command on the cluster is the
installed console script in its own process, started outside the repository (the Python workers
import tubeq as installed, not from a working directory). Each report's tables must equal, row for
row, the tables of a local run archiving and reporting the same stream (the same commands through
:func:`tubeq.pipeline.cli.main`, on the test process's local[2] session: two processes of their own
would cost two JVM starts and prove nothing the cluster runs do not); the workload's own record
(tests/pipeline/workload.py) checks that the local run is not wrong too. The standalone run
computes the percentiles on the executors' Python workers (``--driver-samples 0``), the local
and Connect runs in their drivers; the Connect run's tables are written by Spark, on the server.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import redis
from pyspark.sql import SparkSession

from tests.pipeline import eventstream, workload
from tests.pipeline.sparkcluster import Cluster, connect_server, standalone_cluster
from tubeq.pipeline import cli
from tubeq.redisio.process import RedisProcess

# A driver's JVM start and its jobs, on two cores that other test runs share: measured from 15 s
# (archive --once on the cluster) to five and a half minutes (a report on the cluster with
# Spark's 200 shuffle partitions, load average 13).
COMMAND_TIMEOUT_S = 900
pytestmark = [pytest.mark.spark_cluster, pytest.mark.timeout(4 * COMMAND_TIMEOUT_S)]

TUBEQ_PIPELINE = Path(sys.executable).with_name("tubeq-pipeline")


@dataclass(frozen=True)
class Stream:
    """The workload's events in a private Redis, and how many there are."""

    redis_url: str
    prefix: str
    events: int
    puts: int


@dataclass(frozen=True)
class Run:
    """Where one run of archive and report wrote, and what archive printed."""

    archive: Path
    report: Path
    archive_output: str


def tubeq_pipeline(cwd: Path, env: dict[str, str] | None, *args: str) -> str:
    """Run the installed ``tubeq-pipeline ARGS`` in ``cwd``; its stdout, or a failure that
    shows its stderr."""
    done = subprocess.run([str(TUBEQ_PIPELINE), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"tubeq-pipeline {' '.join(args)}: {done.stderr}"
    return done.stdout


def archive_and_report(root: Path, stream: Stream, command: Callable[..., str],
                       *report_options: str) -> Run:
    """``archive --once`` of the stream, then ``report`` of that archive, each run by
    ``command`` (its arguments in, its stdout out)."""
    archive, report = root / "archive", root / "report"
    output = command("archive", "--redis", stream.redis_url, "--prefix", stream.prefix,
                     "--out", str(archive), "--checkpoint", str(root / "checkpoint"), "--once")
    command("report", "--archive", str(archive), "--out", str(report), *report_options)
    return Run(archive, report, output)


def on_cluster(root: Path, cluster: Cluster) -> Callable[..., str]:
    """The installed ``tubeq-pipeline --master <the cluster> ARGS``, in ``root``."""
    return lambda *args: tubeq_pipeline(root, cluster.environment(), "--master",
                                        cluster.master_url, *args)


def in_process(spark: SparkSession) -> Callable[..., str]:
    """``tubeq-pipeline ARGS`` through :func:`cli.main` on ``spark``."""
    def command(*args: str) -> str:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            status = cli.main(list(args), spark=spark)
        assert status == 0, f"tubeq-pipeline {' '.join(args)}: exit status {status}"
        return printed.getvalue()
    return command


def figures(report: Path) -> dict[str, Any]:
    """Every table of a report (rows sorted, so partitioning does not matter) and the data of
    report.html's charts."""
    tables: dict[str, Any] = {
        table.name: sorted((row for row in pq.read_table(table).to_pylist()),
                           key=lambda row: json.dumps(row, sort_keys=True, default=str))
        for table in sorted(report.iterdir()) if table.is_dir()}
    page = (report / "report.html").read_text(encoding="utf-8")
    charts = re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                       page, re.DOTALL)
    assert charts is not None, "report.html has no chart data"
    tables["report.html charts"] = json.loads(charts.group(1))
    return tables


def executors(cluster: Cluster) -> list[set[str]]:
    """Per Worker, the applications it ran an executor for (its work dir's app-* folders)."""
    return [{path.name for path in work_dir.iterdir()} for work_dir in cluster.work_dirs]


def archived_events(output: str) -> int:
    found = re.search(r"^archive: (\d+) events in \d+ batches", output, re.MULTILINE)
    assert found is not None, output
    return int(found.group(1))


@pytest.fixture(scope="module")
def stream(redis_process: RedisProcess) -> Stream:
    record = workload.simulate(jobs=120)
    prefix = eventstream.fresh_prefix()
    client = redis.Redis.from_url(redis_process.url)
    try:
        count = eventstream.write_rows(client, eventstream.key_of(prefix), workload.events(record))
    finally:
        client.close()
    puts = sum(1 for job in record.jobs for step in job.steps if step[0] == "put")
    return Stream(redis_process.url, prefix, count, puts)


@pytest.fixture(scope="module")
def local_run(stream: Stream, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The reference: archive and report on the test process's local session."""
    run = archive_and_report(tmp_path_factory.mktemp("local"), stream, in_process(spark))
    assert archived_events(run.archive_output) == stream.events
    all_tubes = next(row for row in pq.read_table(run.report / "by_tube").to_pylist()
                     if row["tube"] == "*")
    assert all_tubes["put"] == stream.puts
    return run


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as running:
        yield running


def test_archive_and_report_on_a_standalone_cluster_equal_the_local_run(
        stream: Stream, local_run: Run, cluster: Cluster,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    before = executors(cluster)
    root = tmp_path_factory.mktemp("on-cluster")
    # The percentiles on the executors' Python workers (the local run computes them in its
    # driver): the two ways give the same figures.
    run = archive_and_report(root, stream, on_cluster(root, cluster), "--driver-samples", "0")
    assert archived_events(run.archive_output) == stream.events
    assert figures(run.report) == figures(local_run.report)
    # The cluster did the work: both applications (archive, report) had an executor on each
    # Worker.
    assert [len(after - earlier) for earlier, after in zip(before, executors(cluster),
                                                           strict=True)] == [2, 2]


def test_report_through_spark_connect_on_the_cluster_equals_the_local_run(
        local_run: Run, cluster: Cluster, tmp_path: Path) -> None:
    before = executors(cluster)
    with connect_server(cluster) as url:
        tubeq_pipeline(tmp_path, cluster.environment(), "--remote", url, "report",
                       "--archive", str(local_run.archive), "--out", str(tmp_path / "report"))
    assert figures(tmp_path / "report") == figures(local_run.report)
    # The Connect server's application ran on the cluster's executors, one on each Worker.
    assert [len(after - earlier) for earlier, after in zip(before, executors(cluster),
                                                           strict=True)] == [1, 1]
