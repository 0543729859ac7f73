"""``qkv train --processes N``: the same command on N processes of this machine, by torchrun.

The command re-runs itself under PyTorch's elastic launcher (what ``torchrun --standalone
--nproc_per_node N`` runs), each process a DDP replica (or FSDP shard) with its share of the
CPU threads. On the 2-core CPU the benchmarks run on, two one-thread processes trained the
Multi30k translator at only 1.05-1.15x the tokens/s of one two-thread process, so one
process stays the default; measure on your machine.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Sequence

from qkv.errors import InputError


def launched() -> bool:
    """True inside a process that torchrun started (it sets WORLD_SIZE)."""
    return "WORLD_SIZE" in os.environ


def cpu_cores() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_process(processes: int, threads: int | None) -> int:
    """--threads if given, else an equal share of the cores (at least one)."""
    return threads if threads is not None else max(1, cpu_cores() // processes)


def launch(processes: int, argv: Sequence[str], threads: int | None = None) -> int:
    """Run ``python -m qkv argv`` on ``processes`` local processes; their exit status."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if processes < 1:
        raise InputError(f"--processes {processes} must be at least 1")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=processes,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, as torchrun --standalone
        max_restarts=0,
        monitor_interval=0.1,
    )
    # Each worker inherits this environment: its thread count, before torch starts.
    os.environ["OMP_NUM_THREADS"] = str(threads_per_process(processes, threads))
    # The workers speak for themselves; the launcher's own log would repeat their failure.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        elastic_launch(config, sys.executable)("-m", "qkv", *argv)
    except ChildFailedError as error:  # the worker has printed its own error already
        return next(iter(error.failures.values())).exitcode or 1
    return 0
