"""Warms the Python planner of the job's data source in a standby job (issue 19).

Spark plans each micro-batch of a Python data source in a `plan_data_source_read` Python worker that
unpickles the source's reader, so it imports the job's source and everything it imports. A standby
that has never run the query starts that daemon and its worker only in its first batch after the
take-over: about 3 s of a take-over measured here. Reading a tiny batch source of the same kind
(whose module imports the job's source) starts the daemon and leaves a warm, reused worker with
those modules loaded."""
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
