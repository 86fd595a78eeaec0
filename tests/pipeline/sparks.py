"""The pipeline tests' SparkSession: one per test module, local, loopback only.

Each module's ``spark`` fixture is ``with local_spark("tubeq-test-<module>") as session``: the
session's environment (workers on this interpreter, Spark's listeners on 127.0.0.1) is set for
the module and restored after it, and every session registers the ``tubeq`` format.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from pyspark.sql import SparkSession

from tubeq.pipeline import source

_ENVIRONMENT = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


@contextlib.contextmanager
def local_spark(app_name: str, master: str = "local[2]") -> Iterator[SparkSession]:
    """A local SparkSession for one test module; stopped, and the environment restored, after."""
    saved = {key: os.environ.get(key) for key in _ENVIRONMENT}
    os.environ.update(_ENVIRONMENT)
    session = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    source.register(session)
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
