"""Speed of qkv against peers on this machine: training, decoding, `qkv translate`, long inputs.

    .venv/bin/python benchmarks/speed.py [--quick] [--sections train,decode,cli,long] [--model RUN]

Writes benchmarks/results/speed.json (or --result PATH). Every comparison runs in this one
process on the same data, in interleaved rounds (the order alternates), so the ratios hold
even when the machine's speed drifts; absolute figures hold for this machine only.

- machine: cores, processor and its bf16 features, load, and the matmul peak measured now.
- train: qkv's Transformer and training step against a plain ``torch.nn.Transformer`` loop
  (benchmarks/peers/translation.py) on the same Multi30k token batches: real tokens/s, MFU.
- decode: qkv's greedy and beam search against Hugging Face MarianMT ``generate`` and
  CTranslate2, every sentence forced to exactly --new-tokens tokens.
- cli: ``python -m qkv translate`` end to end on test2016, start-up included.
- long: one attention layer's forward + backward at growing lengths, fused (SDPA) against
  the reference path, time and peak memory, each case in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, only benchmarks/ is on the path; the root makes `benchmarks` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from benchmarks.attention_paths import attention_section, long_section
from benchmarks.measure import interleaved, machine, ratios, summary
from qkv.config import ModelConfig
from qkv.data import EOS_ID, PAD_ID, SubwordTokenizer, pad_batch
from qkv.decoding import translate_ids
from qkv.jobs.translation.data import read_parallel
from qkv.model import Transformer
from qkv.precision import choose_precision

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"
RESULTS = ROOT / "benchmarks" / "results"
SECTIONS = ("attention", "train", "decode", "cli", "long")


# ---------------------------------------------------------------- helpers


def joint_tokenizer(limit: int | None) -> tuple[SubwordTokenizer, list[tuple[str, str]]]:
    """A joint 8k BPE trained on the Multi30k training text (its first ``limit`` pairs)."""
    pairs = read_parallel(DATA / "train.de", DATA / "train.en")[:limit]
    texts = [s for s, _ in pairs] + [t for _, t in pairs]
    return SubwordTokenizer.train(texts, vocab_size=8000), pairs


def small_config(vocab_size: int, norm_first: bool) -> ModelConfig:
    return ModelConfig.preset(
        "small",
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        share_embeddings=True,
        tie_output=True,
        norm_first=norm_first,
    )


# ---------------------------------------------------------------- training


@dataclass
class Trainee:
    """One model of the training comparison, with its optimizer and loss of a batch."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    loss: Callable[[Any], torch.Tensor]  # TranslationBatch -> mean loss per target token
    embedding: nn.Parameter  # the shared, tied token embedding
    encoder: nn.Module
    decoder: nn.Module
    losses: list[float] = field(default_factory=list)

    def step(self, batch: Any, bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
            loss = self.loss(batch)
        loss.backward()
        nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(round(loss.item(), 4))

    def flop_parameters(self) -> dict[str, int]:
        """Parameter counts for the FLOP estimate; the tied output layer counts once more."""
        unique = {id(p): p.numel() for p in self.module.parameters()}
        return {
            "non_embedding": sum(unique.values()) - self.embedding.numel(),
            "output_layer": self.embedding.numel(),
            "encoder": sum(p.numel() for p in self.encoder.parameters()),
            "decoder": sum(p.numel() for p in self.decoder.parameters()),
        }


def trainees(task: Any, vocab_size: int) -> dict[str, Trainee]:
    """qkv's small pre-norm Transformer and the plain peer of the same sizes, both seeded."""
    from benchmarks.peers.translation import PeerTranslator, peer_loss
    from qkv.training import TrainConfig, configure_optimizer

    torch.manual_seed(1)
    config = small_config(vocab_size, norm_first=True)
    model = Transformer(config).train()
    torch.manual_seed(1)
    peer = PeerTranslator(
        vocab_size,
        config.d_model,
        config.n_heads,
        config.n_encoder_layers,
        config.n_decoder_layers,
        config.d_ff,
        config.dropout,
        norm_first=True,
    ).train()
    return {
        "qkv": Trainee(
            model,
            configure_optimizer(model, TrainConfig(lr=1e-3)),
            lambda batch: task.loss(model, batch)[0],
            model.src_embed.token.weight,
            model.encoder,
            model.decoder,
        ),
        "peer": Trainee(
            peer,
            torch.optim.AdamW(peer.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9),
            lambda b: peer_loss(peer, b.src, b.tgt_in, b.tgt_out, label_smoothing=0.1),
            peer.embedding.weight,
            peer.transformer.encoder,
            peer.transformer.decoder,
        ),
    }


def train_section(args: argparse.Namespace, tokenizer: SubwordTokenizer, pairs, peak) -> dict:
    from qkv.jobs.translation.task import TranslationTask

    valid = read_parallel(DATA / "val.de", DATA / "val.en")[:8]  # unused: no validation
    task = TranslationTask(tokenizer, pairs, valid, max_tokens=args.max_tokens, label_smoothing=0.1)
    all_batches = task.train_batches(epoch=0, seed=1)
    need = args.warmup + args.rounds * args.steps
    batches = [all_batches[i % len(all_batches)] for i in range(need)]
    real = [int(b.src.ne(PAD_ID).sum()) + b.n_tokens for b in batches]
    models = trainees(task, tokenizer.vocab_size)
    # As the trainer decides: by timing this model's own linear layers, not a square matmul.
    precision = choose_precision("auto", torch.device("cpu"), model=models["qkv"].module)
    bf16 = precision.precision == "bf16"
    for model in models.values():
        for batch in batches[: args.warmup]:
            model.step(batch, bf16)

    def runner(model: Trainee) -> Callable[[int], int]:
        def run(r: int) -> int:
            first = args.warmup + r * args.steps
            for batch in batches[first : first + args.steps]:
                model.step(batch, bf16)
            return sum(real[first : first + args.steps])

        return run

    rates = interleaved({name: runner(model) for name, model in models.items()}, args.rounds)
    result: dict[str, Any] = {
        "precision": {"chosen": precision.precision, "reason": precision.reason},
        "vocab_size": tokenizer.vocab_size,
        "max_tokens": args.max_tokens,
        "batches": {
            "sentences": [b.src.size(0) for b in batches],
            "real_src_tokens": [int(b.src.ne(PAD_ID).sum()) for b in batches],
            "real_tgt_tokens": [b.n_tokens for b in batches],
            "padded_tokens": [b.src.numel() + b.tgt_in.numel() for b in batches],
        },
        "warmup_steps": args.warmup,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "unit": "real (non-padding) source + target tokens per second",
        "flops_formula": "mfu: 6 * (non_embedding + output_layer) * real tokens per step; "
        "mfu_split: 6 * (encoder * source + (decoder + output_layer) * target tokens)",
        "peak_gflops": peak["bf16" if bf16 else "fp32"],
        "notes": "qkv scores only real target tokens through the output layer; the peer all "
        "(B, T, V) logits. torch.nn.Transformer also drops attention weights (dropout=0.1); "
        "qkv's attention_dropout is 0. Same batches, same initial seed, own initialisations.",
    }
    src_share = sum(result["batches"]["real_src_tokens"]) / sum(real)
    for name, model in models.items():
        result[name] = {
            "tokens_per_s": summary(rates[name]),
            **mfu(model.flop_parameters(), statistics.median(rates[name]), src_share, result),
            "loss_first_last": [model.losses[0], model.losses[-1]],
        }
    result["ratio_qkv_over_peer"] = ratios(rates["qkv"], rates["peer"])
    return result


def mfu(params: dict[str, int], tokens_per_s: float, src_share: float, result: dict) -> dict:
    """Achieved FLOP/s over the measured matmul peak, by the two formulas of ``flops_formula``.

    6N per token counts every parameter for every token, although the encoder sees only the
    source and the decoder only the target: ``mfu`` is about twice ``mfu_split``.
    """
    peak = result["peak_gflops"] * 1e9
    whole = 6 * (params["non_embedding"] + params["output_layer"])
    decoder = params["decoder"] + params["output_layer"]
    split = 6 * (params["encoder"] * src_share + decoder * (1 - src_share))
    return {
        "parameters": params,
        "mfu": round(whole * tokens_per_s / peak, 4),
        "mfu_split": round(split * tokens_per_s / peak, 4),
    }


# ---------------------------------------------------------------- decoding


def decode_section(args: argparse.Namespace, tokenizer: SubwordTokenizer) -> dict:
    from benchmarks.peers import decoding as peers

    pairs = read_parallel(DATA / "test2016.de", DATA / "test2016.en")[: args.sentences]
    src_ids = [ids + [EOS_ID] for ids in tokenizer.encode_batch([s for s, _ in pairs])]
    src = pad_batch(src_ids)  # (B, S)
    n = args.new_tokens
    torch.manual_seed(1)
    model = Transformer(small_config(tokenizer.vocab_size, norm_first=False)).eval()

    def qkv_for_beam(beam: int) -> Callable[[int], int]:
        def run(_: int) -> int:
            outputs = translate_ids(
                model,
                src,
                beam_size=beam,
                length_penalty=1.0,
                max_len_ratio=0.0,
                max_len_add=n,
                min_len=n,
            )
            return sum(len(out) for out in outputs)

        return run

    engines: dict[str, peers.Decoder] = {"qkv": qkv_for_beam}
    result: dict[str, Any] = {
        "sentences": len(src_ids),
        "new_tokens_each": n,
        "source_tokens": int(src.ne(PAD_ID).sum()),
        "unit": "new tokens per second (sentences x new tokens / wall time of the call)",
        "threads": torch.get_num_threads(),
        "skipped": {},
    }
    try:
        engines["huggingface_marian"] = peers.marian(tokenizer.vocab_size, src, n)
    except ImportError:
        result["skipped"]["huggingface_marian"] = "skipped: pip install qkv[bench]"
    with tempfile.TemporaryDirectory(prefix="qkv-speed-ct2-") as folder:
        try:
            threads = torch.get_num_threads()
            engines.update(peers.ctranslate2(model, tokenizer, src_ids, n, Path(folder), threads))
        except ImportError as error:
            qkv_side = (error.name or "").startswith("qkv")
            missing = "export not available" if qkv_side else "pip install qkv[ctranslate2]"
            result["skipped"]["ctranslate2"] = f"skipped: {missing}"
        for beam in (1, args.beam):
            runners = {name: make(beam) for name, make in engines.items()}
            produced = {name: run(-1) for name, run in runners.items()}  # warm-up and check
            rates = interleaved(runners, args.decode_rounds)
            mode: dict[str, Any] = {
                "tokens_produced": produced,
                **{name: summary(r) for name, r in rates.items()},
            }
            for name in rates:
                if name != "qkv":
                    mode[f"ratio_qkv_over_{name}"] = ratios(rates["qkv"], rates[name])
            result["greedy" if beam == 1 else f"beam{beam}"] = mode
    return result


# ---------------------------------------------------------------- qkv translate


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{shlex.join(command)} failed: {done.stderr.strip()[-500:]}")
    return seconds


def cli_section(args: argparse.Namespace) -> dict:
    run = args.model or (ROOT / "runs" / "multi30k")
    if not run.is_dir():
        return {"skipped": f"no trained run folder at {run}; pass --model RUN"}
    python = [sys.executable, "-m", "qkv"]
    startup = [timed([*python, "--version"]) for _ in range(3)]
    lines = (DATA / "test2016.de").read_text(encoding="utf-8").splitlines()[: args.cli_sentences]
    result: dict[str, Any] = {
        "model": str(run),
        "sentences": len(lines),
        "startup_seconds": {
            "per_run": [round(s, 2) for s in startup],
            "min": round(min(startup), 2),
        },
        "note": "wall time of the whole command; without_startup subtracts the fastest "
        "`python -m qkv --version` (None where the run was not longer than that)",
    }
    with tempfile.TemporaryDirectory(prefix="qkv-speed-cli-") as folder:
        source, target = Path(folder) / "input.de", Path(folder) / "output.en"
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        for beam in (1, 5):
            command = [*python, "translate", "--model", str(run), "--beam", str(beam)]
            seconds = timed([*command, "--input", str(source), "--output", str(target)])
            written = len(target.read_text(encoding="utf-8").splitlines())
            if written != len(lines):
                raise RuntimeError(f"qkv translate wrote {written} lines for {len(lines)}")
            decoding = seconds - min(startup)
            result[f"beam{beam}"] = {
                "seconds": round(seconds, 2),
                "sentences_per_s": round(len(lines) / seconds, 2),
                "sentences_per_s_without_startup": round(len(lines) / decoding, 2)
                if decoding > 0
                else None,
            }
    return result


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny settings: a smoke test")
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset")
    p.add_argument("--rounds", type=int, help="interleaved training rounds (default 5)")
    p.add_argument("--steps", type=int, help="training steps per round (default 10)")
    p.add_argument("--model", type=Path, help="trained run for `qkv translate` (runs/multi30k)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per training batch")
    p.add_argument("--new-tokens", type=int, default=40, help="forced output length")
    p.add_argument("--beam", type=int, default=4, help="beam size of the decoding comparison")
    p.add_argument("--memory-budget", type=float, default=12.0, help="GiB for reference scores")
    p.add_argument("--result", type=Path, default=RESULTS / "speed.json")
    args = p.parse_args()
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"--sections {args.sections}: unknown {sorted(unknown)}; choose from {SECTIONS}")
    quick = args.quick
    args.rounds = args.rounds or (2 if quick else 5)
    args.steps = args.steps or (2 if quick else 10)
    args.warmup = 1 if quick else 3
    args.decode_rounds = args.rounds
    args.sentences = 4 if quick else 32
    args.cli_sentences = 4 if quick else 1000
    args.train_sentences = 3000 if quick else None
    args.max_length = 1024 if quick else 8192
    args.matmul_repeats = 3 if quick else 5
    args.attention_repeats = 2 if quick else 7
    return args


def print_table(report: dict[str, Any]) -> None:
    rows = [("what", "qkv", "peer", "qkv/peer")]
    train = report.get("train")
    if train:
        rows.append(
            (
                f"train tok/s ({train['precision']['chosen']})",
                train["qkv"]["tokens_per_s"]["median"],
                train["peer"]["tokens_per_s"]["median"],
                train["ratio_qkv_over_peer"]["median"],
            )
        )
        for key in ("mfu", "mfu_split"):
            rows.append((f"train {key}", train["qkv"][key], train["peer"][key], ""))
    for mode in ("greedy", f"beam{report['settings']['beam']}"):
        block = report.get("decode", {}).get(mode, {})
        for name in block:
            if name.startswith("ratio_qkv_over_"):
                peer = name.removeprefix("ratio_qkv_over_")
                row = (f"decode {mode} vs {peer}", block["qkv"]["median"], block[peer]["median"])
                rows.append((*row, block[name]["median"]))
    decode_skipped = report.get("decode", {}).get("skipped", {})
    rows += [(f"decode {name}", skipped, "", "") for name, skipped in decode_skipped.items()]
    cli = report.get("cli", {})
    if "skipped" in cli:
        rows.append(("qkv translate", "skipped (no run; --model RUN)", "", ""))
    for beam in ("beam1", "beam5"):
        if beam in cli:
            rows.append((f"qkv translate {beam} sent/s", cli[beam]["sentences_per_s"], "", ""))
    if report.get("attention"):
        rows.append(("attention: case", "sdpa ms", "reference ms", ""))
    for key, times in report.get("attention", {}).items():
        if key.endswith("_ms"):
            rows.append((f"  {key[:-3]}", times["sdpa"], times["reference"], ""))
    long = report.get("long", {})
    if "sdpa" in long:
        rows.append(("long inputs: T", "sdpa MiB", "ref MiB", "sdpa s / ref s"))
        for length, case in long["sdpa"]["cases"].items():
            ref = long["reference"]["cases"][length]
            seconds = f"{case['seconds_best']} / {ref.get('seconds_best', '-')}"
            rows.append(
                (f"  T={length}", case["peak_mib"], ref.get("peak_mib", "skipped"), seconds)
            )
        growth = [long[impl]["memory_ratio_last_doubling"] for impl in ("sdpa", "reference")]
        rows.append(("  memory x, last doubling of T", *growth, ""))
    for row in rows:
        print(f"{row[0]:<34} {row[1]!s:>12} {row[2]!s:>12} {row[3]!s:>16}")


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore", message="enable_nested_tensor")
    sections = args.sections.split(",")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report: dict[str, Any] = {
        "benchmark": "speed",
        "command": shlex.join(sys.argv),
        "settings": settings,
        "machine": machine(args.matmul_repeats),
    }
    tokenizer = pairs = None
    if {"train", "decode"} & set(sections):
        tokenizer, pairs = joint_tokenizer(args.train_sentences)
    peak = report["machine"]["matmul_gflops"]
    steps = {
        "attention": lambda: attention_section(args),
        "train": lambda: train_section(args, tokenizer, pairs, peak),
        "decode": lambda: decode_section(args, tokenizer),
        "cli": lambda: cli_section(args),
        "long": lambda: long_section(args),
    }
    for name in SECTIONS:
        if name in sections:
            start = time.perf_counter()
            report[name] = steps[name]()
            report[name]["section_seconds"] = round(time.perf_counter() - start, 1)
            print(f"{name}: done in {report[name]['section_seconds']} s", flush=True)
    report["machine"]["load_average_end"] = os.getloadavg()
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print_table(report)
    print(f"wrote {args.result}")


if __name__ == "__main__":
    main()
