"""What every quality benchmark shares: a quiet machine, qkv run from its own command line,
the seeds' mean and spread, and one JSON with both sides' figures and the commands.

A benchmark trains qkv with ``qkv train JOB`` (the job's defaults, the data and the wall-clock
budget only) and then its peer from ``benchmarks/peers/`` with the same data, tokenizer and
budget, in the same invocation, one after the other.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from qkv.launch import cpu_cores

from .measure import describe as machine  # noqa: F401 (the benchmarks' machine record)

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
DATA = ROOT.parents[1] / "shared" / "data"
# A 1-minute load average above this many runnable processes per core means someone else
# is using the machine: a wall-clock budget would then buy less training than it says.
BUSY_LOAD_PER_CORE = 0.5


def check_quiet(allow_busy: bool) -> list[str]:
    """Refuse to start on a busy machine (or, with ``allow_busy``, return the warning)."""
    load = os.getloadavg()[0]
    cores = cpu_cores()
    if load <= BUSY_LOAD_PER_CORE * cores:
        return []
    message = (
        f"the machine is busy (1-minute load average {load:.2f} on {cores} cores): "
        "wall-clock budgets would buy less training than they say"
    )
    if not allow_busy:
        raise SystemExit(f"{message}; wait for quiet, or pass --allow-busy to record it")
    warnings.warn(message, stacklevel=2)
    return [message]


def busy_during(start_load: float) -> list[str]:
    """A warning when the load average after a run shows others shared the machine."""
    load = os.getloadavg()[0]
    cores = cpu_cores()
    # The benchmark itself keeps about `threads` cores busy.
    ours = min(torch.get_num_threads(), cores)
    if load > ours + BUSY_LOAD_PER_CORE * cores:
        return [f"load average {load:.2f} after the run (started at {start_load:.2f})"]
    return []


def qkv(*args: object, threads: int | None = None) -> tuple[str, float]:
    """Run ``qkv ARGS`` as a user would; return the command line and its wall seconds."""
    argv = [sys.executable, "-m", "qkv", *map(str, args)]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    subprocess.run(argv, check=True, env=env)
    command = "qkv " + shlex.join(map(str, args))
    return command, round(time.perf_counter() - start, 1)


def curves(run: Path, result: Path) -> str:
    """Draw the run's learning curves with ``qkv plot`` beside the results JSON; the path."""
    png = result.parent / "curves" / f"{result.stem}-{run.name}.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    qkv("plot", run, "--out", png)
    root = Path(__file__).resolve().parents[1]
    png = png.resolve()
    return str(png.relative_to(root) if png.is_relative_to(root) else png)


def read_summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def mean_sd(values: Sequence[float]) -> dict[str, Any]:
    """Mean and sample standard deviation (0 for one value), rounded for a table."""
    values = list(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {
        "values": [round(v, 2) for v in values],
        "mean": round(statistics.fmean(values), 2),
        "sd": round(sd, 2),
        "n": len(values),
    }


def seeds(args) -> range:
    """The seeds a benchmark runs: ``--seeds`` of them from ``--first-seed``."""
    return range(args.first_seed, args.first_seed + args.seeds)


def write_report(path: Path, report: dict[str, Any]) -> None:
    """The results JSON: the figures, the machine, the commands that made them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {"command": "python " + shlex.join(sys.argv), **report}
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"results in {path}")


def common_arguments(parser, budget_seconds: float, seeds: int = 1) -> None:
    """--seconds, --seeds, --first-seed, --allow-busy, --threads, --train-options: every
    benchmark's options."""
    parser.add_argument(
        "--seconds", type=float, default=budget_seconds, help="wall-clock training budget"
    )
    parser.add_argument(
        "--seeds", type=int, default=seeds, help="how many seeds, each side (default: %(default)s)"
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=1,
        help="the first seed: seeds FIRST..FIRST+N-1, so that a long benchmark's seeds can run "
        "one invocation each (default: %(default)s)",
    )
    parser.add_argument(
        "--allow-busy",
        action="store_true",
        help="run on a busy machine and record the warning in the results",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: all cores)"
    )
    parser.add_argument(
        "--train-options",
        type=shlex.split,
        default=[],
        metavar="'OPTIONS'",
        help="more options for qkv's `qkv train`, in one quoted string, e.g. '--max-tokens 1600': "
        "a candidate recipe measured before it becomes the default (default: none)",
    )
