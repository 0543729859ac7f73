"""oneDNN's kernel cache: after ``import qkv`` it keeps more shapes than its default 1,024."""

import os
import subprocess
import sys

import pytest

from qkv import kernel_cache

SHAPES = 1100  # more than oneDNN's default capacity

# Multiplies SHAPES shapes twice in bf16 and prints, per pass, how many kernels oneDNN found
# compiled (cache_hit) and how many it compiled (cache_miss).
PASSES = f"""
import sys
import qkv, torch
w = torch.randn(16, 16)
for rnd in range(2):
    print("pass", rnd, flush=True)
    for rows in range(1, {SHAPES} + 1):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.functional.linear(torch.randn(rows, 16), w)
"""


def cache_counts(capacity: str | None) -> list[dict[str, int]]:
    env = {k: v for k, v in os.environ.items() if k != kernel_cache.VARIABLE}
    env["ONEDNN_VERBOSE"] = "2"  # one line per kernel made: create:cache_hit / cache_miss
    if capacity is not None:
        env[kernel_cache.VARIABLE] = capacity
    done = subprocess.run(
        [sys.executable, "-c", PASSES], capture_output=True, text=True, check=True, env=env
    )
    counts: list[dict[str, int]] = []
    for line in done.stdout.splitlines():
        if line.startswith("pass "):
            counts.append({"cache_hit": 0, "cache_miss": 0})
        elif ",matmul," in line and ",create:cache_" in line:
            counts[-1][line.split(",create:")[1].split(",")[0]] += 1
    return counts


def test_qkv_keeps_more_kernels_than_the_default_and_a_named_capacity_wins():
    default = cache_counts(None)
    if default[0]["cache_miss"] == 0:
        pytest.skip("this CPU does not multiply bf16 matrices with oneDNN")
    first, second = default
    assert first["cache_miss"] > 1024  # more kernels compiled than the default keeps
    assert second == {"cache_hit": first["cache_miss"], "cache_miss": 0}  # all of them kept
    # oneDNN's own default, named in the environment, is kept: the second pass finds nothing,
    # as each shape was pushed out before it came round again.
    small = cache_counts("1024")
    assert small[1] == {"cache_hit": 0, "cache_miss": first["cache_miss"]}


def test_make_room_leaves_a_named_capacity(monkeypatch):
    monkeypatch.setenv(kernel_cache.VARIABLE, "2048")
    assert kernel_cache.make_room() == 2048
    monkeypatch.delenv(kernel_cache.VARIABLE)
    assert kernel_cache.make_room() == kernel_cache.CAPACITY
