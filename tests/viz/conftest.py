"""Trained runs shared by the picture tests, each trained once per session through the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qkv.cli import main

from ..helpers import train_translation_args, write_conllu, write_labeled, write_splits

SENTENCE = "the dog sees a cat"
# A tiny translator with 2 encoder layers, 1 decoder layer and 2 heads of width 16, so that
# layer and head indices have something to be out of range of.
TRANSLATION_OPTIONS = (
    "--preset",
    "tiny",
    "--n-heads",
    "2",
    "--n-encoder-layers",
    "2",
    "--n-decoder-layers",
    "1",
    "--vocab-size",
    "200",
    "--max-steps",
    "6",
    "--eval-every",
    "3",
    "--log-every",
    "1",
    "--max-tokens",
    "400",
)
TINY_ENCODER = ("--preset", "tiny", "--n-heads", "2", "--n-encoder-layers", "2")
TINY_TRAINING = ("--max-steps", "2", "--eval-every", "2", "--no-progress", "--precision", "fp32")


def qkv(*argv: object) -> int:
    """The ``qkv`` command line; returns its exit code."""
    return main([str(a) for a in argv])


@pytest.fixture(scope="session")
def translation_run(tmp_path_factory) -> Path:
    """The run folder of a tiny translator trained for 6 steps with `qkv train translation`."""
    folder = tmp_path_factory.mktemp("translation")
    out = folder / "run"
    assert qkv(*train_translation_args(write_splits(folder), out, *TRANSLATION_OPTIONS)) == 0
    return out


def train_encoder_run(job: str, folder: Path) -> tuple[Path, str]:
    """A tagger, classifier or vit run trained for 2 steps into ``folder``/run.

    Returns:
        the run folder and an input to look at (a sentence, a text, or an image file).
    """
    out = folder / "run"
    common = ("--out", out, *TINY_ENCODER, *TINY_TRAINING)
    if job == "tagger":
        data = write_conllu(folder / "train.conllu", 20)
        assert qkv("train", "tagger", "--train", data, "--valid", data, *common) == 0
        return out, "the big dog sees a cat ."
    if job == "classifier":
        data = write_labeled(folder / "train.tsv", 20)
        args = ("--train", data, "--valid", data, "--pooling", "cls")
        assert qkv("train", "classifier", *args, *common) == 0
        return out, "a fine film with a plot"
    from PIL import Image
    from sklearn.datasets import load_digits

    args = ("--image-size", "8", "--patch-size", "4", "--batch-size", "32")
    assert qkv("train", "vit", *args, *common) == 0
    png = folder / "digit.png"
    pixels = load_digits().images[0] / 16.0 * 255  # (8, 8), ink 0..16
    Image.fromarray(pixels.round().astype(np.uint8)).save(png)
    return out, str(png)
