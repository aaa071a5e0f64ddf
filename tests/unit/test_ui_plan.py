"""The strip plan's geometry (api/ui/js/plan.js), run in node: equal-width strips that cover the paddock."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from shapely.geometry import shape
from shapely.ops import unary_union

PLAN = Path(__file__).resolve().parents[2] / "api" / "ui" / "js" / "plan.js"
NODE = shutil.which("node")


def _split(geometry: dict, n: int) -> list[dict]:
    script = (f"import('{PLAN.as_uri()}').then(m => process.stdout.write(JSON.stringify("
              f"m.splitIntoStrips({json.dumps(geometry)}, {n}))))")
    out = subprocess.run([NODE, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(NODE is None, reason="node is not installed")
@pytest.mark.parametrize("n", [2, 3, 5])
def test_strips_are_valid_equal_width_and_cover_the_paddock(n):
    # a skewed quadrilateral, wider east-west than north-south (at 60°N a degree of longitude is ~55 km)
    paddock = {"type": "Polygon", "coordinates": [[[17.650, 59.810], [17.660, 59.8105], [17.6615, 59.8150],
                                                   [17.6505, 59.8148], [17.650, 59.810]]]}
    strips = [shape(g) for g in _split(paddock, n)]
    assert len(strips) == n and all(s.is_valid and s.area > 0 for s in strips)
    whole = shape(paddock)
    assert unary_union(strips).symmetric_difference(whole).area < whole.area * 1e-4   # corners are rounded to 1e-7°
    assert sum(a.intersection(b).area for i, a in enumerate(strips) for b in strips[i + 1:]) < whole.area * 1e-4   # corners are rounded to 1e-7°
    widths = [s.bounds[2] - s.bounds[0] for s in strips]      # cut across the longer (east-west) side
    inner = widths[1:-1] or widths
    assert max(inner) - min(inner) < 1e-6, widths
    assert [s.bounds[0] for s in strips] == sorted(s.bounds[0] for s in strips), "west to east"


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_a_paddock_longer_north_south_is_cut_north_to_south():
    paddock = {"type": "Polygon", "coordinates": [[[17.650, 59.80], [17.652, 59.80], [17.652, 59.83],
                                                   [17.650, 59.83], [17.650, 59.80]]]}
    strips = [shape(g) for g in _split(paddock, 3)]
    tops = [s.bounds[3] for s in strips]
    assert tops == sorted(tops, reverse=True) and len({round(s.bounds[2] - s.bounds[0], 9) for s in strips}) == 1
