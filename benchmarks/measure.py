"""Measuring on a CPU: what the machine is, its matmul peak, and runs in interleaved rounds."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from qkv.launch import cpu_cores
from qkv.precision import cpu_features, cpu_generation, read_cpuinfo


def cpu_info() -> dict[str, Any]:
    """The processor's name and generation (two of one name may differ in speed), and the bf16
    features that decide whether bf16 runs in hardware."""
    entries = read_cpuinfo()
    model, flags = cpu_features(entries)
    return {
        "processor": model,
        "cpu_generation": cpu_generation(entries),
        **{flag: flag in flags for flag in ("amx_bf16", "avx512_bf16")},
    }


def matmul_gflops(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of an (n x n) @ (n x n) matmul in ``dtype``, best of ``repeats`` after a warm-up."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def describe() -> dict[str, Any]:
    """Cores, processor and its bf16 features, versions, and the load average now."""
    return {
        "cpu_count": os.cpu_count(),
        "affinity": cpu_cores(),
        "torch_threads": torch.get_num_threads(),
        **cpu_info(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def machine(repeats: int) -> dict[str, Any]:
    """``describe()`` and the measured matmul peak."""
    return {
        **describe(),
        "matmul_gflops": {
            "n": 2048,
            "fp32": round(matmul_gflops(torch.float32, repeats=repeats), 1),
            "bf16": round(matmul_gflops(torch.bfloat16, repeats=repeats), 1),
        },
    }


def interleaved(runners: dict[str, Callable[[int], int]], rounds: int) -> dict[str, list[float]]:
    """Units per second of each runner in each round; runner(round) returns the units it did.

    The order rotates every round, so no runner always goes first (or last).
    """
    names, rates = list(runners), {name: [] for name in runners}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            units = runners[name](r)
            rates[name].append(units / (time.perf_counter() - start))
    return rates


def summary(rates: list[float]) -> dict[str, Any]:
    return {
        "per_round": [round(x, 1) for x in rates],
        "median": round(statistics.median(rates), 1),
        "min": round(min(rates), 1),
    }


def ratios(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    per_round = [a / b for a, b in zip(ours, theirs, strict=True)]
    return {
        "per_round": [round(x, 3) for x in per_round],
        "median": round(statistics.median(per_round), 3),
        "min": round(min(per_round), 3),
    }
