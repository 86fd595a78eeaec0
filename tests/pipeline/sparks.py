"""The pipeline tests' Spark: one local SparkSession per test process, and how their JVMs run.

Rules:

* One session per test process, not per module: :func:`local_spark` starts it at the first
  module that asks, and the next modules get the same one (bench/RESULTS-pipeline.md: a
  session's start took 12 CPU-s, a 1,000-event report in the fresh JVM 59 CPU-s and the same
  report warm 28). A module that asks for another master (the writer's
  ``local[2,2]``, whose tasks are retried once) stops it and starts its own. The
  ``pipeline_spark`` fixture (conftest.py) stops the last one when the test process ends.
* The session's environment (workers on this interpreter, Spark's listeners on 127.0.0.1) is set
  while a session runs and restored when it stops; every session registers the ``tubeq`` format.
* A module that changes a session setting sets it back (``spark.conf.unset``) before it ends.
* :data:`JVM_OPTIONS`: every JVM the pipeline tests start (this session's, a ``tubeq-pipeline``
  subprocess's, the standalone cluster's) compiles with C1 only. Tests run short JVMs, which
  spend much of their CPU in the C2 compiler for code that never gets hot: a 40-job report in a
  fresh JVM took 63 s of CPU with both compilers and 43 s with C1 alone, in the same wall time
  (AMD EPYC, 2 cores). It changes how fast Spark's code runs, not what it computes; the product
  does not set it (a 10M-event report lives on the code C2 compiles).
"""

from __future__ import annotations

import os
import sys
from typing import Final

from pyspark.sql import SparkSession

from tubeq.pipeline import source

JVM_OPTIONS: Final = "-XX:TieredStopAtLevel=1"
# spark-submit adds SPARK_SUBMIT_OPTS to the JVM it starts: PySpark's own (this process's
# session), a tubeq-pipeline command's and the Connect server's. The standalone Master and
# Workers read SPARK_DAEMON_JAVA_OPTS; executors get theirs from spark-defaults (sparkcluster.py).
# TUBEQ_SPARK_CLASS_ARCHIVE=0: a tubeq-pipeline subprocess of these tests neither writes nor
# maps the class archive in the user's cache (writing it costs the run that does 12-30 s and
# 150-190 MB); test_class_archive.py proves it in a cache of its own.
JVM_ENVIRONMENT: Final = {"SPARK_SUBMIT_OPTS": JVM_OPTIONS, "SPARK_DAEMON_JAVA_OPTS": JVM_OPTIONS,
                          "TUBEQ_SPARK_CLASS_ARCHIVE": "0"}
DEFAULT_MASTER: Final = "local[2]"
_SESSION_ENVIRONMENT: Final = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}

_running: SparkSession | None = None
_running_master: str | None = None
_saved_environment: dict[str, str | None] = {}


def local_spark(master: str = DEFAULT_MASTER) -> SparkSession:
    """This process's local SparkSession on ``master``: the running one if it has that master,
    else a new one (the running one stopped first)."""
    global _running, _running_master
    if _running is not None and _running_master == master:
        return _running
    stop_local_spark()
    _saved_environment.update({key: os.environ.get(key) for key in _SESSION_ENVIRONMENT})
    os.environ.update(_SESSION_ENVIRONMENT)
    session = (SparkSession.builder.master(master).appName("tubeq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    source.register(session)
    _running, _running_master = session, master
    return session


def stop_local_spark() -> None:
    """Stop this process's session, if one runs, and restore the environment it set."""
    global _running, _running_master
    if _running is None:
        return
    try:
        _running.stop()
    finally:
        _running = _running_master = None
        for key, value in _saved_environment.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _saved_environment.clear()
