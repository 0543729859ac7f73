"""UD English-EWT part-of-speech tagging: train a qkv tagger for a fixed wall-clock budget.

    .venv/bin/python benchmarks/tagging_ud_ewt.py --minutes 20

Writes benchmarks/results/tagging_ud_ewt.json: UPOS accuracy and macro-F1 on the test split
(and dev), accuracy on words never seen in training, training wall time and words/s. Trained
from scratch on the CPU. The peer figure is a plain word-level Transformer tagger (word,
suffix and capitalisation features, no characters or subwords) on the same data: its test
UPOS accuracy plateaus at 90.3%. Strong pipelines (e.g. Stanza) reach 95-97%.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from qkv.config import ModelConfig
from qkv.jobs.run import run_job
from qkv.jobs.tagging import JOB, Tagger, TaggerSettings, read_conllu
from qkv.training import TrainConfig

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud_english_ewt"
RESULTS = Path(__file__).resolve().parent / "results"
PEER_TEST_UPOS = 90.3  # plain word-level Transformer tagger, test UPOS accuracy


def unseen_word_accuracy(tagger: Tagger, sentences, known: set[str]) -> dict[str, float]:
    """Accuracy on the words that never occur in the training file, and their share."""
    right = total = 0
    tagged = tagger.tag([s.words for s in sentences])
    for sentence, output in zip(sentences, tagged, strict=True):
        for (word, tag), gold in zip(output, sentence.tags, strict=True):
            if word not in known:
                total += 1
                right += tag == gold
    words = sum(len(s.words) for s in sentences)
    return {
        "unseen_word_accuracy": round(100.0 * right / max(total, 1), 2),
        "unseen_word_share": round(100.0 * total / max(words, 1), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder with en_ewt-ud-*.conllu")
    parser.add_argument("--minutes", type=float, default=20.0, help="training budget")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: count the budget in CPU time per thread (a shared machine)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/ud_ewt"), help="run folder")
    parser.add_argument("--tagset", default="upos", choices=("upos", "xpos"))
    parser.add_argument("--preset", default="small")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--char-dim", type=int, default=64)
    parser.add_argument("--token-dropout", type=float, default=0.1)
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--average-last", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--result", type=Path, default=RESULTS / "tagging_ud_ewt.json")
    args = parser.parse_args()
    files = {split: args.data / f"en_ewt-ud-{split}.conllu" for split in ("train", "dev", "test")}
    if not all(path.is_file() for path in files.values()):
        raise SystemExit(f"{args.data}: UD English-EWT not found; pass --data")

    model = ModelConfig.preset(
        args.preset, norm_first=True, dropout=args.dropout, n_encoder_layers=args.layers
    )
    config = TrainConfig(
        out=str(args.out),
        max_steps=1_000_000,
        max_time=args.minutes * 60,
        clock=args.clock,
        lr=args.lr,
        warmup_steps=args.warmup,
        eval_every=args.eval_every,
        log_every=50,
        average_last=args.average_last,
        precision="auto",
        seed=args.seed,
        progress=False,
    )
    settings = TaggerSettings(
        train=str(files["train"]),
        valid=str(files["dev"]),
        tagset=args.tagset,
        vocab_size=args.vocab_size,
        max_tokens=args.max_tokens,
        char_dim=args.char_dim,
        token_dropout=args.token_dropout,
        label_smoothing=args.label_smoothing,
        max_len=1024,
    )
    summary = run_job(JOB, settings, model, config, force=True)

    tagger = Tagger.load(args.out)
    known = {w for s in read_conllu(files["train"], args.tagset) for w in s.words}
    scores = {}
    for split in ("test", "dev"):
        sentences = read_conllu(files[split], args.tagset)
        start = time.monotonic()
        result = tagger.evaluate(sentences)
        scores[split] = {
            "accuracy": round(result["accuracy"], 2),
            "macro_f1": round(result["macro_f1"], 2),
            "words": result["words"],
            **unseen_word_accuracy(tagger, sentences, known),
            "tag_seconds": round(time.monotonic() - start, 1),
        }
        print(split, scores[split], flush=True)

    test = scores["test"]["accuracy"]
    report = {
        "benchmark": "tagging_ud_ewt",
        "command": shlex.join(["python", "benchmarks/tagging_ud_ewt.py", *sys.argv[1:]]),
        "machine": {
            "cpus": torch.get_num_threads(),
            "processor": platform.processor(),
            "torch": torch.__version__,
        },
        "settings": {
            **vars(args),
            "data": str(args.data),
            "out": str(args.out),
            "result": str(args.result),
            "model": model.to_dict(),
        },
        "training": summary,
        "scores": scores,
        "tagset": args.tagset,
        "peer": {
            "what": "plain word-level Transformer tagger (words, suffixes, capitalisation)",
            "test_upos_accuracy": PEER_TEST_UPOS,
        },
        "test_accuracy_over_peer": round(test / PEER_TEST_UPOS, 3),
    }
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps({"test_upos_accuracy": test, "train_seconds": summary["train_seconds"]}))


if __name__ == "__main__":
    main()
