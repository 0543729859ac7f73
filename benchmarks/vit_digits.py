"""Digits: train a qkv ViT on scikit-learn's 8x8 digits within a wall-clock budget, report accuracy.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vit_digits.py --seconds 110

Writes benchmarks/results/vit_digits.json: accuracy and macro-F1 on the held-out test split
(20% of each class, split seed 0, the split `qkv train vit` uses by default), training wall
time and images/s. The model reads 2x2 patches (4x4 = 16 patches and [CLS]) with pre-norm
layers of width 64, and trains on images moved by up to one pixel, drawn anew each epoch;
``--patch-stride 1`` overlaps the patches (49 of them), which costs three times as much per
step. The peer figure is a plain ViT trained on this CPU: 96.9% test accuracy in 105 s.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from qkv.config import ModelConfig
from qkv.jobs.run import run_job
from qkv.jobs.vision import JOB, ImageClassifier, VisionSettings, digits_splits, image_config
from qkv.jobs.vision.data import DIGITS_TEST_FRACTION as TEST_FRACTION
from qkv.training import TrainConfig

RESULTS = Path(__file__).resolve().parent / "results"
PEER_TEST_ACCURACY = 96.9  # plain ViT, this CPU
PEER_TRAIN_SECONDS = 105.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=110.0, help="training budget")
    parser.add_argument("--out", type=Path, default=Path("runs/vit_digits"), help="run folder")
    parser.add_argument("--patch-size", type=int, default=2)
    parser.add_argument("--patch-stride", type=int, default=None)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shift", type=int, default=1)
    parser.add_argument("--rotate", type=float, default=0.0)
    parser.add_argument("--zoom", type=float, default=0.0)
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--average-last", type=int, default=5)
    parser.add_argument("--valid-fraction", type=float, default=0.1)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--result", type=Path, default=RESULTS / "vit_digits.json")
    args = parser.parse_args()

    splits = digits_splits(args.split_seed, args.valid_fraction, TEST_FRACTION)
    settings = VisionSettings(
        valid_fraction=args.valid_fraction,
        split_seed=args.split_seed,
        patch_size=args.patch_size,
        patch_stride=args.patch_stride,
        batch_size=args.batch_size,
        shift=args.shift,
        rotate=args.rotate,
        zoom=args.zoom,
        label_smoothing=args.label_smoothing,
    )
    image = image_config(JOB.resolve(settings), 10)
    model = ModelConfig.preset(
        "tiny",
        d_model=args.d_model,
        n_heads=args.n_heads,
        d_ff=args.d_ff,
        n_encoder_layers=args.layers,
        dropout=args.dropout,
        activation="gelu",
        norm_first=True,
    )
    config = TrainConfig(
        out=str(args.out),
        max_steps=1_000_000,
        max_time=args.seconds,
        lr=args.lr,
        warmup_steps=args.warmup,
        weight_decay=args.weight_decay,
        eval_every=args.eval_every,
        log_every=50,
        average_last=args.average_last,
        # fp32: at these widths bf16 autocast costs more in casts than it saves on this CPU.
        precision="fp32",
        seed=args.seed,
        progress=False,
    )
    summary = run_job(JOB, settings, model, config, force=True)
    scores = ImageClassifier.load(args.out).evaluate(splits["test"], args.out / "confusion.png")
    accuracy = round(scores["accuracy"], 2)
    report = {
        "benchmark": "vit_digits",
        "command": "python benchmarks/vit_digits.py " + " ".join(sys.argv[1:]),
        "machine": {
            "cpus": torch.get_num_threads(),
            "processor": platform.processor(),
            "torch": torch.__version__,
        },
        "settings": {
            **vars(args),
            "out": str(args.out),
            "result": str(args.result),
            "model": model.to_dict(),
            "image": image.to_dict(),
            "train_images": len(splits["train"]),
            "valid_images": len(splits["valid"]),
        },
        "training": summary,
        "train_seconds": summary["train_seconds"],
        "test_images": scores["images"],
        "test_accuracy": accuracy,
        "test_macro_f1": round(scores["macro_f1"], 2),
        "peer": {
            "what": "plain ViT, this CPU",
            "test_accuracy": PEER_TEST_ACCURACY,
            "train_seconds": PEER_TRAIN_SECONDS,
        },
        "test_accuracy_over_peer": round(accuracy / PEER_TEST_ACCURACY, 4),
        "train_seconds_over_peer": round(summary["train_seconds"] / PEER_TRAIN_SECONDS, 3),
    }
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps({"test_accuracy": accuracy, "train_seconds": summary["train_seconds"]}))


if __name__ == "__main__":
    main()
