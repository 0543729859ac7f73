"""One benchmark's seeds, run in invocations of their own, pooled into one mean and sd.

A long benchmark (Multi30k's 87 minutes, the tagger's 42) runs one seed per invocation, each
with ``--first-seed N --result ...-seedN.json``. This reads those JSONs, checks that they are
the same benchmark with different seeds, and pools every figure the harness wrote as values,
mean and sd (``harness.mean_sd``), so that the README's mean ± sd is regenerated, not typed:

    .venv/bin/python benchmarks/pool.py benchmarks/results/translation_multi30k*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Run as a script, only benchmarks/ is on the path; the root makes `benchmarks` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import mean_sd, write_report

SUMMARY_KEYS = {"values", "mean", "sd", "n"}
# What makes two machines one for a benchmark's figures: the same processor (name and
# generation), bf16 features, cores and torch. The load average and threads may differ.
MACHINE_KEYS = ("processor", "cpu_generation", "amx_bf16", "avx512_bf16", "cpu_count", "torch")


def summaries(report: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict]]:
    """Every mean-and-sd figure in a results JSON, with the keys that lead to it."""
    if isinstance(report, dict):
        if SUMMARY_KEYS <= report.keys():
            yield path, report
            return
        for key, value in report.items():
            if key != "runs":  # the runs hold single values; their summaries are above them
                yield from summaries(value, (*path, key))


def run_seeds(report: dict[str, Any]) -> list[int]:
    """The seeds a results JSON holds, from its runs."""
    return [run["seed"] for run in report.get("runs", [])]


def machine_of(report: dict[str, Any]) -> str:
    """The machine a results JSON ran on, as ``MACHINE_KEYS``; an entry it lacks is "?"."""
    machine = report.get("machine", {})
    return ", ".join(f"{key} {machine.get(key, '?')}" for key in MACHINE_KEYS)


def pool(reports: list[dict[str, Any]], mixed_machines: bool = False) -> dict[str, Any]:
    """The figures of several results JSONs of one benchmark, each seed once, pooled.

    Seeds run on different machines (or on machines that cannot be told apart, where one
    JSON lacks an entry another has) are refused unless ``mixed_machines``: a faster machine
    trains more steps in the same budget, so its figures are not the same measurement.
    """
    reports = sorted(reports, key=lambda report: run_seeds(report)[:1])  # by their first seed
    names = {report.get("benchmark") for report in reports}
    if len(names) != 1:
        raise SystemExit(f"these are different benchmarks: {', '.join(sorted(map(str, names)))}")
    machines = sorted({machine_of(report) for report in reports})
    if len(machines) > 1 and not mixed_machines:
        raise SystemExit(
            f"these ran on different machines ({'; '.join(machines)}); "
            "pass --mixed-machines to pool them anyway"
        )
    seen: list[int] = []
    for report in reports:
        for seed in run_seeds(report):
            if seed in seen:
                raise SystemExit(f"seed {seed} appears in more than one file")
            seen.append(seed)
    paths = [dict(summaries(report)) for report in reports]
    common = [path for path in paths[0] if all(path in other for other in paths[1:])]
    pooled: dict[str, Any] = {}
    for path in common:
        values = [value for figures in paths for value in figures[path]["values"]]
        node = pooled
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = mean_sd(values)
    return {"benchmark": names.pop(), "seeds": seen, "machines": machines, "figures": pooled}


def table(pooled: dict[str, Any]) -> str:
    """One line per pooled figure: its keys, mean ± sd and the values."""
    lines = [f"{pooled['benchmark']}, seeds {', '.join(map(str, pooled['seeds']))}"]
    for path, figure in summaries(pooled["figures"]):
        values = ", ".join(f"{v:.2f}" for v in figure["values"])
        lines.append(f"  {' '.join(path)}: {figure['mean']:.2f} ± {figure['sd']:.2f} ({values})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="results JSONs, one per seed")
    parser.add_argument("--result", type=Path, help="also write the pooled figures here")
    parser.add_argument(
        "--mixed-machines",
        action="store_true",
        help="pool seeds run on different machines (the machines are listed in the result)",
    )
    args = parser.parse_args()
    reports = []
    for path in args.results:
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as error:
            raise SystemExit(f"{path}: {error}") from None
    pooled = pool(reports, args.mixed_machines)
    print(table(pooled))
    if args.result:
        sources = [
            {"file": str(path), "command": report.get("command")}
            for path, report in zip(args.results, reports, strict=True)
        ]
        write_report(args.result, {**pooled, "pooled_from": sources})


if __name__ == "__main__":
    main()
