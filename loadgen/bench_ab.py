"""`herdfence bench ab`: this checkout against another commit's checkout, in one sitting.

Figures from different days differ 2-3x on a shared 2-core machine; a ratio measured in one sitting
holds. So both sides run the same `bench push` arguments, interleaved, and the median of each side's
runs is compared. The order turns every round (this checkout first, then the other first, ...): a
machine that speeds up or slows down through the sitting would otherwise favour the side that always
runs second (measured 2026-11-29: 054811b rose from 77,624 to 108,537 points/s over 25 minutes, run
after main each time). Each round's own ratio is kept beside the medians (`round_ratios`). The other
side is a checkout with its own venv (`git worktree add ../base <commit> && make -C ../base venv`).

    herdfence bench ab --base ../base --rounds 3 --json docs/ab-054811b.json -- \\
        --fences 100000 --points 1000000 --devices 10000

Each run's result file is kept in a work directory (`--dir`, <side>-<round>.json); `--collect DIR`
summarizes the files already there without running anything.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("main", "base")


def _commit(checkout: Path) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def _figures(result: dict) -> dict:
    produce = result.get("produce") or {}
    return {"points_per_s": result.get("points_per_s"), "lost": result.get("lost"),
            "duplicated": result.get("duplicated"), "producer_s": produce.get("seconds"),
            "drain_points_per_s": result.get("drain_points_per_s"), "time": result.get("time")}


def collect(work: Path, base: Path | None, push_args: list[str]) -> dict:
    runs = {side: [] for side in SIDES}
    for path in sorted(work.glob("*-*.json")):
        side, _, round_ = path.stem.partition("-")
        if side in runs and round_.isdigit():
            runs[side].append({"round": int(round_), **_figures(json.loads(path.read_text()))})

    def median(side: str, key: str):
        values = [r[key] for r in runs[side] if r.get(key) is not None]
        return round(statistics.median(values), 1) if values else None
    medians = {side: {k: median(side, k) for k in ("points_per_s", "producer_s", "drain_points_per_s")}
               for side in SIDES}
    ratio = (medians["main"]["points_per_s"] / medians["base"]["points_per_s"]
             if medians["main"]["points_per_s"] and medians["base"]["points_per_s"] else None)
    by_round = {side: {r["round"]: r["points_per_s"] for r in runs[side] if r.get("points_per_s")} for side in SIDES}
    round_ratios = {r: round(by_round["main"][r] / by_round["base"][r], 3)
                    for r in sorted(set(by_round["main"]) & set(by_round["base"]))}
    return {"command": "herdfence bench push " + " ".join(push_args),
            "commits": {"main": _commit(ROOT), "base": _commit(base) if base else None},
            "runs": runs, "medians": medians, "ratio": round(ratio, 3) if ratio else None,
            "round_ratios": round_ratios,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def round_order(round_: int) -> tuple[str, str]:
    """Which side runs first in a round (1-based): this checkout in odd rounds, the other in even ones."""
    return SIDES if round_ % 2 else SIDES[::-1]


def run(base: Path, rounds: int, work: Path, push_args: list[str]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    checkouts = {"main": ROOT, "base": base}
    for round_ in range(1, rounds + 1):
        for side in round_order(round_):
            checkout = checkouts[side]
            out = work / f"{side}-{round_}.json"
            print(f"bench ab: round {round_}, {side} ({checkout})", file=sys.stderr, flush=True)
            subprocess.run([str(checkout / ".venv" / "bin" / "herdfence"), "bench", "push", *push_args,
                            "--json", str(out), "--no-plot"], cwd=checkout, check=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="herdfence bench ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", type=Path, help="the other checkout (with its .venv)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="where the runs' result files go")
    p.add_argument("--collect", type=Path, metavar="DIR", help="summarize DIR's result files, run nothing")
    p.add_argument("--json", required=True, metavar="FILE")
    p.add_argument("push_args", nargs=argparse.REMAINDER, help="-- then the bench push arguments")
    args = p.parse_args(argv)
    push_args = [a for a in args.push_args if a != "--"]
    if args.collect is None:
        if args.base is None:
            p.error("--base is required unless --collect is given")
        work = args.dir or Path(args.json).with_suffix("")
        run(args.base, args.rounds, work, push_args)
    else:
        work = args.collect
    summary = collect(work, args.base, push_args)
    Path(args.json).write_text(json.dumps(summary, indent=1))
    print(json.dumps({"medians": summary["medians"], "ratio": summary["ratio"]}))
    return 0
