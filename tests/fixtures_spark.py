"""A process-wide SparkSession for tests (session start costs 6-15 s: pay it once)."""
from __future__ import annotations

import os
import sys
import threading

_lock = threading.Lock()
_spark = None


def get_spark():  # noqa: ANN201 - pyspark.sql.SparkSession
    global _spark
    with _lock:
        if _spark is None:
            from pyspark.sql import SparkSession

            from fencing.stream.spark_session import local_jvm_options
            # Python workers must be this venv's interpreter (pyarrow, ingest/ ...), not `python3`.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            _spark = (SparkSession.builder.master("local[2]").appName("herdfence-tests")
                      .config("spark.sql.shuffle.partitions", "4")
                      .config("spark.ui.enabled", "false")
                      .config("spark.pyspark.python", sys.executable)
                      .config("spark.driver.bindAddress", "127.0.0.1")
                      .config("spark.driver.host", "127.0.0.1")
                      .config("spark.sql.streaming.stopTimeout", "10s")
                      .config("spark.driver.extraJavaOptions", local_jvm_options(""))
                      .getOrCreate())
        return _spark
