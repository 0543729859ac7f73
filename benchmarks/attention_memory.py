"""One case of speed.py's long-input section, in a fresh process: time and peak memory.

    .venv/bin/python benchmarks/attention_memory.py sdpa 4096 [--threads N] [--repeats 3]

Runs forward + backward of one ``qkv.attention.MultiHeadAttention`` (the ``small`` sizes:
d_model 256, 4 heads; batch 1, no mask) over T positions with ``attention_impl`` IMPL, and
prints one JSON line: the first and best step time and the peak memory of the steps.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import time

import torch

from qkv.attention import MultiHeadAttention
from qkv.config import ATTENTION_IMPLS, ModelConfig

MiB = 2**20


def resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Start this process's peak RSS afresh (Linux 4.0+), so import-time peaks do not count."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes(reset: bool) -> int:
    """The peak RSS since ``reset_peak_rss``: VmHWM, the memory map's own high-water mark.

    ``ru_maxrss`` is also the high-water mark of threads that have exited (torch starts and
    ends a few while importing), which clear_refs cannot reset; it is the fallback.
    """
    if reset:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def attention_case(impl: str, length: int, repeats: int = 3) -> dict[str, float]:
    """Forward + backward of one attention layer over ``length`` positions, ``repeats`` times."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(ModelConfig.preset("small", attention_impl=impl))
    warm = torch.randn(1, 64, layer.d_model, requires_grad=True)
    layer(warm)[0].sum().backward()  # loads lazily initialised kernels outside the measurement
    layer.zero_grad(set_to_none=True)
    x = torch.randn(1, length, layer.d_model, requires_grad=True)  # (B, T, D)
    del warm
    gc.collect()
    reset = reset_peak_rss()
    before = resident_bytes()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out, _ = layer(x)
        out.sum().backward()
        times.append(time.perf_counter() - start)
        del out
        x.grad = None
        layer.zero_grad(set_to_none=True)
    return {
        "seconds_first": round(times[0], 4),
        "seconds_best": round(min(times[1:] or times), 4),
        "peak_mib": round((peak_rss_bytes(reset) - before) / MiB, 1),
        "peak_source": "VmHWM" if reset else "ru_maxrss",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("impl", choices=ATTENTION_IMPLS)
    parser.add_argument("length", type=int, help="positions T")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(json.dumps(attention_case(args.impl, args.length, args.repeats)))


if __name__ == "__main__":
    main()
