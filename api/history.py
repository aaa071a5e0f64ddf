"""History for analysts: the Parquet history the job writes, filtered by farm, device or herd and time,
as GeoJSON (API) or GeoParquet / GeoJSON files (`herdfence export`)."""
from __future__ import annotations

import argparse
import sys

import pyarrow as pa

from api import tenancy
from fencing.model import history
from fencing.model.timeutil import iso, to_ms

MAX_ROWS = 100_000


def farm_history(redis, history_root: str, farm_id: str, *, device_id: str | None, herd: str | None,
                 from_ms: int | None, to_ms_: int | None, limit: int | None) -> pa.Table:
    device_ids = None
    if herd is not None:
        records = redis.hgetall(f"devices:{{{farm_id}}}")
        device_ids = sorted(d for d, raw in records.items() if tenancy.herd_of(raw) == herd)
        if not device_ids:
            return history.HISTORY_SCHEMA.empty_table()
    return history.read(history_root, farm_id, device_id=device_id, device_ids=device_ids,
                        from_ms=from_ms, to_ms=to_ms_, limit=limit)


def as_feature_collection(table: pa.Table) -> dict:
    rows = table.to_pydict()
    return {"type": "FeatureCollection", "features": [
        {"type": "Feature", "geometry": {"type": "Point", "coordinates": [lon, lat]},
         "properties": {"device_id": d, "ts": iso(ts), "battery": b}}
        for d, ts, lat, lon, b in zip(rows["device_id"], rows["ts"], rows["lat"], rows["lon"], rows["battery"])]}


def to_geodataframe(table: pa.Table):
    import geopandas as gpd
    import pandas as pd

    frame = table.to_pandas()
    frame["time"] = pd.to_datetime(frame["ts"], unit="ms", utc=True)
    return gpd.GeoDataFrame(frame, geometry=gpd.points_from_xy(frame["lon"], frame["lat"]), crs="EPSG:4326")


def main(argv: list[str] | None = None) -> int:
    """herdfence export --key KEY [--herd H | --device D] [--from T] [--to T] OUT.(parquet|geojson)"""
    from api.auth import resolve
    from fencing.config import load_settings
    from fencing.model.redis_conn import cluster

    parser = argparse.ArgumentParser(prog="herdfence export",
                                     description="Export a farm's position history as GeoParquet or GeoJSON.")
    parser.add_argument("out", help="output file: .parquet (GeoParquet) or .geojson")
    parser.add_argument("--key", required=True, help="the farm's API key")
    parser.add_argument("--herd")
    parser.add_argument("--device")
    parser.add_argument("--from", dest="from_", help="ISO 8601 or epoch ms")
    parser.add_argument("--to", help="ISO 8601 or epoch ms")
    args = parser.parse_args(argv)
    settings = load_settings()
    redis = cluster(*settings.redis_node)
    who = resolve(redis, args.key)
    if who is None or who.is_device:
        print("herdfence export: invalid farm API key", file=sys.stderr)
        return 2
    try:
        table = farm_history(redis, str(settings.history_dir), who.farm_id, device_id=args.device, herd=args.herd,
                             from_ms=to_ms(args.from_) if args.from_ else None,
                             to_ms_=to_ms(args.to) if args.to else None, limit=None)
    except ValueError as err:
        print(f"herdfence export: {err}", file=sys.stderr)
        return 2
    frame = to_geodataframe(table)
    if args.out.endswith(".geojson") or args.out.endswith(".json"):
        frame.assign(time=frame["time"].astype(str)).to_file(args.out, driver="GeoJSON")
    else:
        frame.to_parquet(args.out)
    print(f"exported {len(frame)} positions to {args.out}")
    return 0
