"""The documentation stays small, current and linked: README.md is a newcomer's page (12 KB at most),
docs/ is reference without history (no history words anywhere in the repository; git keeps history),
the repository stays light (docs/ at most 5 MB), and every relative link in the markdown resolves to
a file (and heading) inside the repository."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_BYTES = 12 * 1024
DOCS_MAX_BYTES = 5 * 1024 * 1024
RESULTS_MAX_BYTES = 2 * 1024 * 1024
# Written this way so that this file does not match itself.
HISTORY = re.compile(r"session [0-9]+|th[i]s session|ne[x]t session", re.IGNORECASE)
# Screenshots the browser test writes; the README shows them before they are committed.
MAY_BE_MISSING = {"docs/img/ui-desktop.png", "docs/img/ui-phone.png"}
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def _markdown() -> list[Path]:
    found = {ROOT / p for p in _tracked() if p.endswith(".md")}
    found |= set((ROOT / "docs").glob("*.md")) | {ROOT / "README.md"}
    return sorted(p for p in found if p.exists())


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    return [m.group(1) for m in LINK.finditer(INLINE_CODE.sub("", text))]


def _broken(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for target in _links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):   # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}: ({target})"
        if file_part.startswith("/") or not dest.is_relative_to(root):
            problems.append(f"{where} points outside the repository")
            continue
        rel = dest.relative_to(root).as_posix()
        if not dest.exists():
            if rel not in MAY_BE_MISSING:
                problems.append(f"{where}: {rel} does not exist")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            problems.append(f"{where}: {rel} has no heading #{anchor}")
    return problems


def test_readme_is_a_short_page():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; at most {README_MAX_BYTES}: move detail to docs/"


def test_no_tracked_file_speaks_of_history():
    found = []
    for rel in _tracked():
        path = ROOT / rel
        if not path.is_file():
            continue                  # deleted in the working tree, not yet committed
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue                  # binary (images)
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert found == [], "history belongs in git, not in files:\n" + "\n".join(found)


def test_docs_stay_light():
    docs = [ROOT / p for p in _tracked() if p.startswith("docs/")]
    total = sum(p.stat().st_size for p in docs if p.is_file())
    assert total <= DOCS_MAX_BYTES, f"docs/ holds {total / 2**20:.1f} MiB of tracked files; at most 5 MiB"
    results = sum(p.stat().st_size for p in docs if p.is_file() and p.suffix == ".json")
    assert results <= RESULTS_MAX_BYTES, f"benchmark results in docs/ take {results / 2**20:.1f} MiB; at most 2 MiB"
    assert not [p for p in docs if p.name.endswith(".beats.json")], "per-beat JSON is not committed"


@pytest.mark.parametrize("pages", ["READMEs", "docs"])
def test_every_relative_link_resolves_inside_the_repository(pages):
    found = [p for p in _markdown() if (p.name == "README.md" if pages == "READMEs" else p.parent == ROOT / "docs")]
    assert found, f"no markdown found for {pages}"
    problems = [problem for page in found for problem in _broken(page)]
    assert problems == [], "\n".join(problems)


def test_the_link_check_catches_what_it_should(tmp_path):
    """The checker itself: an escape, a missing file, a missing heading; the allowed screenshots, web
    links, anchors that exist and links inside code are fine."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "other.md").write_text("# Other\n\n## Gaps in the broker's log\n")
    page = root / "docs" / "page.md"
    page.write_text("# Top\n[a](../../outside.md) [b](missing.md) [c](other.md#no-such-heading) [d](#top)\n"
                    "[e](other.md#gaps-in-the-brokers-log) ![f](img/ui-phone.png) [g](https://example.org)\n"
                    "`[h](nowhere.md)`\n```\n[i](nowhere.md)\n```\n")
    problems = _broken(page, root)
    assert len(problems) == 3, problems
    assert "outside the repository" in problems[0] and "docs/missing.md does not exist" in problems[1]
    assert "no heading #no-such-heading" in problems[2]
