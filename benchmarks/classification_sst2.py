"""SST-2 sentence sentiment: qkv's classifier and a plain peer, same budget, test accuracy.

    .venv/bin/python benchmarks/classification_sst2.py --seconds 300 --seeds 3

For each seed, ``qkv train classifier`` runs with the job's defaults, the data options and
``--max-time SECONDS``, which covers the whole training: masked-language-model pretraining on
the SST-2 training sentences and unlabeled English from ../shared/data (Multi30k's English
training side, UD English-EWT's training sentences), then fine-tuning on the 6,920 labeled
training sentences, SST-2 dev choosing the best weights. No SST-2 dev or test sentence reaches
the tokenizer or pretraining, and test is read only to score the finished runs. Then the peer
(benchmarks/peers/classification.py: ``nn.TransformerEncoder``, the same tokenizer, no
pretraining) trains for the same seconds on the labeled training sentences.

Writes benchmarks/results/classification_sst2.json: test accuracy per seed, mean and sd over
the seeds of both sides, the machine, the commands. The test set has 1,821 sentences, so one
sentence is 0.055 points. Kim (2014) Table 2 reports 82.7% for CNN-rand on the same split.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

# Run as a script, only benchmarks/ is on the path; the root makes `benchmarks` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import harness
from benchmarks.peers.classification import train_and_test
from qkv.jobs.classification import Classifier, read_labeled
from qkv.jobs.pretraining import read_texts

JOB = "classifier"
SPLITS = ("train", "dev", "test")
# Unlabeled English for the tokenizer and pretraining: training sides only, never a test set.
UNLABELED = ("multi30k/train.en", "ud_english_ewt/en_ewt-ud-train.conllu")
KIM_CNN_RAND = 82.7  # Kim (2014), Table 2, CNN-rand on SST-2


def split_file(data: Path, split: str) -> Path:
    return data / "sst2" / f"stsa.binary.{split}"


def data_options(data: Path) -> list[str]:
    """The data options of ``qkv train classifier``: labeled train and dev, unlabeled text."""
    options = ["--train", split_file(data, "train"), "--valid", split_file(data, "dev")]
    for name in UNLABELED:
        options += ["--unlabeled", data / name]
    return [str(o) for o in options]


def pools(data: Path = harness.DATA) -> dict[str, list[str]]:
    """The texts each stage of a qkv run sees, read as the job reads them (lower-cased).

    ``tokenizer`` and ``pretraining``: the training sentences and the unlabeled files;
    ``train``: the labeled training sentences; ``selection``: dev, which chooses the best
    weights of pretraining and fine-tuning; ``test``: read only to score the finished runs.
    """
    sst2 = {s: [t.lower() for t in read_labeled(split_file(data, s)).texts] for s in SPLITS}
    unlabeled = [t.lower() for name in UNLABELED for t in read_texts(data / name)]
    return {
        "tokenizer": sst2["train"] + unlabeled,
        "pretraining": sst2["train"] + unlabeled,
        "train": sst2["train"],
        "selection": sst2["dev"],
        "test": sst2["test"],
    }


def qkv_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Train qkv for ``args.seconds`` into ``args.out/seedN`` and score it on test."""
    run = args.out / f"seed{seed}"
    if (run / "config.json").is_file():
        shutil.rmtree(run)  # the benchmark's own run folder from an earlier invocation
    command, wall = harness.qkv(
        "train",
        JOB,
        *data_options(args.data),
        "--max-time",
        args.seconds,
        "--seed",
        seed,
        "--out",
        run,
        *args.train_options,
        threads=args.threads,
    )
    summary = harness.read_summary(run)
    scores = Classifier.load(run).evaluate_data(str(split_file(args.data, "test")), None)
    pretraining = summary.get("pretraining") or {}
    return {
        "seed": seed,
        "command": command,
        "curves": harness.curves(run, args.result),
        "evaluate": f"Classifier.load({str(run)!r}).evaluate_data(stsa.binary.test)",
        "test_accuracy": round(scores["accuracy"], 2),
        "test_macro_f1": round(scores["macro_f1"], 2),
        "dev_accuracy": round(summary["best_val_accuracy"], 2),
        "wall_seconds": wall,
        "pretraining_seconds": pretraining.get("wall_seconds"),
        "pretraining_steps": pretraining.get("steps"),
        "fine_tuning_seconds": summary.get("wall_seconds"),
        "fine_tuning_steps": summary.get("steps"),
        "stopped_by": summary.get("stopped_by"),
        "run": str(run),
    }


def peer_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Train the peer for ``args.seconds`` with qkv's tokenizer of this seed; score test."""
    splits = {s: read_labeled(split_file(args.data, s)) for s in ("train", "test")}
    tokenizer = args.out / f"seed{seed}" / "tokenizer.json"
    result = train_and_test(tokenizer, splits["train"], splits["test"], args.seconds, seed)
    return {"seed": seed, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.common_arguments(parser, budget_seconds=300.0, seeds=3)
    parser.add_argument("--data", type=Path, default=harness.DATA, help="holds sst2/ and more")
    parser.add_argument("--out", type=Path, default=Path("runs/sst2"), help="runs folder")
    parser.add_argument("--result", type=Path, default=harness.RESULTS / "classification_sst2.json")
    args = parser.parse_args()
    needed = [split_file(args.data, s) for s in SPLITS] + [args.data / n for n in UNLABELED]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise SystemExit(f"missing data: {', '.join(missing)}; pass --data (holds sst2/)")
    warnings = harness.check_quiet(args.allow_busy)
    if args.threads:
        torch.set_num_threads(args.threads)
    test_texts = len(read_labeled(split_file(args.data, "test")))
    qkv_runs, peer_runs = [], []
    for seed in harness.seeds(args):
        start_load = os.getloadavg()[0]
        qkv_runs.append(qkv_seed(args, seed))
        print(f"qkv seed {seed}: test accuracy {qkv_runs[-1]['test_accuracy']}", flush=True)
        peer_runs.append(peer_seed(args, seed))
        print(f"peer seed {seed}: test accuracy {peer_runs[-1]['test_accuracy']}", flush=True)
        warnings += harness.busy_during(start_load)
    qkv_figures = harness.mean_sd([r["test_accuracy"] for r in qkv_runs])
    peer_figures = harness.mean_sd([r["test_accuracy"] for r in peer_runs])
    harness.write_report(
        args.result,
        {
            "benchmark": "classification_sst2",
            "machine": harness.machine(),
            "warnings": warnings,
            "budget_seconds_per_seed": args.seconds,
            "test_texts": test_texts,
            "points_per_text": round(100.0 / test_texts, 3),
            "data": {
                "labeled": "SST-2 stsa.binary.train; dev (stsa.binary.dev) chooses weights",
                "unlabeled": list(UNLABELED),
                "test": "stsa.binary.test, read only to score the finished runs",
            },
            "qkv": {"test_accuracy": qkv_figures, "runs": qkv_runs},
            "peer": {
                "what": "nn.TransformerEncoder classifier, qkv's tokenizer, no pretraining",
                "test_accuracy": peer_figures,
                "runs": peer_runs,
            },
            "qkv_over_peer": round(qkv_figures["mean"] / peer_figures["mean"], 3),
            "kim2014_cnn_rand_test_accuracy": KIM_CNN_RAND,
            "goal": "test accuracy >= 84% mean of 3 seeds",
            "commands": [r["command"] for r in qkv_runs],
        },
    )


if __name__ == "__main__":
    main()
