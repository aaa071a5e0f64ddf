"""The SparkSession of the job (and of the test suite): loopback only, no UI, Arrow on."""
from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def build_session(master: str, app_name: str = "herdfence", shuffle_partitions: int = 4) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
               .config("spark.python.worker.reuse", "true")
               .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
               .config("spark.driver.memory", os.environ.get("HERDFENCE_DRIVER_MEMORY", "2g"))
               .config("spark.executorEnv.PYTHONHASHSEED", "0"))
    if master.startswith("local"):
        builder = builder.config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
