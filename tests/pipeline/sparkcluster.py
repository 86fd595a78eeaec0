"""A Spark standalone cluster and a Spark Connect server on loopback, from pyspark's own package.

Owns the cluster tests' JVMs: a Master and Workers (``bin/spark-class ...deploy.master.Master``
and ``...deploy.worker.Worker``) and a Spark Connect server (``bin/spark-submit --class
...SparkConnectServer``, what ``sbin/start-connect-server.sh`` runs without daemonizing), with
``SPARK_HOME`` = the installed ``pyspark`` package, as README's "Cluster use" does by hand.

Rules:

* Each JVM is a child of the test process: spark-class and spark-submit ``exec`` the JVM, so the
  child's PID is the JVM's. It is stopped by that PID (SIGTERM, then SIGKILL after a bound) when
  its context manager exits, also on failure, and the kernel sends it SIGTERM if the test process
  dies first. Executors are the Workers' children: a Worker kills them when it stops.
* Nothing listens beyond 127.0.0.1 and nothing is written outside the given directory: every
  port is a free loopback port (the Master's REST server, 6066 by default, is off; the web UIs
  get free ports), and ``SPARK_CONF_DIR``, ``SPARK_LOG_DIR``, ``SPARK_PID_DIR``,
  ``SPARK_LOCAL_DIRS``, the drivers' and executors' ``java.io.tmpdir`` and the Workers' work
  dirs (by default a folder inside the pyspark package) are under it.
* Sizes are modest: each Worker offers 1 core and 1 GiB (an executor's default), each daemon
  JVM gets a 512 MiB heap.
* The drivers (``tubeq-pipeline`` run as a user runs it) get :meth:`Cluster.environment`:
  Python workers on this interpreter, which has tubeq installed (the "installed on every node"
  that README asks of a cluster), and the same configuration directory.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from tests.pipeline.sparks import JVM_OPTIONS
from tests.support.servers import LOOPBACK, port_accepts, stop_child
from tubeq.redisio.process import _parent_death_hook, free_port

SPARK_HOME = Path(pyspark.__file__).parent
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# A JVM's start on two cores shared with other test runs: the Connect server answered about
# 40 s after its start, the Workers registered about 18 s after theirs (load average 13).
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
WORKER_CORES = 1
WORKER_MEMORY = "1g"
DAEMON_MEMORY = "512m"
WORKER_REGISTERED = "Successfully registered with master"


def spark_defaults(root: Path) -> dict[str, str]:
    """spark-defaults.conf of the cluster's configuration directory, read by the Master, the
    Workers, the Connect server and every driver started with :meth:`Cluster.environment`."""
    tmpdir = f"-Djava.io.tmpdir={root / 'tmp'}"
    return {
        # The Master's REST submission server listens on 6066 by default: not wanted here.
        "spark.master.rest.enabled": "false",
        # A driver's and the Connect server's web UI: not needed, so no port.
        "spark.ui.enabled": "false",
        # Spark's default 200 shuffle partitions for a few hundred events on two 1-core
        # executors cost minutes under load; a cluster's own spark-defaults.conf sizes it.
        "spark.sql.shuffle.partitions": "4",
        # The Connect server keeps a folder per session in java.io.tmpdir
        # (spark_connect_model_cache/<session id>) and leaves it there when it stops.
        "spark.driver.extraJavaOptions": tmpdir,
        # Executors compile with C1 only, as every JVM of the pipeline tests (sparks.py).
        "spark.executor.extraJavaOptions": f"{tmpdir} {JVM_OPTIONS}",
    }


class ClusterStartError(RuntimeError):
    """A JVM of the cluster exited, or was not ready in time; the message carries its log."""


@dataclass
class SparkJvm:
    """One JVM child: what it is, its process and where its output goes."""

    label: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to its PID, then SIGKILL after a bound. Idempotent."""
        stop_child(self.proc, STOP_TIMEOUT_S)

    def check_running(self) -> None:
        if self.proc.poll() is not None:
            raise ClusterStartError(f"{self.label} exited with status {self.proc.returncode}"
                                    f"\n--- its output ---\n{self.log_tail()}")


@dataclass
class Cluster:
    """A running standalone cluster: where its master is and what its drivers need."""

    root: Path
    master_url: str
    jvms: list[SparkJvm] = field(default_factory=list)
    work_dirs: list[Path] = field(default_factory=list)

    def environment(self) -> dict[str, str]:
        """The environment of every JVM of the cluster, and of a ``tubeq-pipeline --master``
        driver on it."""
        return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": LOOPBACK,
                "SPARK_CONF_DIR": str(self.root / "conf"),
                "SPARK_LOG_DIR": str(self.root / "logs"),
                "SPARK_PID_DIR": str(self.root / "pids"),
                "SPARK_LOCAL_DIRS": str(self.root / "local"),
                "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
                "PYSPARK_PYTHON": sys.executable}

    def spawn(self, label: str, argv: list[str]) -> SparkJvm:
        """Start ``argv`` (a script that execs a JVM) with its output in ``logs/<label>.log``."""
        log_path = self.root / "logs" / f"{label}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(argv, env=self.environment(), cwd=self.root,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    preexec_fn=_parent_death_hook())
        jvm = SparkJvm(label, proc, log_path)
        self.jvms.append(jvm)
        return jvm

    def stop(self) -> None:
        """Stop every JVM this cluster started, the last started first."""
        for jvm in reversed(self.jvms):
            jvm.stop()


def _wait_until(jvm: SparkJvm, ready: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        jvm.check_running()
        if check():
            return
        time.sleep(0.25)
    raise ClusterStartError(f"{jvm.label} was not {ready} within {START_TIMEOUT_S:.0f} s"
                            f"\n--- its output ---\n{jvm.log_tail()}")


def _write_defaults(conf_dir: Path, settings: Mapping[str, str]) -> None:
    conf_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"{key} {value}" for key, value in settings.items()]
    (conf_dir / "spark-defaults.conf").write_text("\n".join(lines) + "\n")


@contextlib.contextmanager
def standalone_cluster(root: Path, workers: int = 2) -> Iterator[Cluster]:
    """A Master and ``workers`` Workers (each its own JVM) on loopback, everything under
    ``root``; every JVM stopped when the block exits, however it exits."""
    for folder in ("logs", "pids", "local", "tmp"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    _write_defaults(root / "conf", spark_defaults(root))
    port = free_port()
    cluster = Cluster(root, f"spark://{LOOPBACK}:{port}")
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    try:
        master = cluster.spawn("master", [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
            "--port", str(port), "--webui-port", str(free_port())])
        _wait_until(master, "listening", lambda: port_accepts(LOOPBACK, port))
        started = []
        for number in range(1, workers + 1):
            work_dir = root / f"worker-{number}"
            work_dir.mkdir()
            cluster.work_dirs.append(work_dir)
            started.append(cluster.spawn(f"worker-{number}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK,
                "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                "--webui-port", str(free_port()), "--work-dir", str(work_dir),
                cluster.master_url]))
        for worker in started:
            _wait_until(worker, "registered with the master",
                        lambda worker=worker: WORKER_REGISTERED in worker.log_tail(100_000))
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def connect_server(cluster: Cluster) -> Iterator[str]:
    """A Spark Connect server whose applications run on ``cluster``; yields its ``sc://`` URL
    once it accepts connections, and stops it when the block exits, however it exits."""
    port = free_port()
    server = cluster.spawn("connect-server", [
        str(SPARK_HOME / "bin" / "spark-submit"), "--class", CONNECT_SERVER_CLASS,
        "--name", "Spark Connect server", "--master", cluster.master_url,
        "--conf", f"spark.connect.grpc.binding.address={LOOPBACK}",
        "--conf", f"spark.connect.grpc.binding.port={port}"])
    try:
        _wait_until(server, "listening", lambda: port_accepts(LOOPBACK, port))
        yield f"sc://{LOOPBACK}:{port}"
    finally:
        server.stop()
        cluster.jvms.remove(server)
