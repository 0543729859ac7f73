"""The precision to train in: bf16 only where it is faster on this machine, measured.

oneDNN reports bf16 as supported on every recent x86 CPU, but only CPUs with AMX or
AVX512-BF16 run it in hardware; elsewhere it is emulated and a bf16 matmul runs several
times slower than fp32. So ``auto`` times one fp32 and one bf16 matmul on this device (a
fraction of a second), keeps the answer per machine in a small cache file, and picks bf16
only when it is clearly faster.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

PRECISIONS = ("auto", "bf16", "fp32")
# bf16 autocast adds casts around every matmul: a bf16 matmul must be clearly faster than
# fp32 for a training step to gain (at 4.4x a step gained; at 0.2x it ran at half speed).
MIN_SPEEDUP = 1.5


@dataclass
class PrecisionChoice:
    """What to compute in and why, for the log and summary.json."""

    precision: str  # "bf16" or "fp32"
    reason: str
    bf16_speedup: float | None = None  # fp32 matmul time / bf16 matmul time, where measured

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.precision == "bf16" else None


def cache_path() -> Path:
    root = os.environ.get("QKV_CACHE") or Path.home() / ".cache" / "qkv"
    return Path(root) / "precision.json"


def cpu_features() -> tuple[str, set[str]]:
    """The processor's name and its feature flags (from /proc/cpuinfo where there is one)."""
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return model, flags


def machine_key(device: torch.device) -> str:
    """What the measurement depends on: the processor, its bf16 features, torch, threads."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}|torch {torch.__version__}"
    model, flags = cpu_features()
    features = ",".join(sorted(flags & {"amx_bf16", "avx512_bf16", "avx512f"}))
    return f"cpu:{model}|{features}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def measure_bf16_speedup(device: torch.device, n: int = 1024, repeats: int = 5) -> float:
    """fp32 time / bf16 time of an (n x n) @ (n x n) matmul on ``device``, best of repeats."""

    def best(dtype: torch.dtype) -> float:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            a @ b
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return min(times[1:])

    return best(torch.float32) / best(torch.bfloat16)


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def cached_speedup(device: torch.device, measure: Callable[[torch.device], float]) -> float:
    """The measured bf16 speedup of this machine, from the cache or measured now and cached."""
    path, key = cache_path(), machine_key(device)
    try:
        cache = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache.get(key), int | float):
        return float(cache[key])
    speedup = measure(device)
    cache[key] = round(speedup, 3)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a read-only home only costs a new measurement next time
        pass
    return speedup


def choose_precision(
    requested: str,
    device: torch.device,
    measure: Callable[[torch.device], float] | None = None,
) -> PrecisionChoice:
    """The precision for ``--precision requested`` on ``device``, with the reason.

    ``measure`` times bf16 against fp32 (default: ``measure_bf16_speedup``).
    """
    if requested == "fp32":
        return PrecisionChoice("fp32", "--precision fp32")
    if requested == "bf16":
        return PrecisionChoice("bf16", "--precision bf16")
    if not bf16_supported(device):
        return PrecisionChoice("fp32", f"this {device.type} has no bf16 support")
    speedup = cached_speedup(device, measure or measure_bf16_speedup)
    faster = speedup >= MIN_SPEEDUP
    verdict = "faster" if faster else f"not {MIN_SPEEDUP}x faster"
    reason = f"a bf16 matmul ran {speedup:.2f}x as fast as fp32 on this {device.type}: {verdict}"
    return PrecisionChoice("bf16" if faster else "fp32", reason, round(speedup, 3))
