"""``qkv export``: hand a trained translator to another inference engine (CTranslate2)."""

from __future__ import annotations

import argparse
from pathlib import Path

from qkv.errors import InputError

FORMATS = ("ctranslate2",)


def register(commands: argparse._SubParsersAction) -> None:
    from qkv.jobs.translation.export import QUANTIZATIONS, RUN_EXPORT

    parser = commands.add_parser(
        "export",
        help="export a trained translator to CTranslate2 for fast CPU translation",
        description=(
            "Write a self-contained CTranslate2 model folder (CTranslate2's files, the "
            "tokenizer and qkv-export.json) that `qkv translate --model OUT --engine "
            f"ctranslate2` uses. Written to RUN/{RUN_EXPORT}, `qkv translate --model RUN "
            "--engine ctranslate2` finds it."
        ),
    )
    parser.add_argument("--model", required=True, help="run folder of `qkv train translation`")
    parser.add_argument("--to", required=True, choices=FORMATS, help="the engine to export to")
    parser.add_argument(
        "out", nargs="?", metavar="OUT", help=f"the folder to write (default: RUN/{RUN_EXPORT})"
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="float32",
        help="how the weights are stored (default: float32)",
    )
    parser.add_argument("--force", action="store_true", help="write into a non-empty OUT")
    parser.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> None:
    from qkv.jobs.translation import Translator
    from qkv.jobs.translation.export import RUN_EXPORT, export_ctranslate2, require_ctranslate2

    require_ctranslate2()
    out = Path(args.out) if args.out else Path(args.model) / RUN_EXPORT
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise InputError(f"{out}: the folder is not empty; choose another or add --force")
    # A run of another job is one InputError here, before its model is built.
    translator = Translator.load(args.model, "cpu")
    export_ctranslate2(
        translator.model,
        translator.tokenizer,
        out,
        args.quantization,
        source=args.model,
        settings=translator.settings.to_dict(),
        force=args.force,
    )
    print(f"exported {args.model} to {out} (CTranslate2, {args.quantization})")
