"""deploy/pyspark_bytecode.py: pyspark.zip gets bytecode that zipimport uses, once."""
from __future__ import annotations

import subprocess
import sys
import zipfile

from deploy.pyspark_bytecode import MARKER, compile_zip, pyspark_zip


def test_a_compiled_zip_is_imported_from_its_bytecode_and_compiled_once(tmp_path):
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("herdpkg/__init__.py", "")
        z.writestr("herdpkg/mod.py", "ANSWER = 42\ndef where():\n    raise RuntimeError('here')\n")
    assert compile_zip(archive) == 2
    assert compile_zip(archive) == 0                      # the marker: nothing to do again
    with zipfile.ZipFile(archive) as z:
        assert {"herdpkg/mod.py", "herdpkg/mod.pyc", MARKER} <= set(z.namelist())
    probe = ("import herdpkg.mod as m, traceback\nprint(m.ANSWER, m.__file__.endswith('.pyc'))\n"
             "try:\n    m.where()\nexcept RuntimeError:\n    print('lib.zip' in traceback.format_exc())\n")
    out = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(archive)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["42", "True", "True"]                 # loaded from the .pyc; tracebacks name the archive


def test_the_installed_pyspark_zip_was_compiled_by_setup():
    path = pyspark_zip()
    assert path is not None, "pip's pyspark has python/lib/pyspark.zip"
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
    assert MARKER in names and "pyspark/sql/session.pyc" in names
