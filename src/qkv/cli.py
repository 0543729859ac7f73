"""The ``qkv`` command: train, translate, evaluate, demo.

Every error a user can cause ends as one line, ``qkv: error: ...``, and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from qkv.config import ModelConfig
from qkv.errors import InputError
from qkv.training import TrainConfig

TRAIN_HELP = {
    "max_steps": "stop after this many optimizer steps",
    "max_time": "stop after this many seconds of training (validation included)",
    "clock": "what --max-time counts: wall-clock time, or CPU time per thread (a shared machine)",
    "max_epochs": "stop after this many passes over the training data",
    "lr": "peak learning rate, reached at the end of warmup",
    "warmup_steps": "steps of linear warmup before the inverse-square-root decay",
    "weight_decay": "AdamW's decoupled weight decay on weight matrices",
    "label_smoothing": "label smoothing of the cross-entropy (0 disables)",
    "clip_norm": "clip the gradient norm to this value (0 disables)",
    "accumulate": "batches whose gradients are summed per optimizer step",
    "max_tokens": "tokens per batch, padding included (batches are built by length)",
    "precision": "auto: bf16 autocast where the CPU or GPU supports it; bf16; fp32",
    "seed": "random seed of initialisation, batch order and dropout",
    "eval_every": "validate and checkpoint every N steps",
    "log_every": "write a metrics.csv row and refresh the progress bar every N steps",
    "patience": "stop after N validations without improvement",
    "average_last": "at the end, average the weights of the last N checkpoints if that helps",
}


def add_train_options(parser: argparse.ArgumentParser, **defaults: object) -> None:
    """One option per TrainConfig field, with the task's own defaults."""
    group = parser.add_argument_group("training")
    group.add_argument("--out", required=True, help="run folder to write (created if needed)")
    group.add_argument(
        "--resume", action="store_true", help="continue the run in --out exactly where it stopped"
    )
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    for field in dataclasses.fields(TrainConfig):
        if field.name not in TRAIN_HELP:
            continue
        default = defaults.get(field.name, field.default)
        kind = {"max_time": float, "patience": int, "max_epochs": int}.get(
            field.name, type(field.default)
        )
        choices = {"precision": ("auto", "bf16", "fp32"), "clock": ("wall", "cpu")}
        extra = {"choices": choices[field.name]} if field.name in choices else {}
        group.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=kind,
            default=default,
            help=f"{TRAIN_HELP[field.name]} (default: {default})",
            **extra,
        )


def train_config_from(args: argparse.Namespace) -> TrainConfig:
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if f.name in TRAIN_HELP
    }
    return TrainConfig(out=args.out, progress=not args.no_progress, **values)


def add_model_options(parser: argparse.ArgumentParser, preset: str = "small") -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--preset",
        default=preset,
        choices=("tiny", "small", "base", "big"),
        help=f"model size to start from (default: {preset})",
    )
    for name, kind, text in (
        ("d_model", int, "model width"),
        ("n_heads", int, "attention heads"),
        ("d_ff", int, "inner width of the feed-forward sublayer"),
        ("n_encoder_layers", int, "encoder layers"),
        ("n_decoder_layers", int, "decoder layers"),
        ("dropout", float, "dropout on embeddings and sublayer outputs"),
        ("attention_dropout", float, "dropout on attention weights"),
    ):
        group.add_argument(f"--{name.replace('_', '-')}", type=kind, help=f"{text} (preset's)")
    group.add_argument("--activation", choices=("relu", "gelu"), help="feed-forward activation")
    group.add_argument(
        "--positional",
        choices=("sinusoidal", "learned"),
        help="positional encoding (default: sinusoidal)",
    )
    norm = group.add_mutually_exclusive_group()
    norm.add_argument(
        "--norm-first",
        dest="norm_first",
        action="store_true",
        default=None,
        help="pre-norm: x + Sublayer(LayerNorm(x))",
    )
    norm.add_argument(
        "--post-norm",
        dest="norm_first",
        action="store_false",
        help="post-norm as in the paper: LayerNorm(x + Sublayer(x))",
    )


def model_config_from(args: argparse.Namespace, **fixed: object) -> ModelConfig:
    names = (
        "d_model",
        "n_heads",
        "d_ff",
        "n_encoder_layers",
        "n_decoder_layers",
        "dropout",
        "attention_dropout",
        "activation",
        "positional",
        "norm_first",
    )
    overrides = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    try:
        return ModelConfig.preset(args.preset, **{**overrides, **fixed})
    except ValueError as error:
        raise InputError(str(error)) from None


def print_json_or_table(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>16}  {value:.2f}" if isinstance(value, float) else f"{key:>16}  {value}")


def build_parser() -> argparse.ArgumentParser:
    from qkv.commands import register_all

    parser = argparse.ArgumentParser(
        prog="qkv",
        description="The Transformer of the classic description: train it, use it, look inside.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `qkv COMMAND --help` for a command's options.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register_all(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int | None] = args.run
    try:
        return run(args) or 0
    except InputError as error:
        print(f"qkv: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("qkv: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    return path


if __name__ == "__main__":
    sys.exit(main())
