"""Multi30k German->English: train a qkv translator for a fixed time budget, report BLEU.

    .venv/bin/python benchmarks/translation_multi30k.py --minutes 40 [--clock cpu]

The budget is wall-clock time, or with --clock cpu the process's CPU time per thread (the
time it had the whole machine, which holds when others share it).

Writes benchmarks/results/translation_multi30k.json: sacreBLEU (cased, detokenized, 13a) on
test2016 and val with the beam size and length penalty, greedy too, training wall time and
tokens/s. The peer figure is a plain torch.nn.Transformer of the `small` size trained on the
same 2-core CPU for 40 minutes and decoded greedily: 39.0 BLEU on test2016.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from qkv.config import ModelConfig
from qkv.jobs.run import run_job
from qkv.jobs.translation import JOB, TranslationSettings, Translator
from qkv.jobs.translation.data import read_parallel
from qkv.training import TrainConfig

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
RESULTS = Path(__file__).resolve().parent / "results"
PEER_TEST2016_BLEU = 39.0  # plain torch.nn.Transformer, small, 40 min, greedy, this CPU


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder with train/val/test2016")
    parser.add_argument("--minutes", type=float, default=40.0, help="training budget")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: count the budget in CPU time per thread (a shared machine)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/multi30k"), help="run folder")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=2500)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--average-last", type=int, default=5)
    parser.add_argument("--result", type=Path, default=RESULTS / "translation_multi30k.json")
    args = parser.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"{args.data}: Multi30k not found; pass --data")

    settings = TranslationSettings(
        train=str(args.data / "train"),
        valid=str(args.data / "val"),
        source_lang="de",
        target_lang="en",
        vocab_size=args.vocab_size,
        max_len=128,
        max_tokens=args.max_tokens,
        label_smoothing=0.1,
    )
    model = ModelConfig.preset(
        "small", norm_first=True, dropout=args.dropout, share_embeddings=True, tie_output=True
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
        progress=False,
    )
    summary = run_job(JOB, settings, model, config, force=True)

    scores = {}
    for split in ("test2016", "val"):
        pairs = read_parallel(args.data / f"{split}.de", args.data / f"{split}.en")
        src, ref = [s for s, _ in pairs], [t for _, t in pairs]
        for name, beam in (("greedy", 1), (f"beam{args.beam}", args.beam)):
            translator = Translator.load(
                args.out, beam_size=beam, length_penalty=args.length_penalty
            )
            start = time.monotonic()
            result = translator.evaluate(src, ref)
            scores[f"{split}_{name}"] = {
                "bleu": round(result["bleu"], 2),
                "chrf": round(result["chrf"], 2),
                "decode_seconds": round(time.monotonic() - start, 1),
            }
            print(split, name, scores[f"{split}_{name}"], flush=True)

    best = scores[f"test2016_beam{args.beam}"]["bleu"]
    report = {
        "benchmark": "translation_multi30k",
        "command": f"python benchmarks/translation_multi30k.py --minutes {args.minutes:g} "
        f"--clock {args.clock}",
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
        "beam": args.beam,
        "length_penalty": args.length_penalty,
        "peer": {
            "what": "torch.nn.Transformer small, greedy, 40 min",
            "test2016_bleu": PEER_TEST2016_BLEU,
        },
        "test2016_bleu_over_peer": round(best / PEER_TEST2016_BLEU, 3),
    }
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps({"test2016_bleu": best, "train_seconds": summary["train_seconds"]}))


if __name__ == "__main__":
    main()
