"""``qkv train translation``, ``qkv translate``, ``qkv demo``, and evaluation of translators."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from qkv.cli import add_model_options, add_train_options, model_config_from, train_config_from
from qkv.commands import EVALUATORS
from qkv.errors import InputError


def register(commands: argparse._SubParsersAction, jobs: argparse._SubParsersAction) -> None:
    train = jobs.add_parser(
        "translation",
        help="sequence to sequence: parallel text in, a translator out",
        description="Train a translator on line-aligned parallel text or TSV (src<TAB>tgt). "
        "A joint subword vocabulary is learned from the training data and saved in the run.",
    )
    data = train.add_argument_group("data")
    data.add_argument("--train-src", help="training source sentences, one a line")
    data.add_argument(
        "--train-tgt", help="training target sentences, line-aligned with --train-src"
    )
    data.add_argument("--valid-src", help="validation source sentences")
    data.add_argument("--valid-tgt", help="validation target sentences")
    data.add_argument("--train-tsv", help="training pairs as src<TAB>tgt (instead of two files)")
    data.add_argument("--valid-tsv", help="validation pairs as src<TAB>tgt")
    data.add_argument(
        "--vocab-size", type=int, default=8000, help="joint subword vocabulary size (default: 8000)"
    )
    data.add_argument(
        "--max-len",
        type=int,
        default=128,
        help="skip pairs longer than this many subwords (default: 128)",
    )
    add_model_options(train, preset="small")
    add_train_options(train, max_steps=20000, eval_every=1000, warmup_steps=1000)
    train.set_defaults(run=run_train)

    translate = commands.add_parser(
        "translate",
        help="translate stdin to stdout with a trained run",
        description="Read sentences from stdin, one a line, and write one translation a line "
        "(an empty line gives an empty line).",
    )
    translate.add_argument("--model", required=True, help="run folder of `qkv train translation`")
    add_decode_options(translate)
    translate.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (default: cpu)")
    translate.set_defaults(run=run_translate)

    demo = commands.add_parser(
        "demo",
        help="train and use a translator on a generated language pair (~3 min on CPU)",
        description="Generate a small language pair whose word order and inflection differ, "
        "train a translator on it, and show what it learned.",
    )
    demo.add_argument("--out", default="runs/demo", help="run folder (default: runs/demo)")
    demo.add_argument(
        "--max-time", type=float, default=150.0, help="seconds of training (default: 150)"
    )
    demo.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(run=run_demo)
    EVALUATORS["translation"] = evaluate_translation


def add_decode_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--beam", type=int, default=4, help="beam size; 1 is greedy (default: 4)")
    parser.add_argument(
        "--length-penalty",
        type=float,
        default=1.0,
        help="exponent alpha of the length normalisation score/len^alpha (default: 1.0)",
    )
    parser.add_argument(
        "--max-len-ratio",
        type=float,
        default=1.5,
        help="longest output = ratio x source length + 10 (default: 1.5)",
    )
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=4096,
        help="source tokens per decoding batch (default: 4096)",
    )


def decode_options(args: argparse.Namespace) -> dict:
    if args.beam < 1:
        raise InputError(f"--beam {args.beam}: the beam size must be at least 1")
    return {
        "beam_size": args.beam,
        "length_penalty": args.length_penalty,
        "max_len_ratio": getattr(args, "max_len_ratio", 1.5),
        "max_tokens": getattr(args, "batch_tokens", 4096),
    }


def read_pairs(src: str | None, tgt: str | None, tsv: str | None, what: str):
    from qkv.data import read_parallel, read_tsv

    if tsv and (src or tgt):
        raise InputError(f"give {what} data either as --{what}-tsv or as --{what}-src/-tgt")
    if tsv:
        return read_tsv(Path(tsv))
    if not (src and tgt):
        raise InputError(
            f"{what} data is missing: give --{what}-src and --{what}-tgt, or --{what}-tsv"
        )
    return read_parallel(Path(src), Path(tgt))


def run_train(args: argparse.Namespace) -> None:
    from qkv.tasks.translation import train_translation

    train_pairs = read_pairs(args.train_src, args.train_tgt, args.train_tsv, "train")
    valid_pairs = read_pairs(args.valid_src, args.valid_tgt, args.valid_tsv, "valid")
    model_config = model_config_from(args, share_embeddings=True, tie_output=True)
    summary = train_translation(
        train_pairs,
        valid_pairs,
        model_config,
        train_config_from(args),
        vocab_size=args.vocab_size,
        max_len=args.max_len,
        resume=args.resume,
    )
    if os.environ.get("RANK", "0") == "0":
        print(f"best validation BLEU {summary['best_val_bleu']:.2f}; run folder {args.out}")


def run_translate(args: argparse.Namespace) -> None:
    from qkv.tasks.translation import Translator

    translator = Translator.load(args.model, device=args.device, **decode_options(args))
    lines = [line.rstrip("\r\n") for line in sys.stdin]
    for line in translator.translate(lines):
        print(line)


def evaluate_translation(args: argparse.Namespace) -> dict:
    from qkv.data import read_parallel
    from qkv.tasks.translation import Translator

    if not (args.src and args.ref):
        raise InputError("evaluating a translator needs --src and --ref")
    pairs = read_parallel(Path(args.src), Path(args.ref))
    translator = Translator.load(args.model, **decode_options(args))
    scores = translator.evaluate([s for s, _ in pairs], [r for _, r in pairs])
    return {
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "sentences": len(pairs),
        "beam": args.beam,
        "length_penalty": args.length_penalty,
    }


def run_demo(args: argparse.Namespace) -> None:
    from qkv.demo import run_demo as demo

    demo(Path(args.out), max_time=args.max_time, seed=args.seed, progress=not args.no_progress)
