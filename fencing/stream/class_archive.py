"""Where the Spark JVMs' class-data archive lives, and the JVM option that uses it.

`make setup` (deploy/jvm_archive.py) writes one archive of the classes a job loads beside pyspark's
jars. Every JVM Spark's launcher starts from those jars gets the same classpath (the driver, and on
the embedded standalone cluster the master, the workers and their executors), so each can map its
classes from it instead of parsing them. A JVM that finds the archive stale starts without it.
No pyspark import here: the CLI starts the cluster's daemons with it.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

CLASS_ARCHIVE = "herdfence-classes.jsa"


def spark_home() -> Path | None:
    """SPARK_HOME, or the installed pyspark's folder (a pip install); None without pyspark."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    spec = importlib.util.find_spec("pyspark")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def class_archive(home: Path | None = None) -> Path | None:
    """Where `make setup` puts the class-data archive of this pyspark's jars."""
    home = home or spark_home()
    return home / CLASS_ARCHIVE if home is not None else None


def with_class_archive(options: str) -> str:
    """JVM `options` and the class archive when there is one (a JVM maps its classes instead of
    parsing them: 6 core-s to a job's first batch instead of 13). Options that already choose an
    archive or turn sharing off are left as they are."""
    archive = class_archive()
    if archive is None or not archive.is_file() or "SharedArchiveFile" in options or "-Xshare" in options:
        return options
    return f"{options} -XX:SharedArchiveFile={archive}".strip()
