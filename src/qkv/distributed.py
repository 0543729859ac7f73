"""Training on several processes with PyTorch's own engine: ``torchrun`` and DDP.

Launched by ``torchrun``, each process trains a DistributedDataParallel replica on every
world_size-th batch; rank 0 validates, writes the run folder, and shares its decisions.
Launched plainly, everything here is a no-op for a single process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def setup_distributed() -> tuple[int, int, torch.device]:
    """(rank, world_size, device); starts the process group when launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return rank, world, device


def main_process_first(work: Callable[[], T], then: Callable[[], T] | None = None) -> T:
    """Run ``work()`` on rank 0 while the other ranks wait, then ``then()`` (or ``work``) on them.

    For what must be made once and read by all, such as a tokenizer trained on the data.
    """
    rank, world, _ = setup_distributed()
    if world == 1 or rank == 0:
        result = work()
    if world > 1:
        dist.barrier()
        if rank != 0:
            result = (then or work)()
    return result


def broadcast_flag(flag: bool, world: int, device: torch.device) -> bool:
    """Rank 0's decision, shared with every rank."""
    if world == 1:
        return flag
    tensor = torch.tensor([int(flag)], device=device)
    dist.broadcast(tensor, src=0)
    return bool(tensor.item())
