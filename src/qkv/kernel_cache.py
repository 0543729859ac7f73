"""Room for more compiled kernels in oneDNN, PyTorch's CPU library for bf16 matrix products.

oneDNN compiles a kernel for every shape it multiplies and keeps the last 1,024 it used.
Training on batches of varying length, and decoding one position at a time, use more shapes
than that: validating a translator fills the cache with decoding's shapes, and training then
compiles its own again. A 40-minute Multi30k run fell from 6,860 to about 4,900 tokens/s this
way; with room for 16,384 kernels it held about 6,300 tokens/s to the end.

oneDNN reads ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` once, when it first compiles a kernel, so
``import qkv`` sets it before any product is computed. A value already in the environment wins.
"""

from __future__ import annotations

import os

CAPACITY = 16384  # kernels kept (oneDNN's default: 1,024)
VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def make_room() -> int:
    """Ask for ``CAPACITY`` kernels unless the environment names a capacity; return the value
    oneDNN will use (if no kernel was compiled in this process yet)."""
    return int(os.environ.setdefault(VARIABLE, str(CAPACITY)))
