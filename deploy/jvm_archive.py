"""Build the class-data archive the local Spark JVM starts from (`make setup`, the job image).

A Spark driver JVM loads ~15,700 classes before the job's first micro-batch; parsing and verifying them
is most of its start: 13 core-s and 24 s of `herdfence up` here, where a JVM that maps them from an
archive (JDK class data sharing) takes 6 core-s and 17 s (measured 2026-11-28, docs/measurements.md). Every JVM start gains
it: `up`, a job restarted by the supervisor, a new standby, the test suite's ~35 stacks.

The archive is built from a list of the classes a job loads (deploy/spark-classes.txt.gz: recorded from
a job running a batch, with -XX:DumpLoadedClassList) against this pyspark's jars, and written beside
them (fencing.stream.class_archive). The JVM checks it against the jars it names (path,
size, time) and starts without it when they differ, so a stale archive costs the gain, never a start.
Idempotent: an archive the JVM accepts is kept.

    python -m deploy.jvm_archive            # build it if missing or stale
    python -m deploy.jvm_archive --record   # how to record the class list again (printed)
"""
from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deploy.spark_cluster import java_binary
from fencing.stream.class_archive import class_archive, spark_home

CLASS_LIST = Path(__file__).with_name("spark-classes.txt.gz")
RECORD_HELP = """To record the class list again (after a pyspark upgrade), run a job that processes a batch with
  HERDFENCE_JOB_STANDBY=0 HERDFENCE_JVM_OPTIONS="-XX:TieredStopAtLevel=1 -XX:DumpLoadedClassList=/tmp/classes.lst" herdfence up --detach
  herdfence bench push --fences 200 --points 5000 --devices 200 --no-plot; herdfence down
then: gzip -9 -c /tmp/classes.lst > deploy/spark-classes.txt.gz"""


def spark_classpath(java_bin: str, home: Path) -> str:
    """The driver JVM's -cp exactly as Spark's launcher builds it (the archive is valid only for it)."""
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_SCALA_VERSION": os.environ.get("SPARK_SCALA_VERSION", "2.13")}
    out = subprocess.run([java_bin, "-Xmx128m", "-cp", str(home / "jars" / "*"), "org.apache.spark.launcher.Main",
                          "org.apache.spark.deploy.SparkSubmit", "pyspark-shell"],
                         env=env, capture_output=True, check=True, timeout=60).stdout.decode()
    args = out.split("\0")
    return args[args.index("-cp") + 1]


def accepted(java_bin: str, archive: Path, classpath: str) -> bool:
    """The JVM maps `archive` for this classpath (-Xshare:on fails when it cannot)."""
    if not archive.is_file():
        return False
    done = subprocess.run([java_bin, "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", classpath, "-version"],
                          capture_output=True, timeout=60)
    return done.returncode == 0


def build(java_bin: str, archive: Path, classpath: str, class_list: Path = CLASS_LIST) -> int:
    """Dump the archive of the listed classes (atomically); the number of classes listed."""
    with tempfile.TemporaryDirectory(prefix="herdfence-cds-") as tmp:
        listed = Path(tmp) / "classes.lst"
        listed.write_bytes(gzip.decompress(class_list.read_bytes()))
        partial = Path(tmp) / archive.name
        subprocess.run([java_bin, "-Xshare:dump", f"-XX:SharedClassListFile={listed}",
                        f"-XX:SharedArchiveFile={partial}", "-Xlog:cds=off", "-Xlog:cds+heap=off",
                        "-Xlog:gc+verify=off", "-cp", classpath],
                       check=True, capture_output=True, timeout=600)
        shutil.move(str(partial), archive.with_suffix(".tmp"))
        os.replace(archive.with_suffix(".tmp"), archive)
        return sum(1 for line in listed.read_text().splitlines() if line and not line.startswith("#"))


def main(argv: list[str]) -> int:
    if "--record" in argv:
        print(RECORD_HELP)
        return 0
    java_bin, home = java_binary(), spark_home()
    if java_bin is None or home is None:
        print("jvm_archive: no java or no pyspark here; the JVM starts without a class archive", file=sys.stderr)
        return 0
    archive = class_archive(home)
    try:
        classpath = spark_classpath(java_bin, home)
        if accepted(java_bin, archive, classpath):
            return 0
        started = time.monotonic()
        n = build(java_bin, archive, classpath)
    except (subprocess.SubprocessError, OSError, ValueError) as e:     # a faster start missed, never a failure
        print(f"jvm_archive: not built ({e}); the JVM starts without a class archive", file=sys.stderr)
        return 0
    print(f"jvm_archive: {n} classes archived in {time.monotonic() - started:.0f} s ({archive})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
