"""Subcommands of ``qkv``, one module per job; each registers its own parsers."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from qkv import checkpoint as ckpt
from qkv.errors import InputError

# task name in config.json -> function(args) that evaluates such a run for `qkv evaluate`
EVALUATORS: dict[str, Callable[[argparse.Namespace], dict]] = {}


def register_all(commands: argparse._SubParsersAction) -> None:
    from qkv.commands import attention, classification, tagging, translation, vision

    train = commands.add_parser(
        "train",
        help="train a model into a run folder",
        description="Train a model into a run folder.",
    )
    jobs = train.add_subparsers(dest="job", metavar="JOB", required=True)
    for job in (translation, tagging, classification, vision, attention):
        job.register(commands, jobs)
    evaluate = commands.add_parser(
        "evaluate",
        help="score a trained run on data (accuracy, BLEU, ...)",
        description="Score a trained run: BLEU and chrF for translation.",
    )
    evaluate.add_argument("--model", required=True, help="run folder written by `qkv train`")
    evaluate.add_argument("--src", help="translation: source sentences, one a line")
    evaluate.add_argument("--ref", help="translation: reference translations, one a line")
    evaluate.add_argument(
        "--data",
        help="tagger: CoNLL-U file; classifier: TSV or SST-2 lines; "
        "vit: folder of class folders (default: the run's held-out split)",
    )
    evaluate.add_argument("--beam", type=int, default=4, help="beam size (default: 4)")
    evaluate.add_argument(
        "--length-penalty",
        type=float,
        default=1.0,
        help="exponent of the length normalisation (default: 1.0)",
    )
    evaluate.add_argument("--json", action="store_true", help="print the scores as JSON")
    evaluate.set_defaults(run=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> None:
    from qkv.cli import print_json_or_table

    task = ckpt.read_run_config(args.model).get("task")
    if task not in EVALUATORS:
        raise InputError(f"{args.model}: cannot evaluate a run of kind {task!r}")
    print_json_or_table(EVALUATORS[task](args), args.json)
