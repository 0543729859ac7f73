"""Digits: qkv's ViT and a plain torch.nn.TransformerEncoder ViT, the same wall-clock budget.

    .venv/bin/python benchmarks/vit_digits.py            # 110 s each side, seeds 1..3

For each seed, qkv trains with ``qkv train vit`` on its defaults (scikit-learn's 8x8 digits,
``--max-time`` and ``--seed`` only) and is scored on the digits test split (20% of each class,
split seed 0) by its predictor; then the peer (benchmarks/peers/vision.py: the same sizes and
recipe, written from torch's own modules) trains for the same wall-clock time on the same
train split with the same one-pixel shifts (but not qkv's rotation and zoom), and is scored
on the same test images. Writes benchmarks/results/vit_digits.json: each seed's test
accuracy, the mean and sd of both sides, and the commands. One test image is 100/359 = 0.28
points of accuracy.

Test images reach neither side before testing: qkv chooses checkpoints (and whether to
average them) on the validation split; the peer chooses nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, only benchmarks/ is on the path; the root makes `benchmarks` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks import harness
from benchmarks.peers import vision as peer
from qkv.jobs.vision import ImageClassifier, VisionSettings, digits_splits
from qkv.jobs.vision.data import DIGITS_PIXEL_MAX, DIGITS_TEST_FRACTION, stratified_split

GOAL = 98.0  # mean test accuracy over the seeds, percent


def splits() -> dict[str, Any]:
    """The digits split of ``qkv train vit`` with its default split settings."""
    settings = VisionSettings()
    return digits_splits(settings.split_seed, settings.valid_fraction, DIGITS_TEST_FRACTION)


def pools(data: Path | None = None) -> dict[str, list[str]]:
    """The digits each stage sees, as "digit N" (N its index in ``load_digits``).

    Training (both sides) sees train, checkpoint selection sees valid, scoring sees test.
    ``data`` is unused: the digits come with scikit-learn.
    """
    from sklearn.datasets import load_digits

    settings = VisionSettings()
    digits = load_digits()
    test, valid, train = stratified_split(
        digits.target, [DIGITS_TEST_FRACTION, settings.valid_fraction], settings.split_seed
    )
    # The indices must name the very images qkv trains and tests on.
    every = torch.from_numpy(digits.images / DIGITS_PIXEL_MAX).float()  # (B, Hi, Wi)
    qkv_splits = splits()
    for name, index in (("train", train), ("valid", valid), ("test", test)):
        if not torch.equal(every[torch.from_numpy(index)], qkv_splits[name].images[:, 0]):
            raise AssertionError(f"the {name} indices do not match qkv's digits split")

    def names(index: np.ndarray) -> list[str]:
        return [f"digit {i}" for i in index.tolist()]

    return {"train": names(train), "selection": names(valid), "test": names(test)}


def run_qkv(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    run = args.out / f"qkv-seed{seed}"
    command, seconds = harness.qkv(
        "train", "vit", "--max-time", f"{args.seconds:g}", "--seed", seed, "--out", run, "--force",
        *args.train_options,
        threads=args.threads,
    )  # fmt: skip
    scores = ImageClassifier.load(run).evaluate_data(None, None)
    accuracy = round(scores["accuracy"], 2)
    print("qkv", seed, accuracy, flush=True)
    return {
        "command": command,
        "wall_seconds": seconds,
        "training": harness.read_summary(run),
        "curves": harness.curves(run, args.result),
        "test_accuracy": accuracy,
        "test_macro_f1": round(scores["macro_f1"], 2),
        "test_images": scores["images"],
    }


def run_peer(args: argparse.Namespace, seed: int, data: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    train, test = data["train"], data["test"]
    model, training = peer.train_peer(train.images, train.labels, args.seconds, seed)
    accuracy = round(peer.accuracy(model, test.images, test.labels), 2)
    print("peer", seed, accuracy, flush=True)
    return {
        "what": "plain ViT on torch.nn.TransformerEncoder (benchmarks/peers/vision.py)",
        "sizes": peer.PEER_SIZES,
        "recipe": {
            **vars(peer.PEER_RECIPE),
            "batch_size": peer.BATCH_SIZE,
            "max_shift": peer.MAX_SHIFT,
        },
        "wall_seconds": round(time.perf_counter() - start, 1),
        "training": training,
        "test_accuracy": accuracy,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.common_arguments(parser, budget_seconds=110.0, seeds=3)
    parser.add_argument("--out", type=Path, default=Path("runs/vit_digits"), help="run folders")
    parser.add_argument("--result", type=Path, default=harness.RESULTS / "vit_digits.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    warnings = harness.check_quiet(args.allow_busy)
    machine = harness.machine()
    data = splits()

    runs = []
    for seed in harness.seeds(args):
        runs.append({"seed": seed, "qkv": run_qkv(args, seed), "peer": run_peer(args, seed, data)})
    warnings += harness.busy_during(machine["load_average"][0])

    accuracy = {
        side: harness.mean_sd([r[side]["test_accuracy"] for r in runs]) for side in ("qkv", "peer")
    }
    test_images = len(data["test"])
    harness.write_report(
        args.result,
        {
            "benchmark": "vit_digits",
            "machine": machine,
            "warnings": warnings,
            "budget_seconds": args.seconds,
            "train_images": len(data["train"]),
            "valid_images": len(data["valid"]),
            "test_images": test_images,
            "points_per_test_image": round(100 / test_images, 2),
            "test_accuracy": accuracy,
            "goal": {"qkv_mean_test_accuracy": GOAL, "met": accuracy["qkv"]["mean"] >= GOAL},
            "commands": [r["qkv"]["command"] for r in runs],
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
