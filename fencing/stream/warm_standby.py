"""What a standby job runs, besides the keep-warm tasks, so that its first batch after a take-over
pays no start-up (issue 19).

1. The source's planner. Spark plans each micro-batch of a Python data source in a `plan_data_source_read` Python worker that
unpickles the source's reader, so it imports the job's source and everything it imports. A standby
that has never run the query starts that daemon and its worker only in its first batch after the
take-over: about 3 s of a take-over measured here. Reading a tiny batch source of the same kind
(whose module imports the job's source) starts the daemon and leaves a warm, reused worker with
those modules loaded.
2. The batch's operators. A first batch of two reports took 1.8 s, the next ones 0.4 s: the JVM
loads and compiles the shuffle, the Arrow exchange with Python and the Arrow collect the first time
a query runs them. A dry run of the same operators on a few empty rows does that beforehand, once:
the JVM keeps what it loaded and compiled (each run cost ~0.5 core-s, every 45 s)."""
from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader

import fencing.stream.report_source  # noqa: F401 - what the real source's planner imports

NAME = "herdwarmplanner"


class _WarmReader(DataSourceReader):
    def read(self, partition):  # noqa: ANN001, ANN201 - pyspark's InputPartition, an iterator
        yield (1,)


class PlannerWarmup(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return "n int"

    def reader(self, schema) -> _WarmReader:  # noqa: ANN001 - StructType
        return _WarmReader()


def warm_planner(spark) -> int:  # noqa: ANN001 - SparkSession
    spark.dataSource.register(PlannerWarmup)
    return len(spark.read.format(NAME).load().collect())


def _no_output(batches):  # noqa: ANN001, ANN202 - Arrow record batches in and out
    for _ in batches:
        pass
    return iter(())


BATCH_PATH_GROUP = "herdfence-warm-batch-path"     # its Spark jobs' group (what a test counts)


def warm_batch_path(spark, partitions: int) -> None:  # noqa: ANN001 - SparkSession
    """The micro-batch's operators (fencing.stream.job): repartition by route, mapInArrow, toArrow."""
    from fencing.stream.rows import OUTPUT_DDL
    sc = spark.sparkContext
    sc.setLocalProperty("spark.jobGroup.id", BATCH_PATH_GROUP)    # only what `finally` clears
    try:
        rows = spark.range(0, 4 * partitions, 1, 2).selectExpr("cast(1 as tinyint) as kind", "id as route",
                                                              "cast('' as binary) as payload")
        rows.repartition(partitions, "route").mapInArrow(_no_output, OUTPUT_DDL).toArrow()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)     # the thread's later jobs are not in it
