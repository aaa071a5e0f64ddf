"""The class-data archive the local Spark JVM starts from (deploy/jvm_archive.py): the one `make setup`
built is valid for the classpath Spark's launcher gives the driver, and a stale one costs the faster
start, never the start. Real JVMs; the stale archive is built from a short class list (seconds)."""
from __future__ import annotations

import gzip
import os
import subprocess

import pytest

from deploy import jvm_archive
from deploy.spark_cluster import java_binary
from fencing.stream.class_archive import class_archive, spark_home
from fencing.stream.spark_session import local_jvm_options

JAVA = java_binary()
pytestmark = pytest.mark.skipif(JAVA is None, reason="no java here (make setup installs openjdk-17-jre-headless)")


def test_setup_built_an_archive_the_driver_jvm_accepts_and_the_job_asks_for_it():
    archive = class_archive()
    assert archive is not None and archive.is_file(), "make setup builds it (python -m deploy.jvm_archive)"
    classpath = jvm_archive.spark_classpath(JAVA, spark_home())
    assert jvm_archive.accepted(JAVA, archive, classpath)
    assert f"-XX:SharedArchiveFile={archive}" in local_jvm_options("-XX:TieredStopAtLevel=1").split()
    # an operator's own choice of archive or sharing is left alone
    assert local_jvm_options("-Xshare:off") == "-Xshare:off"


def test_a_stale_archive_is_rebuilt_by_setup_and_never_stops_a_jvm(tmp_path):
    jar = tmp_path / "slf4j-api.jar"                 # a small jar of pyspark's, as the archive's classpath
    jar.write_bytes(next((spark_home() / "jars").glob("slf4j-api-*.jar")).read_bytes())
    short = tmp_path / "classes.txt.gz"
    short.write_bytes(gzip.compress(b"java/lang/Object\njava/lang/String\norg/slf4j/LoggerFactory\n"))
    archive = tmp_path / "test.jsa"
    assert jvm_archive.build(JAVA, archive, str(jar), short) == 3
    assert jvm_archive.accepted(JAVA, archive, str(jar))
    os.utime(jar, (1_000_000_000, 1_000_000_000))    # the jar replaced (pyspark reinstalled): stale
    assert not jvm_archive.accepted(JAVA, archive, str(jar))
    done = subprocess.run([JAVA, f"-XX:SharedArchiveFile={archive}", "-cp", str(jar), "-version"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr        # the JVM starts, without the archive
