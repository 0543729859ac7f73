"""The peers' training loop: what a PyTorch user writes by hand around a model.

AdamW (betas 0.9, 0.98), linear warmup then inverse square root decay, gradient clipping,
stopped by a wall-clock budget. Nothing here comes from qkv's trainer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class PeerRecipe:
    lr: float = 1e-3
    warmup_steps: int = 1000
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    label_smoothing: float = 0.1
    bf16: bool = False  # autocast to bfloat16 (where the machine runs it faster)


def train_for(
    model: nn.Module,
    batches: Callable[[int], Iterator[Any]],
    loss_fn: Callable[[nn.Module, Any], Tensor],
    seconds: float,
    recipe: PeerRecipe,
    seed: int = 1,
) -> dict[str, Any]:
    """Train until ``seconds`` of wall time have passed; ``batches(epoch)`` yields batches.

    Returns the steps, epochs, seconds and last loss.
    """
    torch.manual_seed(seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": recipe.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ],
        lr=recipe.lr,
        betas=(0.9, 0.98),
    )

    def factor(step: int) -> float:
        step = max(step, 1)
        if step < recipe.warmup_steps:
            return step / recipe.warmup_steps
        return math.sqrt(recipe.warmup_steps / step)

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    start, steps, epoch, loss = time.perf_counter(), 0, 0, float("nan")
    while time.perf_counter() - start < seconds:
        for batch in batches(epoch):
            with torch.autocast("cpu", torch.bfloat16, enabled=recipe.bf16):
                value = loss_fn(model, batch)
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_norm)
            optimizer.step()
            schedule.step()
            steps, loss = steps + 1, value.item()
            if time.perf_counter() - start >= seconds:
                break
        else:
            epoch += 1
    model.eval()
    return {
        "steps": steps,
        "epochs": epoch,
        "train_seconds": round(time.perf_counter() - start, 1),
        "last_loss": round(loss, 4),
    }
