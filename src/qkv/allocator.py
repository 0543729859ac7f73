"""Freed memory kept by the process on Linux (glibc), so that a step does not page-fault.

glibc's ``malloc`` hands large blocks back to the system when they are freed: those above a
size threshold are ``mmap``-ed and unmapped, and free memory at the top of the heap is
trimmed. PyTorch on a CPU frees and allocates the same activations at every step, so every
step maps, faults in and zeroes them again: training a translator on a 2-core CPU took
70,000 page faults a second, and 6% of its time was spent in the kernel. ``keep_freed_memory``
asks ``malloc`` (``mallopt``) to serve every block from its heap and to keep what is freed
for the next step; the process then holds its peak memory instead of shrinking between steps.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters (glibc malloc.h)
KEEP_BYTES = 1 << 30  # free memory at the top of the heap kept before any is trimmed


def keep_freed_memory() -> bool:
    """Ask glibc's ``malloc`` to keep freed memory for reuse, for the rest of this process.

    Returns:
        True where it took the settings (Linux with glibc); False elsewhere, where nothing
        changed (another C library, or ``malloc`` replaced by ``LD_PRELOAD``).
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)  # the process's own C library
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc: musl's mallopt does nothing
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
