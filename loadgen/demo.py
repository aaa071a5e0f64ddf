"""`herdfence demo`: a demo farm on the embedded stack and a herd that walks through it live.

`herdfence demo` makes sure the stack runs, creates (or reuses) the farm "Demo farm" with three
paddocks (one with a pond cut out) and a grazing strip whose window covers now, registers a dozen
cows and starts the walker: a detached process (`python -m loadgen.demo --walk`) that posts every
cow's position through the HTTP API every couple of seconds. Most cows graze with small random steps
inside their paddock; a few walk straight lines back and forth across a boundary, so that ENTER and
EXIT events show up within the first half minute. `herdfence demo --stop` stops the walker only.

Files in HERDFENCE_HOME/run: demo.json (the farm and its key), demo.pid and demo.log (the walker).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import shapely
from shapely.geometry import box, mapping
from shapely.geometry.polygon import orient

from fencing.config import Settings, load_settings
from loadgen.herd import COORD_DECIMALS, M_PER_DEG_LAT, M_PER_DEG_LON_EQ

FARM_NAME = "Demo farm"
HERD = "demo"
CENTER = (8.5400, 47.0100)          # lon, lat of the farm's local plane origin
INTERVAL_S = 2.0                    # wall time between two reports of every cow
WALK_MARKERS = ["loadgen.demo", "--walk"]   # how `--stop` recognises the walker (not a reused PID)
GIVE_UP_S = 300.0                   # the walker ends when the API has been away this long
STRIP_NAME = "Grazing strip"


# --- the farm's layout, in metres on a local plane (x east, y north) -----------------------------
def _pond() -> shapely.Polygon:
    return shapely.Point(-170, -110).buffer(30, quad_segs=4)


def layout_m() -> dict[str, shapely.Polygon]:
    """The fences by name. The strip lies along the west fence of the East paddock, short of its
    north end (its label on the map then clears the paddock's)."""
    south = box(-320, -210, -20, -10)
    return {"North paddock": box(-320, 10, -20, 210),
            "South paddock": shapely.Polygon(south.exterior.coords, [_pond().exterior.coords]),
            "East paddock": box(0, -210, 300, 210),
            STRIP_NAME: box(0, -210, 60, 130)}


@dataclass(frozen=True)
class Cow:
    device_id: str
    home: tuple[float, float, float, float]     # grazers: the box they wander in
    line: tuple[float, float, float, float] | None = None   # walkers: x0, y0, x1, y1, back and forth


def herd_plan() -> list[Cow]:
    """Twelve cows: nine grazers and three walkers whose lines cross a boundary a few steps in."""
    north, south, east = (-305, 25, -35, 195), (-305, -195, -35, -25), (80, -195, 285, 195)
    cows = [Cow(f"demo-cow-{i + 1:02d}", home) for i, home in
            enumerate([north, north, north, south, south, south, east, east, east])]
    cows += [Cow("demo-cow-10", north, (-170, 195, -170, 255)),     # out of the North paddock's top
             Cow("demo-cow-11", south, (-35, -100, 45, -100)),      # South paddock -> East paddock + strip
             Cow("demo-cow-12", east, (120, 50, 30, 50))]           # into the grazing strip
    return cows


def to_lonlat(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Equirectangular: exact enough at farm scale."""
    lon0, lat0 = CENTER
    lon = np.round(lon0 + x / (M_PER_DEG_LON_EQ * math.cos(math.radians(lat0))), COORD_DECIMALS)
    return lon, np.round(lat0 + y / M_PER_DEG_LAT, COORD_DECIMALS)


def fence_features(now_ms: int) -> list[dict]:
    features = []
    for name, geom_m in layout_m().items():
        geom = orient(shapely.transform(geom_m, lambda c: np.column_stack(to_lonlat(c[:, 0], c[:, 1]))))
        props: dict = {"name": name}
        if name == STRIP_NAME:
            # the window covers now and the rest of the day (a re-run of `demo` moves it on)
            props.update(active_from=now_ms - 3_600_000, active_to=now_ms + 24 * 3_600_000)
        features.append({"type": "Feature", "properties": props, "geometry": mapping(geom)})
    return features


# --- the herd's motion (all cows at once) --------------------------------------------------------
class HerdMotion:
    def __init__(self, cows: list[Cow], seed: int = 7, step_m: float = 4.0, graze_sigma_m: float = 2.5):
        self.rng = np.random.default_rng(seed)
        self.ids = [c.device_id for c in cows]
        self.walker = np.array([c.line is not None for c in cows])
        self.lo = np.array([c.home[:2] for c in cows], dtype=float)
        self.hi = np.array([c.home[2:] for c in cows], dtype=float)
        lines = np.array([c.line or (0, 0, 0, 0) for c in cows], dtype=float)
        self.a, self.b = lines[:, :2], lines[:, 2:]
        self.length = np.maximum(np.hypot(*(self.b - self.a).T), 1e-9)
        self.step_m, self.sigma = step_m, graze_sigma_m
        self.home = (self.lo + self.hi) / 2
        self.xy = np.where(self.walker[:, None], self.a, self.rng.uniform(self.lo, self.hi))
        self.ticks = 0

    def step(self) -> np.ndarray:
        """Positions after one more tick, (N, 2) metres."""
        self.ticks += 1
        drift = self.rng.normal(0, self.sigma, self.xy.shape) + 0.02 * (self.home - self.xy)
        grazed = np.clip(self.xy + drift, self.lo, self.hi)
        u = self.ticks * self.step_m / self.length          # in legs: 0 -> a, 1 -> b, 2 -> a, ...
        tri = 1 - np.abs(u % 2 - 1)
        walked = self.a + (self.b - self.a) * tri[:, None]
        self.xy = np.where(self.walker[:, None], walked, grazed)
        return self.xy

    def reports(self, now_ms: int) -> list[dict]:
        lon, lat = to_lonlat(self.xy[:, 0], self.xy[:, 1])
        battery = max(20.0, 100.0 - self.ticks * 0.01)
        return [{"device_id": d, "ts": now_ms, "lat": float(la), "lon": float(lo), "battery": battery,
                 "accuracy_m": 3.0} for d, lo, la in zip(self.ids, lon, lat)]


# --- files ---------------------------------------------------------------------------------------
def _farm_file(settings: Settings) -> Path:
    return settings.run_dir / "demo.json"


def _pid_file(settings: Settings) -> Path:
    return settings.run_dir / "demo.pid"


def _log_file(settings: Settings) -> Path:
    return settings.run_dir / "demo.log"


def _read_farm(settings: Settings) -> dict | None:
    try:
        d = json.loads(_farm_file(settings).read_text())
        return d if isinstance(d.get("farm_id"), str) and isinstance(d.get("api_key"), str) else None
    except (FileNotFoundError, ValueError, AttributeError):
        return None


def _write_farm(settings: Settings, farm_id: str, api_key: str) -> None:
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    path = _farm_file(settings)
    tmp = path.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)    # it holds the farm's key
    with os.fdopen(fd, "w") as f:
        json.dump({"farm_id": farm_id, "api_key": api_key, "name": FARM_NAME}, f)
    os.replace(tmp, path)


def _walker_pid(settings: Settings) -> int | None:
    from deploy.procs import is_alive
    try:
        pid = int(_pid_file(settings).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if is_alive(pid, WALK_MARKERS) else None


# --- setup through the API -----------------------------------------------------------------------
def _call(client: httpx.Client, method: str, path: str, tries: int = 20, **kw) -> httpx.Response:
    """One API call; 429/503 (a store catching up right after `up`) are retried as told."""
    for _ in range(tries):
        r = client.request(method, path, **kw)
        if r.status_code not in (429, 503):
            return r
        time.sleep(min(5.0, float(r.headers.get("Retry-After") or 1)))
    return r


def _ensure_stack(settings: Settings) -> bool:
    """Start the stack detached unless it runs; True when it had to be started."""
    from deploy import stack
    if stack.status(settings)["ok"]:
        return False
    print(f"herdfence demo: the stack is not (fully) running: starting it (herdfence up --detach, "
          f"HERDFENCE_HOME={settings.home})", file=sys.stderr, flush=True)
    if not stack.up(settings, detach=True)["ok"]:
        from deploy.procs import DeployError
        raise DeployError("the stack did not come up; see herdfence status")
    return True


def _ensure_farm(settings: Settings) -> tuple[str, str, bool]:
    """(farm_id, api_key, reused): the recorded demo farm while its key works, else a new one."""
    known = _read_farm(settings)
    if known is not None:
        with httpx.Client(base_url=settings.api_url, timeout=30) as c:
            r = _call(c, "GET", "/v1/fences", headers={"Authorization": f"Bearer {known['api_key']}"})
        if r.status_code == 200:
            return known["farm_id"], known["api_key"], True
    # the code path of `herdfence farm create`
    from api.tenancy import create_farm
    from deploy.redis_cluster import connect
    farm_id, api_key = create_farm(connect(settings), FARM_NAME)
    _write_farm(settings, farm_id, api_key)
    return farm_id, api_key, False


def _check(r: httpx.Response, what: str) -> httpx.Response:
    if r.status_code >= 300:
        from deploy.procs import DeployError
        raise DeployError(f"{what}: HTTP {r.status_code} {r.text[:300]}")
    return r


def _ensure_fences_and_cows(client: httpx.Client, now_ms: int) -> list[str]:
    """Create the fences that are missing (by name), renew the strip's window, register the cows."""
    existing = {f["properties"].get("name"): f["id"]
                for f in _check(_call(client, "GET", "/v1/fences"), "listing fences").json()["features"]}
    for feature in fence_features(now_ms):
        name = feature["properties"]["name"]
        if name not in existing:
            _check(_call(client, "POST", "/v1/fences", json=feature), f"creating {name}")
        elif name == STRIP_NAME:
            _check(_call(client, "PUT", f"/v1/fences/{existing[name]}", json=feature), f"renewing {name}")
    for cow in herd_plan():
        _check(_call(client, "POST", "/v1/devices", json={"device_id": cow.device_id, "herd": HERD}),
               f"registering {cow.device_id}")
    return list(layout_m())


# --- the walker process --------------------------------------------------------------------------
def start_walker(settings: Settings) -> int:
    from deploy.stack import settings_env
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    with open(_log_file(settings), "ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting the demo walker\n".encode())
        log.flush()
        proc = subprocess.Popen([sys.executable, "-m", "loadgen.demo", "--walk"], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                env={**os.environ, **settings_env(settings)})
    _pid_file(settings).write_text(f"{proc.pid}\n")
    return proc.pid


def stop_walker(settings: Settings) -> int | None:
    """SIGTERM the recorded walker and wait for it; the pid it had, or None if none ran."""
    from deploy.procs import stop_pid
    pid = _walker_pid(settings)
    if pid is not None:
        stop_pid(pid, WALK_MARKERS, timeout=10.0)
    _pid_file(settings).unlink(missing_ok=True)
    return pid


def walk(settings: Settings, interval_s: float = INTERVAL_S) -> int:
    """Post every cow's position every `interval_s` until SIGTERM, the farm's key stops working, the
    API has been away for GIVE_UP_S, or the stack's owner (HERDFENCE_OWNER_PID) is gone."""
    from deploy.supervisor import owner_gone
    from fencing.config import TUNING
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    farm = _read_farm(settings)
    if farm is None:
        print("demo walker: no demo farm recorded; run `herdfence demo`", flush=True)
        return 2
    herd = HerdMotion(herd_plan())
    last_ok, posted = time.monotonic(), 0
    headers = {"Authorization": f"Bearer {farm['api_key']}"}
    print(f"demo walker: {len(herd.ids)} cows of farm {farm['farm_id']} -> {settings.api_url}", flush=True)
    with httpx.Client(base_url=settings.api_url, headers=headers, timeout=10) as client:
        while not stop.is_set():
            tick = time.monotonic()
            herd.step()
            try:
                r = client.post("/v1/reports", json={"reports": herd.reports(time.time_ns() // 1_000_000)})
                status = r.status_code
            except httpx.TransportError as e:
                status, r = 0, e
            if status == 202:
                last_ok, posted = tick, posted + len(herd.ids)
                if herd.ticks % 30 == 1:
                    print(f"demo walker: tick {herd.ticks}, {posted} reports posted", flush=True)
            elif status == 401:
                print("demo walker: the farm key is no longer accepted; stopping", flush=True)
                return 1
            else:
                print(f"demo walker: tick {herd.ticks}: {r if status == 0 else f'HTTP {status} {r.text[:200]}'}",
                      flush=True)
            if tick - last_ok > GIVE_UP_S:
                print(f"demo walker: no answer from the API for {GIVE_UP_S:.0f} s; stopping", flush=True)
                return 1
            if owner_gone(TUNING.owner_pid):
                print("demo walker: the stack's owner process is gone; stopping", flush=True)
                return 0
            stop.wait(max(0.0, interval_s - (time.monotonic() - tick)))
    print(f"demo walker: stopped after {herd.ticks} ticks, {posted} reports", flush=True)
    return 0


# --- the command ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DemoInfo:
    farm_id: str
    api_key: str
    url: str
    walker_pid: int


def start(settings: Settings) -> tuple[DemoInfo, bool, bool]:
    """(info, stack_started, farm_reused)."""
    started = _ensure_stack(settings)
    farm_id, api_key, reused = _ensure_farm(settings)
    with httpx.Client(base_url=settings.api_url, timeout=30,
                      headers={"Authorization": f"Bearer {api_key}"}) as client:
        _ensure_fences_and_cows(client, time.time_ns() // 1_000_000)
    stop_walker(settings)      # a fresh walker: its cows start where their lines cross soon
    pid = start_walker(settings)
    # the UI has a sign-in box for the farm key (it remembers it in the browser)
    return DemoInfo(farm_id, api_key, settings.api_url + "/", pid), started, reused


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="herdfence demo",
                                description="a demo farm with a simulated herd on the embedded stack")
    p.add_argument("--stop", action="store_true", help="stop the simulated herd (the stack and farm stay)")
    p.add_argument("--json", action="store_true", help='print {"farm_id","api_key","url","walker_pid"}')
    p.add_argument("--walk", action="store_true", help=argparse.SUPPRESS)   # the walker process itself
    p.add_argument("--interval", type=float, default=INTERVAL_S, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    settings = load_settings()
    if args.walk:
        return walk(settings, args.interval)
    if args.stop:
        pid = stop_walker(settings)
        if args.json:
            print(json.dumps({"stopped": pid is not None, "walker_pid": pid}))
        else:
            print(f"demo herd stopped (walker pid {pid})" if pid else "no demo herd was walking")
        return 0
    info, started, reused = start(settings)
    if args.json:
        print(json.dumps(asdict(info)))
        return 0
    print(f"{'reused' if reused else 'created'} {FARM_NAME!r}: {', '.join(layout_m())}; "
          f"{len(herd_plan())} cows in herd {HERD!r}{' (the stack was started for it)' if started else ''}")
    print(f"  farm_id: {info.farm_id}")
    print(f"  api_key: {info.api_key}")
    print(f"  UI:      {info.url}  (sign in with the api_key above)")
    print(f"  herd walking: pid {info.walker_pid}, log {_log_file(settings)}")
    print("stop it with: herdfence demo --stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
