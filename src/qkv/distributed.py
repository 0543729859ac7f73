"""Training on several processes with PyTorch's own engine: ``torchrun``, DDP and FSDP.

Launched by ``torchrun``, each process trains on every world_size-th batch, either as a
DistributedDataParallel replica (``ddp``: each process holds the whole model, gradients are
averaged) or as a shard of one FullyShardedDataParallel model (``fsdp``: parameters, gradients
and optimizer state are split across processes). Rank 0 validates, writes the run folder and
shares its decisions. Launched plainly, everything here is a no-op for a single process.
"""

from __future__ import annotations

import copy
import gc
import os
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

T = TypeVar("T")


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes (0, 1 without torchrun)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """True on rank 0 (and in a plain single process): the one that writes and prints."""
    return rank_and_world()[0] == 0


def default_device() -> torch.device:
    """This process's GPU under torchrun (LOCAL_RANK), the GPU without it, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def setup_distributed(
    device: str | torch.device | None = None,
) -> tuple[int, int, torch.device]:
    """(rank, world_size, device); starts the process group when launched by torchrun."""
    device = torch.device(device) if device is not None else default_device()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rank, world = rank_and_world()
    return rank, world, device


def teardown() -> None:
    """End the process group, if one was started, before the process exits.

    Left to the interpreter's exit, gloo's threads can be torn down mid-flight and abort
    the process ("terminate called without an active exception"). Wrappers still holding the
    group (a DDP reducer in a reference cycle) are collected first, so that destroying the
    group really ends its threads while the interpreter is whole.
    """
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def main_process_first(work: Callable[[], T], then: Callable[[], T] | None = None) -> T:
    """Run ``work()`` on rank 0 while the other ranks wait, then ``then()`` (or ``work``) on them.

    For what must be made once and read by all, such as a tokenizer trained on the data.
    """
    rank, world = rank_and_world()
    if world > 1 and not dist.is_initialized():
        setup_distributed()
    if rank == 0:
        result = work()
    if world > 1:
        dist.barrier()
        if rank != 0:
            result = (then or work)()
    return result


def broadcast_flag(flag: bool, world: int, device: torch.device) -> bool:
    """Rank 0's decision, shared with every rank."""
    return bool(broadcast_number(float(flag), world, device))


def broadcast_number(value: float, world: int, device: torch.device) -> float:
    """Rank 0's value (a clock reading, a decision), shared with every rank."""
    if world == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=0)
    return tensor.item()


class Parallel:
    """How the training module is spread over the processes.

    Attributes:
        train_module: what the loop runs forward and backward (the model itself, its DDP
            wrapper, or the model sharded in place by FSDP).
        model: a whole, unsharded model on rank 0 for validation and saving: the model
            itself with ``ddp``, a copy kept up to date by ``gather`` with ``fsdp``.
    """

    def __init__(self, model: nn.Module, strategy: str, world: int, device: torch.device):
        self.strategy = strategy if world > 1 else "single"
        self.model = model
        if self.strategy == "ddp":
            device_ids = [device.index] if device.type == "cuda" else None
            self.train_module = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        elif self.strategy == "fsdp":
            from torch.distributed.fsdp import fully_shard

            self.model = copy.deepcopy(model) if dist.get_rank() == 0 else model
            self.train_module = fully_shard(model)
        else:
            self.train_module = model

    def no_sync(self, last: bool):
        """Skip the gradient exchange on all but the last micro-batch of an accumulation."""
        if last or self.strategy == "single":
            return nullcontext()
        if self.strategy == "ddp":
            return self.train_module.no_sync()
        return _FsdpNoSync(self.train_module)

    def gather(self) -> None:
        """Bring the sharded weights together into ``model`` on rank 0 (all ranks call it)."""
        if self.strategy != "fsdp":
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.train_module, options=options)
        if dist.get_rank() == 0:
            self.model.load_state_dict(state)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's whole state (all ranks call it; rank 0's is complete)."""
        if self.strategy != "fsdp":
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.train_module, optimizer, options=options)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load an optimizer state saved by ``optimizer_state`` (every rank calls it)."""
        if self.strategy != "fsdp":
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(self.train_module, optimizer, state, options=options)


class _FsdpNoSync:
    """FSDP2's way of accumulating gradients locally: no reduce-scatter until the last batch."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __enter__(self) -> None:
        self.module.set_requires_gradient_sync(False)

    def __exit__(self, *exc: object) -> None:
        self.module.set_requires_gradient_sync(True)
