"""tubeq's data pipeline on Spark: the ``tubeq-pipeline`` command and the modules behind it.

Needs the optional extra (``pip install 'tubeq[pipeline]'``: pyspark, pyarrow, pandas<3) and
Java 17+. Importing this package imports no PySpark: each command's module is imported when that
command runs (:mod:`tubeq.pipeline.cli`), so the core of tubeq never pays for Spark.
"""
