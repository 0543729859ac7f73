"""Small generated data and runs shared by the tests."""

from __future__ import annotations

from pathlib import Path

from qkv.config import ModelConfig
from qkv.synthetic import make_splits, write_parallel
from qkv.training import TrainConfig

TINY_MODEL = dict(
    d_model=32,
    n_heads=2,
    d_ff=64,
    n_encoder_layers=1,
    n_decoder_layers=1,
    dropout=0.1,
    share_embeddings=True,
    tie_output=True,
)


def tiny_pairs(n_train: int = 200, n_valid: int = 20, seed: int = 0):
    return make_splits(n_train, n_valid, 20, seed=seed)


def write_splits(folder: Path, n_train: int = 200, n_valid: int = 20) -> dict[str, Path]:
    """train.src/.tgt, valid.src/.tgt, test.src/.tgt in ``folder``; returns their paths."""
    paths = {}
    for name, pairs in tiny_pairs(n_train, n_valid).items():
        src, tgt = folder / f"{name}.src", folder / f"{name}.tgt"
        write_parallel(pairs, src, tgt)
        paths[f"{name}_src"], paths[f"{name}_tgt"] = src, tgt
    return paths


def tiny_model_config(**overrides) -> ModelConfig:
    return ModelConfig.preset("tiny", **{**TINY_MODEL, **overrides})


def tiny_train_config(out: Path, **overrides) -> TrainConfig:
    values = dict(
        out=str(out),
        max_steps=6,
        eval_every=3,
        log_every=1,
        warmup_steps=2,
        max_tokens=400,
        lr=3e-3,
        progress=False,
        precision="fp32",
    )
    return TrainConfig(**{**values, **overrides})


def train_translation_args(paths: dict[str, Path], out: Path, *options: object) -> list[str]:
    """`qkv train translation` on the files of ``write_splits``, then ``options``."""
    return [
        "train",
        "translation",
        "--train-src",
        str(paths["train_src"]),
        "--train-tgt",
        str(paths["train_tgt"]),
        "--valid-src",
        str(paths["valid_src"]),
        "--valid-tgt",
        str(paths["valid_tgt"]),
        "--out",
        str(out),
        "--no-progress",
        "--precision",
        "fp32",
        *map(str, options),
    ]
