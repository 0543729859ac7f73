"""The attention sections of benchmarks/speed.py: fused kernel against the three steps.

``attention_section`` times both paths at the short lengths qkv trains and decodes on (it
sets ``qkv.attention.fused_pays``); ``long_section`` times one attention layer's forward and
backward at growing lengths and reads its peak memory, each case in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from qkv.config import ModelConfig

GiB = 2**30


# ---------------------------------------------------------------- attention paths


def attention_section(args: argparse.Namespace) -> dict:
    """The fused kernel against the three steps as plain matmuls, at the shapes qkv meets.

    Training: forward + backward of (B, 4, T, 64) with a padding mask, B*T about 3,072
    tokens, in fp32 and bf16. Decoding: one query against T cached keys, 128 rows, fp32.
    These figures set ``qkv.attention.fused_pays`` (which ``attention_impl="auto"`` uses).
    """
    from qkv.attention import attention

    def training(impl: str, dtype: torch.dtype, length: int) -> Callable[[int], float]:
        batch = max(1, 3072 // length)
        shape = (batch, 4, length, 64)
        q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
        mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
        mask[::2, ..., length // 2 :] = False

        def run(_: int) -> float:
            start = time.perf_counter()
            out, _ = attention(q, k, v, mask, impl=impl)
            out.float().sum().backward()
            return time.perf_counter() - start

        return run

    def decoding(impl: str, length: int) -> Callable[[int], float]:
        q, k, v = (
            torch.randn(128, 4, 1, 64),
            torch.randn(128, 4, length, 64),
            torch.randn(128, 4, length, 64),
        )

        def run(_: int) -> float:
            start = time.perf_counter()
            attention(q, k, v, impl=impl)
            return time.perf_counter() - start

        return run

    def best_ms(run: Callable[[int], float]) -> float:
        return round(1000 * min(run(i) for i in range(args.attention_repeats)), 3)

    result: dict[str, Any] = {"what": attention_section.__doc__.split("\n\n")[1].strip()}
    for length in (24, 64, 128, 256):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            times = {impl: best_ms(training(impl, dtype, length)) for impl in IMPLS}
            times["fused_over_reference"] = round(times["sdpa"] / times["reference"], 2)
            result[f"train_T{length}_{name}_ms"] = times
        times = {impl: best_ms(decoding(impl, length)) for impl in IMPLS}
        times["fused_over_reference"] = round(times["sdpa"] / times["reference"], 2)
        result[f"decode_T{length}_fp32_ms"] = times
    return result


IMPLS = ("sdpa", "reference")


# ---------------------------------------------------------------- long inputs


def long_section(args: argparse.Namespace) -> dict:
    lengths = [512 * 2**i for i in range(5) if 512 * 2**i <= args.max_length]
    n_heads = ModelConfig.preset("small").n_heads
    result: dict[str, Any] = {
        "layer": "qkv.attention.MultiHeadAttention, d_model 256, 4 heads, batch 1, no mask",
        "memory": "peak RSS of the steps minus RSS before them, in a fresh process per case "
        "(VmHWM after resetting it through /proc/self/clear_refs; ru_maxrss where that fails)",
        "memory_budget_gib": args.memory_budget,
    }
    for impl in ("sdpa", "reference"):
        cases = {}
        for length in lengths:
            scores = n_heads * length * length * 4  # fp32 (B=1, H, T, T)
            if impl == "reference" and scores > args.memory_budget * GiB:
                cases[str(length)] = {"skipped": f"scores alone need {scores / GiB:.1f} GiB"}
                continue
            command = [sys.executable, str(Path(__file__).with_name("attention_memory.py"))]
            command += [impl, str(length)]
            command += ["--threads", str(torch.get_num_threads())]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            cases[str(length)] = json.loads(done.stdout.strip().splitlines()[-1])
        measured = [t for t in lengths if "peak_mib" in cases[str(t)]]
        growth = None
        if len(measured) >= 2:
            last, previous = cases[str(measured[-1])], cases[str(measured[-2])]
            growth = round(last["peak_mib"] / max(previous["peak_mib"], 1e-3), 2)
        result[impl] = {
            "cases": cases,
            "memory_ratio_last_doubling": growth,
            "memory_grows": None if growth is None else ("linear" if growth < 3 else "quadratic"),
        }
    return result
