"""The precision to train in: bf16 only where it is faster on this machine, measured.

oneDNN reports bf16 as supported on every recent x86 CPU, but only CPUs with AMX or
AVX512-BF16 run it in hardware; elsewhere it is emulated and a bf16 matmul runs several
times slower than fp32. And where it runs in hardware, a narrow model may still lose: bf16
autocast casts every layer's input and weight, and at small widths the casts cost what the
faster product saves. So ``auto`` times, on this device, the model's own linear layers
(each distinct shape, forward and backward, ``LAYER_ROWS`` rows) in fp32 and under bf16
autocast with its casts, keeps the answer per machine and model shapes in a small cache
file, and picks bf16 where they ran at least ``MIN_LAYER_SPEEDUP`` times as fast. Without a
model it times one square matmul (``measure_bf16_speedup``) against ``MIN_SPEEDUP``.

Legend: N rows, I and O a linear layer's input and output widths.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

PRECISIONS = ("auto", "bf16", "fp32")
# bf16 autocast adds casts around every matmul: a bf16 matmul must be clearly faster than
# fp32 for a training step to gain (at 4.4x a step gained; at 0.2x it ran at half speed).
MIN_SPEEDUP = 1.5
# The model's layers are timed with their casts, so less margin is needed. Whole training
# steps of each job's model (benchmarks/precision.py, AMD EPYC with AVX512-BF16): at a probe
# of 1.06 the ViT's step ran 0.91x as fast in bf16, at 1.52 the classifier's 1.05x, at 1.83
# and 1.87 the tagger's and the translator's 1.46x and 1.61x. The line lies between; near
# it the two precisions run about equally fast, so a pick on either side costs little.
MIN_LAYER_SPEEDUP = 1.2
LAYER_ROWS = 2048  # rows (tokens, patches) per timed product: a training batch's order


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


def read_cpuinfo(text: str | None = None) -> dict[str, str]:
    """The first processor's entries in /proc/cpuinfo (``text``, where given), by name; empty
    where there is no such file."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            return {}
    entries: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block ends at the first empty line
        name, _, value = line.partition(":")
        entries.setdefault(name.strip(), value.strip())
    return entries


def cpu_features(entries: dict[str, str] | None = None) -> tuple[str, set[str]]:
    """The processor's name and its feature flags (``read_cpuinfo``'s, by default)."""
    entries = read_cpuinfo() if entries is None else entries
    return entries.get("model name") or platform.processor(), set(entries.get("flags", "").split())


def cpu_generation(entries: dict[str, str] | None = None) -> str:
    """Vendor, family, model and stepping (``read_cpuinfo``'s, by default), e.g.
    ``AuthenticAMD family 26 model 2 stepping 1``; empty where unknown.

    Under a hypervisor the name may be only "AMD EPYC" for every generation: Zen 4 (family
    25) and Zen 5 (family 26) then read alike but train at different speeds.
    """
    entries = read_cpuinfo() if entries is None else entries
    if "cpu family" not in entries:
        return ""
    parts = [entries.get("vendor_id", "")]
    parts += [
        f"{key.split()[-1]} {entries[key]}"
        for key in ("cpu family", "model", "stepping")
        if key in entries
    ]
    return " ".join(part for part in parts if part)


def machine_key(device: torch.device) -> str:
    """What the measurement depends on: the processor, its bf16 features, torch, threads."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}|torch {torch.__version__}"
    entries = read_cpuinfo()
    model, flags = cpu_features(entries)
    features = ",".join(sorted(flags & {"amx_bf16", "avx512_bf16", "avx512f"}))
    return (
        f"cpu:{model}|{cpu_generation(entries)}|{features}|torch {torch.__version__}"
        f"|threads {torch.get_num_threads()}"
    )


def measure_bf16_speedup(device: torch.device, n: int = 1024, repeats: int = 5) -> float:
    """fp32 time / bf16 time of an (n x n) @ (n x n) matmul on ``device``, best of repeats."""

    def product(dtype: torch.dtype) -> Callable[[], None]:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        return lambda: a @ b

    fp32 = _best_seconds(product(torch.float32), device, repeats)
    return fp32 / _best_seconds(product(torch.bfloat16), device, repeats)


def linear_shapes(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """The distinct (input width, output width) of ``model``'s linear layers, sorted."""
    return tuple(
        sorted(
            {(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)}
        )
    )


def _best_seconds(run: Callable[[], None], device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first call warms up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times[1:])


def measure_layer_speedup(
    device: torch.device,
    shapes: Sequence[tuple[int, int]],
    rows: int = LAYER_ROWS,
    repeats: int = 3,
) -> float:
    """fp32 time / bf16-autocast time of linear layers of ``shapes``, forward and backward.

    Each layer multiplies (N, I) fp32 inputs by an fp32 (O, I) weight, as a model's layers do;
    under autocast the casts of input, weight and gradients are timed with the products.
    """
    generator = torch.Generator().manual_seed(0)  # leaves the training's random state alone
    layers = []
    for n_in, n_out in shapes:
        x = torch.randn(rows, n_in, generator=generator).to(device).requires_grad_()  # (N, I)
        w = torch.randn(n_out, n_in, generator=generator).to(device).requires_grad_()  # (O, I)
        grad = torch.randn(rows, n_out, generator=generator).to(device)  # (N, O)
        layers.append((x, w, grad))

    def step(dtype: torch.dtype | None) -> Callable[[], None]:
        def run() -> None:
            for x, w, grad in layers:
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    y = F.linear(x, w)  # (N, O)
                y.backward(grad.to(y.dtype))
                x.grad = w.grad = None

        return run

    fp32 = _best_seconds(step(None), device, repeats)
    return fp32 / _best_seconds(step(torch.bfloat16), device, repeats)


def faster_precision(speedup: float, needed: float = MIN_LAYER_SPEEDUP) -> str:
    """ "bf16" where the measured bf16 speedup reaches ``needed``, else "fp32"."""
    return "bf16" if speedup >= needed else "fp32"


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def cached_speedup(
    device: torch.device, measure: Callable[[torch.device], float], what: str = ""
) -> float:
    """The measured bf16 speedup of this machine (for ``what`` is timed, when named), from the
    cache or measured now and cached."""
    path = cache_path()
    key = machine_key(device) + (f"|{what}" if what else "")
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
    model: nn.Module | None = None,
) -> PrecisionChoice:
    """The precision for ``--precision requested`` on ``device``, with the reason.

    With ``model``, ``auto`` times its linear layers (``measure_layer_speedup``); without,
    one square matmul (``measure_bf16_speedup``). ``measure`` replaces either timing.
    """
    if requested == "fp32":
        return PrecisionChoice("fp32", "--precision fp32")
    if requested == "bf16":
        return PrecisionChoice("bf16", "--precision bf16")
    if not bf16_supported(device):
        return PrecisionChoice("fp32", f"this {device.type} has no bf16 support")
    if model is None:
        speedup = cached_speedup(device, measure or measure_bf16_speedup)
        needed, timed = MIN_SPEEDUP, "a bf16 matmul"
    else:
        shapes = linear_shapes(model)
        what = "linear " + " ".join(f"{i}x{o}" for i, o in shapes)
        speedup = cached_speedup(
            device, measure or (lambda d: measure_layer_speedup(d, shapes)), what
        )
        needed, timed = MIN_LAYER_SPEEDUP, "the model's linear layers in bf16 autocast"
    chosen = faster_precision(speedup, needed)
    verdict = "faster" if chosen == "bf16" else f"not {needed}x faster"
    reason = f"{timed} ran {speedup:.2f}x as fast as fp32 on this {device.type}: {verdict}"
    return PrecisionChoice(chosen, reason, round(speedup, 3))
