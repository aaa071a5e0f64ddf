"""The Python code the Spark executors run, shipped as one artefact (a zip on their sys.path).

On a cluster the executors must not find herdfence's packages by accident (a shared disk, an editable
install on the worker host): `herdfence up` builds `HERDFENCE_HOME/dist/herdfence-<version>-<hash>.zip`
from the packages listed in pyproject (ingest, fencing, api, deploy, loadgen; *.py files only), passes
it to the job in HERDFENCE_PYFILES, and the job's SparkSession ships it with SparkContext.addPyFile
(the programmatic equivalent of `spark-submit --py-files`). Spark puts the file in every executor's
work dir and inserts it at the front of the Python workers' sys.path, ahead of anything installed.

The zip is content-addressed: same sources → same file name → no rebuild. Third-party libraries
(shapely, h3, pyarrow, ...) are not in it: they contain native code and must be installed on the
executor hosts (the container image does that; the local standalone cluster uses the venv's Python).
"""
from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

from fencing.config import PYFILES_ENV as ENV, Settings, pyfiles_from_env as from_env  # noqa: F401

PACKAGES = ("ingest", "fencing", "api", "deploy", "loadgen")
VERSION = "0.1.0"
ROOT = Path(__file__).resolve().parents[1]


def _sources(root: Path) -> list[tuple[Path, str]]:
    out = []
    for pkg in PACKAGES:
        base = root / pkg
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root)
            if "node_modules" in rel.parts or "__pycache__" in rel.parts:
                continue
            out.append((path, rel.as_posix()))
    return out


def build(settings: Settings, root: Path = ROOT) -> Path:
    """Build (or reuse) the executors' zip in HERDFENCE_HOME/dist; returns its path."""
    return build_into(settings.home / "dist", root)


def build_into(dist: Path, root: Path = ROOT, name: str | None = None) -> Path:
    """The zip in `dist` (name: herdfence-<version>-<content hash>.zip unless given)."""
    files = _sources(root)
    if not files:
        raise RuntimeError(f"no herdfence packages under {root}")
    digest = hashlib.sha256()
    for path, arc in files:
        digest.update(arc.encode() + b"\0" + path.read_bytes() + b"\0")
    target = Path(dist) / (name or f"herdfence-{VERSION}-{digest.hexdigest()[:12]}.zip")
    if target.exists():
        return target
    dist.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".zip.tmp")
    # Fixed timestamps: the same sources give a byte-identical zip.
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path, arc in files:
            info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    # Older builds stay: a running driver may still serve one to an executor that joins later.
    os.replace(tmp, target)
    return target


def main(argv: list[str] | None = None) -> None:
    """`python -m deploy.artifact DIR [NAME]`: build the zip into DIR (the container image does this)."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit("usage: python -m deploy.artifact DIR [NAME]")
    print(build_into(Path(args[0]), name=args[1] if len(args) > 1 else None))


if __name__ == "__main__":
    main()
