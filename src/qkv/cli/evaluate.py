"""``qkv evaluate``: score any trained run on data, with its job's own prediction options."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from qkv.cli.options import add_runtime_options, apply_runtime, typed
from qkv.errors import InputError


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "evaluate",
        help="score a trained run on data (BLEU, accuracy, macro-F1 ...)",
        description="Score a trained run of any job: BLEU and chrF for a translator, accuracy "
        "and macro-F1 for the others. The run's own files are never changed; pictures (a "
        "confusion matrix) go to --out. The prediction options of the run's job (those of "
        "`qkv translate` for a translator, say) are accepted too.",
    )
    parser.add_argument("--model", required=True, help="run folder written by `qkv train`")
    parser.add_argument(
        "--data",
        metavar="PATH",
        help="data in the form the job trains on (default: the run's validation data; for a "
        "vit run on the digits, their test split)",
    )
    parser.add_argument("--out", metavar="DIR", help="folder for pictures (confusion matrix)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    add_runtime_options(parser)
    parser.set_defaults(run=run_evaluate, takes_more=True)


def job_options(job: Any, more: list[str]) -> dict[str, Any]:
    """The job's prediction options among the extra arguments; others are an error."""
    from qkv.cli import Parser
    from qkv.cli.predict import add_predict_options

    parser = Parser(prog=f"qkv evaluate (a {job.name} run)", add_help=False)
    names = add_predict_options(parser, job)
    args, unknown = parser.parse_known_args(more)
    if unknown:
        raise InputError(
            f"{' '.join(unknown)}: not an option of `qkv evaluate` for a {job.name} run"
        )
    return typed(args, names)


def print_scores(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return
    for key, value in result.items():
        print(f"{key:>16}  {value:.2f}" if isinstance(value, float) else f"{key:>16}  {value}")


def run_evaluate(args: argparse.Namespace) -> None:
    from qkv.jobs import get_job, load_run
    from qkv.jobs.base import read_job_name

    device = apply_runtime(args)
    name, _ = read_job_name(args.model)
    options = job_options(get_job(name), args.more)
    predictor = load_run(args.model, device, **options)
    out = Path(args.out) if args.out else None
    print_scores(predictor.evaluate_data(args.data, out), args.json)
