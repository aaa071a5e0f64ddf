"""Byte-compile the pyspark.zip that Spark puts first on every Python worker's path.

Spark starts its Python processes with SPARK_HOME/python/lib/pyspark.zip ahead of site-packages, and
pip's zip holds sources only: zipimport cannot cache bytecode, so each fresh process compiles pyspark
again (1.7 s instead of 0.6 s here). One such process is on the hot standby's critical path: the
streaming source's runner, started with every query, so with every take-over (issue 19).

This rewrites the zip once (`make setup`, the images) with an unchecked hash-based .pyc beside each
.py, which zipimport loads without recompiling; the sources stay, for tracebacks. Idempotent: a marker
entry names the interpreter's bytecode version, so another Python simply finds no usable .pyc and falls
back to the sources.

    python -m deploy.pyspark_bytecode            # the pyspark of this interpreter
"""
from __future__ import annotations

import importlib.util
import os
import sys
import warnings
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc  # the same bytes py_compile writes
from pathlib import Path

from fencing.stream.class_archive import spark_home

MARKER = f"herdfence-bytecode-{importlib.util.MAGIC_NUMBER.hex()}"


def pyspark_zip() -> Path | None:
    """SPARK_HOME/python/lib/pyspark.zip of the installed pyspark (None: not a pip layout)."""
    home = spark_home()
    if home is None:
        return None
    path = home / "python" / "lib" / "pyspark.zip"
    return path if path.is_file() else None


def compile_zip(path: Path) -> int:
    """Add bytecode to `path` in place (atomically); the number of modules compiled, 0 if done before."""
    with zipfile.ZipFile(path) as src:
        names = src.namelist()
        if MARKER in names:
            return 0
        tmp = path.with_suffix(".zip.tmp")
        compiled = 0
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for info in src.infolist():
                data = src.read(info)
                if info.filename.endswith(".pyc"):
                    continue                     # an older run's, for another interpreter: replaced
                out.writestr(info, data)
                if not info.filename.endswith(".py"):
                    continue
                # the file name zipimport itself gives a module it compiles from this archive
                with warnings.catch_warnings():      # pyspark's own test modules warn; not ours to fix
                    warnings.simplefilter("ignore")
                    code = compile(data, f"{path}{os.sep}{info.filename}", "exec", dont_inherit=True)
                pyc = _code_to_hash_pyc(code, importlib.util.source_hash(data), checked=False)
                out.writestr(zipfile.ZipInfo(info.filename + "c", date_time=info.date_time), bytes(pyc))
                compiled += 1
            out.writestr(MARKER, sys.version)
    os.replace(tmp, path)
    return compiled


def main() -> None:
    path = pyspark_zip()
    if path is None:
        print("pyspark_bytecode: no pyspark.zip to compile", file=sys.stderr)
        return
    n = compile_zip(path)
    if n:
        print(f"pyspark_bytecode: {n} modules of {path} byte-compiled", file=sys.stderr)


if __name__ == "__main__":
    main()
