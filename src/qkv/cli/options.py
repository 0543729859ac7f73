"""Command-line options generated from settings dataclasses, and the options every command shares.

Each field made with ``qkv.config.option`` becomes one option, with its help text, type,
choices and the job's default, so a job shows exactly the options it uses. Options are parsed
with ``default=SUPPRESS``: the namespace holds only what was typed, and ``merge`` lays it over
the job's defaults and a saved config.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from typing import Any

import torch

from qkv.config import DROPOUT_IMPLS, PRESETS, ModelConfig, option_flag
from qkv.errors import InputError

# Help of the ModelConfig fields a job may show (``Job.model_options``).
MODEL_HELP = {
    "d_model": "model width",
    "n_heads": "attention heads",
    "d_ff": "inner width of the feed-forward sublayer",
    "n_encoder_layers": "encoder layers",
    "n_decoder_layers": "decoder layers",
    "dropout": "dropout on embeddings and sublayer outputs",
    "attention_dropout": "dropout on attention weights",
    "dropout_impl": "how dropout masks are drawn: reference (F.dropout), packed (four 16-bit "
    "lanes per random word, faster on a CPU), auto (packed on a CPU)",
    "activation": "feed-forward activation",
    "positional": "positional encoding",
}
METAVARS = {int: "N", float: "X"}
MODEL_CHOICES = {
    "activation": ("relu", "gelu"),
    "positional": ("sinusoidal", "learned"),
    "dropout_impl": DROPOUT_IMPLS,
}


def _not_none(hint: Any) -> Any:
    """``int`` for ``int | None`` or ``Optional[int]``; any other hint as it is."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _plain_type(hint: Any) -> type:
    """int for ``int``, ``int | None`` or ``Optional[int]``; list for ``list[str]``."""
    hint = _not_none(hint)
    return typing.get_origin(hint) or hint


def _item_type(hint: Any) -> type:
    """int for ``list[int]`` or ``list[int] | None``; str for a bare ``list``."""
    return (typing.get_args(_not_none(hint)) or (str,))[0]


def _shown(value: Any) -> str:
    """A default as the help shows it: ``none`` for None or an empty list, a list's items
    separated by spaces as they would be typed."""
    if isinstance(value, list | tuple):
        return " ".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


def add_dataclass_options(
    group: argparse._ActionsContainer, cls: type, defaults: dict[str, Any] | None = None
) -> list[str]:
    """One option per ``option`` field of ``cls`` (not ``cli=False``); returns the field names."""
    defaults = defaults or {}
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if not meta.get("cli", False) or not meta.get("help"):
            continue
        default = defaults.get(f.name, _field_default(f))
        flag = option_flag(f)
        kind = _plain_type(hints[f.name])
        common = {"dest": f.name, "default": argparse.SUPPRESS}
        if kind is bool:
            group.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                help=f"{meta['help']} (default: {'yes' if default else 'no'})",
                **common,
            )
        elif kind is list:
            group.add_argument(
                flag,
                action="append",
                type=_item_type(hints[f.name]),
                metavar=meta.get("metavar"),
                help=f"{meta['help']} (default: {_shown(default)})",
                **common,
            )
        else:
            group.add_argument(
                flag,
                type=kind,
                choices=meta.get("choices"),
                metavar=meta.get("metavar") or METAVARS.get(kind),
                help=f"{meta['help']} (default: {_shown(default)})",
                **common,
            )
        names.append(f.name)
    return names


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def typed(args: argparse.Namespace, names: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The options among ``names`` that were typed on the command line."""
    return {n: getattr(args, n) for n in names if hasattr(args, n)}


def add_model_options(
    parser: argparse.ArgumentParser,
    names: tuple[str, ...],
    preset: str,
    defaults: dict[str, Any] | None = None,
) -> list[str]:
    """``--preset`` and the ModelConfig fields ``names``; returns the option dests.

    ``defaults`` are the job's own choices over the preset's, shown in the help."""
    defaults = defaults or {}
    group = parser.add_argument_group("model")
    group.add_argument(
        "--preset",
        choices=("tiny", "small", "base", "big"),
        default=argparse.SUPPRESS,
        help=f"model size to start from (default: {preset})",
    )
    for name in names:
        if name == "norm_first":
            norm = group.add_mutually_exclusive_group()
            norm.add_argument(
                "--norm-first",
                dest="norm_first",
                action="store_true",
                default=argparse.SUPPRESS,
                help="pre-norm: x + Sublayer(LayerNorm(x))"
                + (" (default)" if defaults.get("norm_first") is True else ""),
            )
            norm.add_argument(
                "--post-norm",
                dest="norm_first",
                action="store_false",
                default=argparse.SUPPRESS,
                help="post-norm as in the paper: LayerNorm(x + Sublayer(x))"
                + (" (default)" if defaults.get("norm_first") is not True else ""),
            )
            continue
        kind = str if name in MODEL_CHOICES else (float if "dropout" in name else int)
        default = defaults.get(name, field_default(name))
        group.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            choices=MODEL_CHOICES.get(name),
            metavar=None if name in MODEL_CHOICES else METAVARS[kind],
            default=argparse.SUPPRESS,
            help=f"{MODEL_HELP[name]} (default: {default})",
        )
    return list(names)


def field_default(name: str) -> Any:
    """What a ModelConfig field is when not typed: "the preset's" where the presets differ,
    else the field's own default."""
    if any(name in sizes for sizes in PRESETS.values()):
        return "the preset's"
    return next(f.default for f in dataclasses.fields(ModelConfig) if f.name == name)


def add_runtime_options(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--threads``, on every command that runs a model."""
    group = parser.add_argument_group("runtime")
    group.add_argument(
        "--device",
        default="auto",
        help="auto (this process's GPU if there is one, else the CPU), cpu, cuda, cuda:N "
        "(default: auto)",
    )
    group.add_argument(
        "--threads", type=int, help="CPU threads for PyTorch (default: PyTorch's choice)"
    )


def resolve_device(text: str) -> torch.device:
    """The device ``--device text`` names, or one clear ``InputError``."""
    from qkv.distributed import default_device

    if text == "auto":
        return default_device()
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise InputError(
            f"--device {text!r}: not a device; use auto, cpu, cuda or cuda:N"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = " (this PyTorch is a CPU build)" if torch.version.cuda is None else ""
            raise InputError(f"--device {text}: no CUDA GPU can be used here{build}; use cpu")
        if device.index is None and "LOCAL_RANK" in os.environ:
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(
                f"--device {text}: there are {torch.cuda.device_count()} CUDA devices, "
                f"numbered from 0"
            )
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise InputError(f"--device {text}: no Apple GPU (MPS) can be used here; use cpu")
    elif device.type != "cpu":
        raise InputError(f"--device {text}: qkv runs on cpu, cuda or mps")
    return device


def apply_runtime(args: argparse.Namespace) -> torch.device:
    """Set the thread count and return the device of ``--device``."""
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise InputError(f"--threads {threads} must be at least 1")
        torch.set_num_threads(threads)
    return resolve_device(getattr(args, "device", "auto"))
