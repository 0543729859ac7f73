"""``qkv demo``: train and use a translator on a generated language pair."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo",
        help="train and use a translator on a generated language pair (~3 min on CPU)",
        description="Generate a small language pair whose word order and inflection differ, "
        "train a translator on it, and show what it learned. Replaces the run in --out.",
    )
    demo.add_argument("--out", default="runs/demo", help="run folder (default: runs/demo)")
    demo.add_argument(
        "--max-time", type=float, default=150.0, help="seconds of training (default: 150)"
    )
    demo.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace) -> None:
    from qkv.demo import run_demo as demo

    demo(Path(args.out), max_time=args.max_time, seed=args.seed, progress=not args.no_progress)
