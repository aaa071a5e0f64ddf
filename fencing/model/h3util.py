"""Vectorized H3 helpers on uint64 cell arrays (no per-point Python).

Cells are carried as numpy uint64 everywhere inside the job (Arrow-friendly, 8 bytes, sortable);
hex strings only at the edges (Redis keys, JSON).

Why h3ronpy for points: measured here (2 cores, res 9, 1M points) h3ronpy's `coordinates_to_cells`
takes ~0.40 s (~2.5M points/s) against ~0.74 s (~1.35M/s) for a Python loop over the int API of
`h3.latlng_to_cell`, with identical cells; so the loop is not offered.
"""
from __future__ import annotations

import h3
import numpy as np
from h3ronpy.vector import coordinates_to_cells

NULL_CELL = np.uint64(0)  # never a valid H3 index: "no cell" for invalid coordinates

# H3 index bit layout: 4 resolution bits at 52..55, then 15 digits of 3 bits (digit r at (15-r)*3).
_RES_SHIFT = np.uint64(52)
_RES_MASK = np.uint64(0xF) << _RES_SHIFT
_DIGIT_BITS = 3


def resolution_of(cells: np.ndarray) -> np.ndarray:
    """Resolution of each cell (uint8), read from the index bits."""
    cells = np.asarray(cells, dtype=np.uint64)
    return ((cells & _RES_MASK) >> _RES_SHIFT).astype(np.uint8)


def cells_for_points(lat: np.ndarray, lon: np.ndarray, res: int) -> np.ndarray:
    """H3 cell (uint64) of each (lat, lon) in degrees; NULL_CELL (0) where the coordinate is
    non-finite or out of range.

    Why 0 instead of raising: in a stream one bad record must not fail the whole task; the job's
    validation sends such records to the DLQ, and a 0 cell matches no fence if one slips through.
    """
    lat = np.ascontiguousarray(lat, dtype=np.float64)
    lon = np.ascontiguousarray(lon, dtype=np.float64)
    if lat.shape != lon.shape:
        raise ValueError(f"lat and lon differ in shape: {lat.shape} vs {lon.shape}")
    ok = np.isfinite(lat) & np.isfinite(lon) & (np.abs(lat) <= 90.0) & (np.abs(lon) <= 180.0)
    if ok.all():
        return _to_u64(coordinates_to_cells(lat, lon, res))
    out = np.zeros(lat.shape, dtype=np.uint64)
    if ok.any():
        out[ok] = _to_u64(coordinates_to_cells(lat[ok], lon[ok], res))
    return out


def parent(cells: np.ndarray, res: int) -> np.ndarray:
    """Parent of each cell at `res` (uint64), by bit arithmetic: set the resolution field and fill
    the digits below `res` with 7 ("unused"), exactly what h3's cellToParent does.
    NULL_CELL stays NULL_CELL; a cell coarser than `res` raises."""
    cells = np.asarray(cells, dtype=np.uint64)
    if not 0 <= res <= 15:
        raise ValueError(f"resolution {res} out of range 0..15")
    valid = cells != NULL_CELL
    if (resolution_of(cells[valid]) < res).any():
        raise ValueError(f"some cells are coarser than the parent resolution {res}")
    unused = np.uint64((1 << (_DIGIT_BITS * (15 - res))) - 1)  # digits res+1..15 all set to 7
    out = (cells & ~_RES_MASK) | (np.uint64(res) << _RES_SHIFT) | unused
    return np.where(valid, out, NULL_CELL)


def cell_to_str(cell: int | np.integer) -> str:
    """'89283082803ffff' form used in Redis keys and JSON."""
    return h3.int_to_str(int(cell))


def str_to_cell(s: str) -> int:
    return h3.str_to_int(s)


def cells_to_strs(cells: np.ndarray) -> list[str]:
    return [h3.int_to_str(c) for c in np.asarray(cells, dtype=np.uint64).tolist()]


def _to_u64(arrow_array) -> np.ndarray:
    # arro3 arrays implement the buffer protocol / __array__; uint64 without copy where possible
    return np.asarray(arrow_array, dtype=np.uint64)
