"""`herdfence` command line: up / down / status / farm, and dispatch to bench, elastic, export."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

# fencing.config reads and checks every HERDFENCE_* variable at import: main() imports it where it
# catches ConfigError, so a bad value is one line and exit 2, never a traceback.
from fencing.settings_model import ConfigError, DeployError


def load_settings():
    from fencing.config import load_settings as load
    return load()


def _cmd_up(args: argparse.Namespace) -> int:
    from deploy import stack
    result = stack.up(load_settings(), detach=args.detach, spark_workers=args.spark_workers,
                      redis_replicas=args.redis_replicas, timeout=args.timeout)
    if args.detach:
        print(json.dumps(result, indent=1))
        return 0 if result["ok"] else 1
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    from deploy import stack
    stopped = stack.down(load_settings())
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from deploy import stack
    st = stack.status(load_settings())
    if args.json:
        print(json.dumps(st))
    else:
        for name, c in st["components"].items():
            where = c.get("external") or (f"port {c['port']}" if c.get("port") else "")
            print(f"{name:16} {'ok  ' if c['ok'] else 'DOWN'} pid={c['pid']} {where}".rstrip())
        print("ok" if st["ok"] else "NOT ok")
    return 0 if st["ok"] else 1


def _cmd_reset(args: argparse.Namespace) -> int:
    from deploy import datadir
    deleted = datadir.reset(load_settings(), yes=args.yes)
    print("deleted: " + (", ".join(str(p) for p in deleted) if deleted else "nothing (no data)"))
    return 0


def _cmd_backup(args: argparse.Namespace) -> int:
    from deploy import datadir
    print(json.dumps(datadir.backup(load_settings(), args.dir), indent=1))
    return 0


def _cmd_restore(args: argparse.Namespace) -> int:
    from deploy import datadir
    datadir.restore(load_settings(), args.dir, yes=args.yes)
    return 0


def _lazy(module: str, what: str) -> ModuleType:
    """Import `module` only when its command runs, so a missing part fails clearly, not at startup."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise DeployError(f"{what} is not available yet ({module} is missing)") from e
        raise


def _cmd_farm_create(args: argparse.Namespace) -> int:
    from deploy.redis_cluster import connect
    tenancy = _lazy("api.tenancy", "farm management")
    farm_id, api_key = tenancy.create_farm(connect(load_settings()), args.name)
    out = {"farm_id": farm_id, "api_key": api_key}
    print(json.dumps(out) if args.json else f"farm_id: {farm_id}\napi_key: {api_key}")
    return 0


def _cmd_farm_rotate_key(args: argparse.Namespace) -> int:
    from fencing.model.redis_conn import connect
    tenancy = _lazy("api.tenancy", "farm management")
    try:
        api_key = tenancy.rotate_farm_key(connect(load_settings()), args.farm_id)
    except LookupError as e:
        raise DeployError(str(e)) from None
    out = {"farm_id": args.farm_id, "api_key": api_key}
    print(json.dumps(out) if args.json else f"farm_id: {args.farm_id}\napi_key: {api_key}\n(the old key no longer works)")
    return 0


def _passthrough(module: str, what: str) -> Callable:
    def run(args: argparse.Namespace) -> int:
        rc = _lazy(module, what).main(list(args.rest))
        return int(rc or 0)
    return run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="herdfence", description="geofencing stream processor for livestock")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start the embedded stack (foreground unless --detach)")
    up.add_argument("--detach", action="store_true", help="start in the background, return when ready")
    up.add_argument("--spark-workers", type=int, default=0, metavar="N",
                    help="run the job on a local Spark standalone cluster with N workers")
    up.add_argument("--redis-replicas", type=int, default=0, choices=(0, 1), metavar="N",
                    help="replicas per Redis master (0 or 1)")
    up.add_argument("--timeout", type=float, default=180.0, metavar="S",
                    help="seconds to wait for the API and the job's first micro-batch (default 180)")
    up.set_defaults(func=_cmd_up)

    sub.add_parser("down", help="stop everything `up` started; deletes nothing").set_defaults(func=_cmd_down)

    rs = sub.add_parser("reset", help="delete all data of HERDFENCE_HOME (farms, fences, devices, events, "
                                      "history, broker log, checkpoint); stops the stack first")
    rs.add_argument("--yes", action="store_true", help="really delete (without it: only say what)")
    rs.set_defaults(func=_cmd_reset)

    bk = sub.add_parser("backup", help="a consistent copy of the embedded stack's data, taken while it runs")
    bk.add_argument("dir", type=Path)
    bk.set_defaults(func=_cmd_backup)

    rt = sub.add_parser("restore", help="bring a backup back into a stopped or fresh HERDFENCE_HOME")
    rt.add_argument("dir", type=Path)
    rt.add_argument("--yes", action="store_true", help="replace the data HERDFENCE_HOME already holds")
    rt.set_defaults(func=_cmd_restore)

    st = sub.add_parser("status", help="component status (exit 0 when all ok)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_status)

    farm = sub.add_parser("farm", help="farms (tenants)").add_subparsers(dest="farm_cmd", required=True)
    fc = farm.add_parser("create", help="create a farm and print its API key")
    fc.add_argument("name")
    fc.add_argument("--json", action="store_true")
    fc.set_defaults(func=_cmd_farm_create)
    fr = farm.add_parser("rotate-key", help="a new API key for the farm; the old one stops working at once")
    fr.add_argument("farm_id")
    fr.add_argument("--json", action="store_true")
    fr.set_defaults(func=_cmd_farm_rotate_key)

    for name, (module, what, help_) in PASSTHROUGH.items():
        sp = sub.add_parser(name, help=help_, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
        sp.set_defaults(func=_passthrough(module, what))
    return p


# Other packages own these commands; the remaining arguments go to their main(argv) unchanged.
PASSTHROUGH = {
    "bench": ("loadgen.bench", "the benchmark", "push | pull | ingest | fences | report ..."),
    "elastic": ("loadgen.elastic_skew", "the elastic loop", "skew | status ..."),
    "export": ("api.export", "export", "export data ..."),
    "config": ("fencing.config_docs", "the settings", "the effective HERDFENCE_* settings [--json] [--markdown [FILE]]"),
    "demo": ("loadgen.demo", "the demo", "a demo farm with a walking herd [--stop] [--json]"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in PASSTHROUGH:
        # Bypass argparse: REMAINDER still rejects a leading option such as `bench --help`.
        args = argparse.Namespace(rest=argv[1:], func=_passthrough(*PASSTHROUGH[argv[0]][:2]))
    else:
        args = build_parser().parse_args(argv)
    try:
        from fencing.config import load_settings as check   # every variable, before any command
        check()
        rc = args.func(args)
    except ConfigError as e:
        for problem in e.problems:
            print(f"herdfence: {problem}", file=sys.stderr)
        rc = 2
    except DeployError as e:
        print(f"herdfence: {e}", file=sys.stderr)
        rc = 1
    except KeyboardInterrupt:
        rc = 130
    sys.exit(rc)


if __name__ == "__main__":
    main()
