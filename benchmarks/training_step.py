"""Three parts of a CPU training step, each against its reference path in the same run.

    .venv/bin/python benchmarks/training_step.py [--quick] [--data DIR] [--result PATH]

- loss: the blockwise fused label-smoothed cross-entropy (``qkv.loss``, ``"fused"``) against
  ``F.cross_entropy`` on an fp32 copy (``"reference"``), forward + backward, on bf16 logits of
  N rows over V = 8,000 words (N = 2,000, what a 2,500-token Multi30k batch scores), in
  interleaved rounds.
- allocator: a Multi30k training step of ``qkv train translation``'s model and batches in a
  fresh process, with glibc's ``malloc`` as it comes (``"system"``) and with freed memory kept
  (``qkv.allocator``, ``"keep"``): milliseconds and page faults per step. The processes
  alternate, so drift of the machine's speed touches both.
- chars: the tagger's character encoder (``qkv.jobs.tagging.model.CharEncoder``, at the
  ``qkv train tagger`` defaults), forward + backward in bf16 on the distinct words of
  100-sentence batches of Multi30k's English side, pooling its convolution with
  ``max_pool_words`` (``"fast"``) against ``max_pool_words_reference``, in interleaved rounds.

Writes benchmarks/results/training_step.json (or --result PATH) with the machine and command.
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, only benchmarks/ is on the path; the root makes `benchmarks` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.measure import interleaved, machine, ratios, summary

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"
RESULT = ROOT / "benchmarks" / "results" / "training_step.json"


def loss_section(rounds: int, repeats: int, rows: int = 2000, vocab: int = 8000) -> dict:
    from qkv.loss import smoothed_cross_entropy

    torch.manual_seed(0)
    logits = (torch.randn(rows, vocab) * 3).bfloat16()
    target = torch.randint(0, vocab, (rows,))

    def runner(impl: str):
        def run(_: int) -> int:
            for _ in range(repeats):
                x = logits.clone().requires_grad_()
                smoothed_cross_entropy(x, target, 0.1, impl=impl).backward()
            return repeats

        return run

    runners = {impl: runner(impl) for impl in ("fused", "reference")}
    for run in runners.values():
        run(0)  # warm-up
    rates = interleaved(runners, rounds)  # calls per second
    ms = {impl: [1000 / r for r in rates[impl]] for impl in rates}
    return {
        "shape": {"rows": rows, "vocab": vocab, "dtype": "bfloat16", "smoothing": 0.1},
        "unit": "milliseconds per forward + backward",
        **{impl: {"ms": summary(ms[impl])} for impl in ms},
        "speedup_fused": ratios(rates["fused"], rates["reference"]),
    }


def chars_section(data: Path, rounds: int, batches: int) -> dict:
    from qkv.config import ModelConfig
    from qkv.jobs import get_job
    from qkv.jobs.tagging.data import WordEncoder, collate
    from qkv.jobs.tagging.model import (
        CHAR_DIM,
        CharEncoder,
        max_pool_words,
        max_pool_words_reference,
    )
    from qkv.jobs.translation.data import read_parallel

    sentences = [en.split() for _, en in read_parallel(data / "train.de", data / "train.en")]
    encoder = WordEncoder.train(sentences[:5000], 2000)
    chars = [
        collate([e for s in sentences[i : i + 100] for e in encoder.examples(s, None, 1024)]).chars
        for i in range(0, 100 * batches, 100)
    ]  # (U, C) each
    torch.manual_seed(0)
    d_model = ModelConfig.preset(get_job("tagger").preset).d_model  # the tagger's width
    model = CharEncoder(encoder.n_chars, CHAR_DIM, d_model).train()

    def runner(pool):
        def run(_: int) -> int:
            model.pool = pool
            for batch in chars:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(batch)  # (U, D)
                out.float().sum().backward()
            return len(chars)

        return run

    runners = {"fast": runner(max_pool_words), "reference": runner(max_pool_words_reference)}
    for run in runners.values():
        run(0)  # warm-up
    rates = interleaved(runners, rounds)  # batches per second
    ms = {name: [1000 / r for r in rates[name]] for name in rates}
    return {
        "shape": {
            "words_per_batch": round(statistics.mean(c.shape[0] for c in chars)),
            "chars_per_word": max(c.shape[1] for c in chars),
            "char_dim": CHAR_DIM,
            "channels": d_model,
            "dtype": "bfloat16",
        },
        "unit": "milliseconds per batch, forward + backward",
        **{name: {"ms": summary(ms[name])} for name in ms},
        "speedup_fast": ratios(rates["fast"], rates["reference"]),
    }


def worker(mode: str, data: Path, tokenizer_path: Path, warmup: int, steps: int) -> dict:
    """One process: ``steps`` timed training steps after ``warmup`` ones, malloc per ``mode``."""
    from qkv.allocator import keep_freed_memory

    if mode == "keep" and not keep_freed_memory():
        raise SystemExit("this C library is not glibc: nothing to compare")
    from qkv.config import ModelConfig
    from qkv.data import SubwordTokenizer
    from qkv.jobs import get_job
    from qkv.jobs.translation.data import read_parallel
    from qkv.jobs.translation.task import TranslationTask
    from qkv.model import Transformer
    from qkv.training import TrainConfig, configure_optimizer

    job = get_job("translation")
    tokenizer = SubwordTokenizer.load(tokenizer_path)
    pairs = read_parallel(data / "train.de", data / "train.en")
    settings = job.Settings()
    task = TranslationTask(
        tokenizer, pairs, pairs[:8], settings.max_tokens, settings.label_smoothing
    )
    batches = task.train_batches(epoch=0, seed=1)[: warmup + steps]
    vocab = tokenizer.vocab_size
    config = ModelConfig.preset(
        job.preset, src_vocab_size=vocab, tgt_vocab_size=vocab, **job.model_defaults
    )
    torch.manual_seed(1)
    model = Transformer(config).train()
    optimizer = configure_optimizer(model, TrainConfig(**job.train_defaults))

    def step(batch: Any) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = task.loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches[:warmup]:
        step(batch)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for batch in batches[warmup:]:
        step(batch)
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return {
        "ms_per_step": 1000 * seconds / steps,
        "page_faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
        "kernel_seconds_per_step": (after.ru_stime - before.ru_stime) / steps,
    }


def allocator_section(data: Path, rounds: int, warmup: int, steps: int) -> dict:
    from qkv.data import SubwordTokenizer
    from qkv.jobs.translation.data import read_parallel

    pairs = read_parallel(data / "train.de", data / "train.en")
    tokenizer = SubwordTokenizer.train([s for p in pairs for s in p], vocab_size=8000)
    runs: dict[str, list[dict]] = {"system": [], "keep": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        tokenizer.save(path)
        for r in range(rounds):
            for mode in ("system", "keep") if r % 2 == 0 else ("keep", "system"):
                command = [sys.executable, __file__, "--worker", mode, "--data", str(data)]
                command += ["--tokenizer", str(path), "--warmup", str(warmup)]
                command += ["--steps", str(steps)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))

    def column(mode: str, key: str) -> list[float]:
        return [round(run[key], 4) for run in runs[mode]]

    def figures(mode: str, key: str) -> dict[str, Any]:
        return {"per_process": column(mode, key), "median": statistics.median(column(mode, key))}

    return {
        "what": "Multi30k training steps of `qkv train translation`'s model and batches, bf16",
        "warmup_steps": warmup,
        "steps_per_process": steps,
        **{
            mode: {
                key: figures(mode, key)
                for key in ("ms_per_step", "page_faults_per_step", "kernel_seconds_per_step")
            }
            for mode in runs
        },
        "speedup_keep": ratios(
            [1 / x for x in column("keep", "ms_per_step")],
            [1 / x for x in column("system", "ms_per_step")],
        ),
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds and steps (a smoke run)")
    p.add_argument("--data", type=Path, default=DATA, help="the Multi30k folder")
    p.add_argument("--result", type=Path, default=RESULT)
    p.add_argument("--worker", choices=("system", "keep"), help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=10, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=30, help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        result = worker(args.worker, args.data, args.tokenizer, args.warmup, args.steps)
        print(json.dumps(result))
        return
    if not (args.data / "train.de").is_file():
        raise SystemExit(f"{args.data}: Multi30k not found; pass --data")
    quick = args.quick
    report: dict[str, Any] = {
        "benchmark": "training_step",
        "command": shlex.join(["python", *sys.argv]),
        "machine": machine(2 if quick else 5),
        "loss": loss_section(rounds=2 if quick else 7, repeats=2 if quick else 10),
    }
    report["chars"] = chars_section(args.data, rounds=2 if quick else 7, batches=3 if quick else 20)
    report["allocator"] = allocator_section(
        args.data, rounds=2, warmup=2 if quick else 10, steps=3 if quick else 30
    )
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    loss, alloc = report["loss"], report["allocator"]
    print(
        f"loss: fused {loss['fused']['ms']['median']} ms, reference "
        f"{loss['reference']['ms']['median']} ms (x{loss['speedup_fused']['median']})"
    )
    chars = report["chars"]
    print(
        f"chars: fast {chars['fast']['ms']['median']} ms, reference "
        f"{chars['reference']['ms']['median']} ms (x{chars['speedup_fast']['median']})"
    )
    print(
        f"step: keep {alloc['keep']['ms_per_step']['median']:.0f} ms, "
        f"{alloc['keep']['page_faults_per_step']['median']:.0f} faults; system "
        f"{alloc['system']['ms_per_step']['median']:.0f} ms, "
        f"{alloc['system']['page_faults_per_step']['median']:.0f} faults "
        f"(x{alloc['speedup_keep']['median']})"
    )
    print(f"wrote {args.result}")


if __name__ == "__main__":
    main()
