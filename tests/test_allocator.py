"""The allocator: with freed memory kept, repeating a step's allocations faults no pages."""

import subprocess
import sys

import pytest

from qkv.allocator import keep_freed_memory

# The same allocations six times (as training steps); the page faults of the last three are printed.
STEP = """
import resource, sys, torch
from qkv.allocator import keep_freed_memory
torch.set_num_threads(1)
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():  # 40-48 MiB blocks: above the largest size glibc serves from its heap unasked
    for rows in (5000, 6000, 5500):
        h = torch.ones(rows, 2048) * 2  # fp32: rows x 8 KiB
        h.relu().sum()
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", STEP, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is Linux's")
def test_kept_memory_is_reused_without_page_faults():
    if not keep_freed_memory():
        pytest.skip("this process's C library is not glibc")
    plain, kept = page_faults("system"), page_faults("keep")
    assert plain > 10_000  # each block mapped and faulted in again: 10,000+ pages apiece
    assert kept < plain / 10


# Freed blocks between live ones stay in the heap (kept) until they are released.
HOLES = """
import os, torch
from qkv.allocator import keep_freed_memory, release_freed_memory
def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
assert keep_freed_memory()
big, live = [], []
for _ in range(20):
    big.append(torch.ones(5_000_000))  # 20 MB
    live.append(torch.ones(1000))  # a small block after each keeps the heap from shrinking
del big
kept = resident_mib()
assert release_freed_memory()
print(kept, resident_mib())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is Linux's")
def test_released_holes_go_back_to_the_system():
    if not keep_freed_memory():
        pytest.skip("this process's C library is not glibc")
    done = subprocess.run([sys.executable, "-c", HOLES], capture_output=True, text=True, check=True)
    kept, released = map(float, done.stdout.split())
    assert kept - released > 300  # of the 400 MB freed, most leave the process
