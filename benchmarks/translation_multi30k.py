"""Multi30k German->English: qkv and a plain torch.nn.Transformer, the same wall-clock budget.

    .venv/bin/python benchmarks/translation_multi30k.py            # 40 minutes each side

qkv trains with ``qkv train translation`` on its defaults (the data options and
``--max-time`` only); then the peer (benchmarks/peers/translation.py) trains for the same
wall-clock time on the same pairs with the tokenizer qkv learned from the training text, on
the recipe it is known by: pre-norm ``small``, tied embeddings (std d^-0.5), lr 1e-3, 1,000
warmup steps, 4,096-token batches, label smoothing 0.1, in the precision qkv measured as the
faster one here. Both are decoded greedily and with qkv's default beam on test2016 and scored
with sacreBLEU (cased, 13a). Writes benchmarks/results/translation_multi30k.json.

Test sentences reach neither side before testing: the tokenizer learns from the training
pairs, checkpoints are chosen on val.
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

import torch

from benchmarks import harness
from benchmarks.peers import translation as peer
from benchmarks.peers.loop import PeerRecipe, train_for
from qkv.data import SubwordTokenizer
from qkv.jobs.translation import Translator
from qkv.jobs.translation.data import read_parallel
from qkv.jobs.translation.predict import DecodeOptions, corpus_scores

DATA = harness.DATA / "multi30k"
PEER_RECIPE = PeerRecipe(lr=1e-3, warmup_steps=1000, weight_decay=0.01, label_smoothing=0.1)
PEER_MAX_TOKENS = 4096


def pools(data: Path = DATA) -> dict[str, list[str]]:
    """The sentences each stage sees: tokenizer and training (train), selection (val), test."""
    train = [t for pair in read_parallel(data / "train.de", data / "train.en") for t in pair]
    return {
        "tokenizer": train,
        "train": train,
        "selection": [t for p in read_parallel(data / "val.de", data / "val.en") for t in p],
        "test": [t for p in read_parallel(data / "test2016.de", data / "test2016.en") for t in p],
    }


def score(translate, sources: list[str], references: list[str]) -> dict[str, float]:
    start = time.monotonic()
    result = corpus_scores(translate(sources), references)
    return {
        "bleu": round(result["bleu"], 2),
        "chrf": round(result["chrf"], 2),
        "decode_seconds": round(time.monotonic() - start, 1),
    }


def run_qkv(args: argparse.Namespace, seed: int, test) -> dict[str, Any]:
    run = args.out / f"qkv-seed{seed}"
    command, seconds = harness.qkv(
        "train", "translation",
        "--train", args.data / "train", "--valid", args.data / "val",
        "--source-lang", "de", "--target-lang", "en",
        "--max-time", args.seconds, "--seed", seed, "--out", run, "--force",
        *args.train_options,
    )  # fmt: skip
    sources, references = test
    scores = {}
    for name, beam in (("greedy", 1), ("beam", DecodeOptions().beam_size)):
        translator = Translator.load(run, beam_size=beam)
        scores[name] = score(translator.translate, sources, references)
        print("qkv", seed, name, scores[name], flush=True)
    return {
        "command": command,
        "wall_seconds": seconds,
        "training": harness.read_summary(run),
        "curves": harness.curves(run, args.result),
        "test2016": scores,
    }


def run_peer(args: argparse.Namespace, seed: int, test, bf16: bool) -> dict[str, Any]:
    tokenizer = SubwordTokenizer.load(args.out / f"qkv-seed{seed}" / "tokenizer.json")
    pairs = read_parallel(args.data / "train.de", args.data / "train.en")
    examples = peer.encode_pairs(tokenizer, pairs, max_len=128)
    torch.manual_seed(seed)
    model = peer.PeerTranslator(tokenizer.vocab_size, norm_first=True)
    recipe = PeerRecipe(**{**vars(PEER_RECIPE), "bf16": bf16})
    batches = peer.batches_of(examples, PEER_MAX_TOKENS, seed)

    def loss(m, batch):
        return peer.peer_loss(m, *batch, recipe.label_smoothing)

    training = train_for(model, batches, loss, args.seconds, recipe, seed)
    sources, references = test
    scores = {}
    for name, beam in (("greedy", 1), ("beam", DecodeOptions().beam_size)):

        def translate(sentences, beam=beam):
            ids = peer.translate(model, [s + [peer.EOS_ID] for s in
                                         tokenizer.encode_batch(sentences)], beam)  # fmt: skip
            return [tokenizer.decode(row) for row in ids]

        scores[name] = score(translate, sources, references)
        print("peer", seed, name, scores[name], flush=True)
    return {
        "what": "torch.nn.Transformer small, pre-norm (benchmarks/peers/translation.py)",
        "recipe": {**vars(recipe), "max_tokens": PEER_MAX_TOKENS},
        "training": training,
        "test2016": scores,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.common_arguments(parser, budget_seconds=2400.0)
    parser.add_argument("--data", type=Path, default=DATA, help="folder with train/val/test2016")
    parser.add_argument("--out", type=Path, default=Path("runs/multi30k"), help="run folders")
    parser.add_argument(
        "--result", type=Path, default=harness.RESULTS / "translation_multi30k.json"
    )
    args = parser.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"{args.data}: Multi30k not found; pass --data")
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    warnings = harness.check_quiet(args.allow_busy)
    machine = harness.machine()
    pairs = read_parallel(args.data / "test2016.de", args.data / "test2016.en")
    test = ([s for s, _ in pairs], [t for _, t in pairs])

    runs = []
    for seed in harness.seeds(args):
        ours = run_qkv(args, seed, test)
        bf16 = ours["training"]["precision"] == "bf16"
        theirs = run_peer(args, seed, test, bf16)
        runs.append({"seed": seed, "qkv": ours, "peer": theirs})
    warnings += harness.busy_during(machine["load_average"][0])

    def figure(side: str, mode: str) -> dict[str, Any]:
        return harness.mean_sd([r[side]["test2016"][mode]["bleu"] for r in runs])

    harness.write_report(
        args.result,
        {
            "benchmark": "translation_multi30k",
            "machine": machine,
            "warnings": warnings,
            "budget_seconds": args.seconds,
            "test_sentences": len(test[0]),
            "beam_size": DecodeOptions().beam_size,
            "test2016_bleu": {
                side: {mode: figure(side, mode) for mode in ("greedy", "beam")}
                for side in ("qkv", "peer")
            },
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
