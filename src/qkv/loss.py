"""The training loss: label-smoothed cross-entropy of the output part's logits, in fp32.

With smoothing s over V classes, the target distribution puts 1 - s on the gold class and
s / V on every class, so the loss of one row of logits x with gold class y is

    logsumexp(x) - (1 - s) x[y] - (s / V) sum(x)

and its gradient is softmax(x) - (1 - s) onehot(y) - s / V.

``"reference"`` is ``F.cross_entropy(logits.float(), ..., label_smoothing=s)``: it keeps an
fp32 copy of all logits, their log-softmax and, in the backward pass, the gradient of each.
``"fused"`` walks the rows in blocks small enough to stay in the cache and computes each
block's loss and gradient in one go; the backward pass only scales the stored gradient. Over
an 8,000-word vocabulary that is several passes over an (N, V) matrix fewer.

Legend: N rows (scored tokens), V classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

LOSS_IMPLS = ("fused", "reference")
BLOCK_ELEMENTS = 1 << 19  # fp32 logits per block: 2 MiB, a core's L2 cache (64 rows of 8,000)


def _blockwise_loss_and_grad(
    logits: Tensor, target: Tensor, smoothing: float, block_elements: int, want_grad: bool
) -> tuple[Tensor, Tensor | None]:
    """(summed loss, its gradient with respect to the logits or None), block by block."""
    n, v = logits.shape
    block = max(1, block_elements // v)  # rows
    grad = torch.empty_like(logits) if want_grad else None  # (N, V), the logits' dtype
    total = torch.zeros((), dtype=torch.float32, device=logits.device)
    for start in range(0, n, block):
        # A copy even of fp32 logits: the block is turned into its gradient in place.
        x = logits[start : start + block].to(torch.float32, copy=True)  # (b, V)
        gold = target[start : start + block, None]  # (b, 1)
        lse = torch.logsumexp(x, dim=-1, keepdim=True)  # (b, 1)
        rows = lse - (1 - smoothing) * x.gather(1, gold) - smoothing / v * x.sum(-1, True)
        total += rows.sum()
        if grad is not None:
            p = x.sub_(lse).exp_().sub_(smoothing / v)  # softmax - s/V, in place
            p.scatter_add_(1, gold, p.new_full(gold.shape, smoothing - 1))
            grad[start : start + block] = p
    return total, grad


class _FusedSmoothedCrossEntropy(torch.autograd.Function):
    """Sum over rows of the label-smoothed cross-entropy; the gradient is made in forward."""

    @staticmethod
    def forward(
        ctx, logits: Tensor, target: Tensor, smoothing: float, block_elements: int
    ) -> Tensor:
        with torch.autocast(logits.device.type, enabled=False):  # fp32 whatever the context
            total, grad = _blockwise_loss_and_grad(
                logits, target, smoothing, block_elements, ctx.needs_input_grad[0]
            )
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, grad_total: Tensor) -> tuple[Tensor | None, None, None, None]:
        (grad,) = ctx.saved_tensors
        # A 0-dim fp32 factor: the product is taken in fp32 and rounded once, as the
        # reference's fp32 gradient is rounded once to the logits' dtype.
        return grad * grad_total, None, None, None


def smoothed_cross_entropy(
    logits: Tensor,
    target: Tensor,
    smoothing: float = 0.0,
    impl: str = "fused",
    block_elements: int = BLOCK_ELEMENTS,
) -> Tensor:
    """Summed label-smoothed cross-entropy, computed in fp32 whatever the logits' dtype.

    Args:
        logits: (N, V) unnormalised scores.
        target: (N,) gold class of each row (every row is scored; select rows beforehand).
        smoothing: s, the probability mass spread evenly over all V classes.
        impl: ``"fused"`` (blockwise, the gradient made in the forward pass) or
            ``"reference"`` (``F.cross_entropy`` on an fp32 copy); they agree to fp32 rounding.
        block_elements: logits per block of the fused path (whole rows, at least one).

    Returns:
        A 0-dim fp32 tensor: the sum over the N rows.
    """
    if impl not in LOSS_IMPLS:
        raise ValueError(f"loss impl {impl!r} must be one of {LOSS_IMPLS}")
    if impl == "reference":
        return F.cross_entropy(logits.float(), target, label_smoothing=smoothing, reduction="sum")
    return _FusedSmoothedCrossEntropy.apply(logits, target, smoothing, block_elements)
