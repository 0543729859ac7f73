"""A plain peer ViT, written as a PyTorch user would from ``torch.nn.TransformerEncoder``.

Nothing here comes from qkv's model code: non-overlapping patches cut and projected by one
``nn.Conv2d`` (kernel = stride = patch side), a learned [CLS] vector in front, learned position
embeddings, ``nn.TransformerEncoder`` (batch_first, pre-norm, GELU, a final LayerNorm) and a
linear head on the [CLS] output. It trains with the peers' loop (``loop.train_for``) on the
same digits train split as ``qkv train vit`` and the simplest of its augmentations: each epoch
every training image is moved by up to one pixel each way, edges repeated (qkv also rotates by
up to 10 degrees and zooms by up to 10%; the peer does not). It selects nothing: the weights
at the end of the budget are the ones scored.

Legend: B batch, C channels, Hi image height, Wi image width, N patches, S sequence (1 + N),
D model width, K classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .common import encoder_stack
from .loop import PeerRecipe, train_for

# The sizes and recipe of qkv's default ViT on the digits (``qkv train vit``).
PEER_SIZES = dict(d_model=64, nhead=4, dim_feedforward=128, num_layers=4, dropout=0.1)
PEER_RECIPE = PeerRecipe(
    lr=3e-3, warmup_steps=200, weight_decay=0.05, clip_norm=1.0, label_smoothing=0.1
)
BATCH_SIZE = 64
MAX_SHIFT = 1  # pixels each way


class PeerViT(nn.Module):
    """Images (B, C, Hi, Wi) -> class logits (B, K), around ``nn.TransformerEncoder``.

    Args:
        image_size, channels, patch_size: square images cut into patch_size-pixel squares.
        n_classes: outputs of the head.
        d_model, nhead, dim_feedforward, num_layers, dropout: the encoder's sizes.
    """

    def __init__(
        self,
        image_size: int = 8,
        channels: int = 1,
        patch_size: int = 2,
        n_classes: int = 10,
        d_model: int = 64,
        nhead: int = 4,
        dim_feedforward: int = 128,
        num_layers: int = 4,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        n_patches = (image_size // patch_size) ** 2
        self.patches = nn.Conv2d(channels, d_model, kernel_size=patch_size, stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        self.positions = nn.Parameter(torch.randn(1, 1 + n_patches, d_model) * 0.02)
        self.dropout = nn.Dropout(dropout)
        self.encoder = encoder_stack(d_model, nhead, dim_feedforward, dropout, num_layers)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, images: Tensor) -> Tensor:
        x = self.patches(images)  # (B, D, Hi/P, Wi/P)
        x = x.flatten(2).transpose(1, 2)  # (B, N, D)
        cls = self.cls.expand(x.size(0), -1, -1)  # (B, 1, D)
        x = torch.cat([cls, x], dim=1) + self.positions  # (B, S, D)
        x = self.encoder(self.dropout(x))  # (B, S, D)
        return self.head(x[:, 0])  # (B, K)


def shift(images: Tensor, max_shift: int, generator: torch.Generator) -> Tensor:
    """Each image moved by up to ``max_shift`` pixels each way, edge pixels repeated.

    (B, C, Hi, Wi) -> (B, C, Hi, Wi): every possible move is cut from the padded batch and
    one is picked per image.
    """
    if max_shift <= 0:
        return images
    B, _, Hi, Wi = images.shape
    side = 2 * max_shift + 1
    padded = F.pad(images, [max_shift] * 4, mode="replicate")  # (B, C, Hi + 2m, Wi + 2m)
    moves = torch.stack(
        [padded[:, :, y : y + Hi, x : x + Wi] for y in range(side) for x in range(side)]
    )  # (side * side, B, C, Hi, Wi)
    pick = torch.randint(0, side * side, (B,), generator=generator)
    return moves[pick, torch.arange(B)]  # (B, C, Hi, Wi)


def train_peer(
    images: Tensor, labels: Tensor, seconds: float, seed: int, patch_size: int = 2
) -> tuple[PeerViT, dict[str, Any]]:
    """A ``PeerViT`` trained on (images, labels) for ``seconds`` of wall time.

    Args:
        images: (B, C, Hi, Wi) in [0, 1], square.
        labels: (B,) class ids 0..K-1.
    Returns:
        (the model in eval mode, the loop's steps, epochs, seconds and last loss)
    """
    torch.manual_seed(seed)
    model = PeerViT(
        images.size(-1), images.size(1), patch_size, int(labels.max()) + 1, **PEER_SIZES
    )

    def batches(epoch: int) -> Iterator[tuple[Tensor, Tensor]]:
        generator = torch.Generator().manual_seed(seed * 1000 + epoch)
        order = torch.randperm(len(labels), generator=generator)
        moved = shift(images[order], MAX_SHIFT, generator)
        for i in range(0, len(order), BATCH_SIZE):
            yield moved[i : i + BATCH_SIZE], labels[order[i : i + BATCH_SIZE]]

    def loss_fn(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        logits = model(batch[0])  # (B, K)
        return F.cross_entropy(logits, batch[1], label_smoothing=PEER_RECIPE.label_smoothing)

    info = train_for(model, batches, loss_fn, seconds, PEER_RECIPE, seed)
    return model, info


@torch.no_grad()
def accuracy(model: nn.Module, images: Tensor, labels: Tensor) -> float:
    """Percent of ``images`` whose highest logit is their label."""
    model.eval()
    predicted = torch.cat(
        [model(images[i : i + 256]).argmax(-1) for i in range(0, len(images), 256)]
    )
    return 100.0 * (predicted == labels).float().mean().item()
