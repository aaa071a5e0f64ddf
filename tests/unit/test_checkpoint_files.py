"""The job's checkpoint file manager (fencing.stream.spark_session.CHECKPOINT_FILE_MANAGER), on the
real Spark JVM: a batch's file, once written, is never replaced by a second writer — what keeps a
resumed old driver (SIGSTOP past its lease) from rewriting the plan of the job that took over."""
from __future__ import annotations

import pytest
from py4j.protocol import Py4JJavaError

from fencing.stream.spark_session import CHECKPOINT_FILE_MANAGER
from tests.fixtures_spark import get_spark


def _write(manager, path, text: str) -> None:
    out = manager.createAtomic(path, False)          # overwriteIfPossible=false, as the offset log asks
    out.write(bytearray(text.encode()))
    out.close()


@pytest.mark.parametrize("name", [CHECKPOINT_FILE_MANAGER,
                                  "org.apache.spark.sql.execution.streaming.checkpointing."
                                  "FileContextBasedCheckpointFileManager"])
def test_a_written_batch_file_is_never_replaced(tmp_path, name):
    spark = get_spark()
    jvm = spark._jvm
    folder = jvm.org.apache.hadoop.fs.Path(str(tmp_path / "offsets"))
    manager = getattr(jvm, name)(folder, spark._jsc.hadoopConfiguration())
    manager.mkdirs(folder)
    batch = jvm.org.apache.hadoop.fs.Path(folder, "7")
    _write(manager, batch, "the plan of the job that took over")
    with pytest.raises(Py4JJavaError, match="FileAlreadyExists|already exists"):
        _write(manager, batch, "the resumed old driver's plan")
    assert (tmp_path / "offsets" / "7").read_text() == "the plan of the job that took over"
