"""The Vision Transformer: an image cut into patches, read as a sequence by qkv's ``Encoder``.

Each patch is flattened and projected to the model width, a learned [CLS] vector goes in
front, learned position embeddings are added, and the encoder's output at [CLS] is
classified. Nothing of the encoder changes: an image is just a sequence of 1 + N tokens.

Legend: B batch, C channels, Hi image height, Wi image width, P patch side, N patches,
S sequence length (1 + N), D model width, K classes, L layers, H heads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.dropout import Dropout
from qkv.embeddings import PositionalEncoding
from qkv.model import Encoder, init_weights


@dataclass
class ImageConfig:
    """What the model reads: a square image of ``image_size`` pixels cut into patches.

    Saved in config.json beside the ``ModelConfig``; the inputs must be converted to it.
    """

    image_size: int = 8
    channels: int = 1  # 1 grayscale, 3 RGB
    patch_size: int = 2
    # Pixels between the starts of neighbouring patches; below ``patch_size`` the patches
    # overlap, which gives a small image more tokens. None: non-overlapping.
    patch_stride: int | None = None
    n_classes: int = 10

    def __post_init__(self) -> None:
        bad = []
        for name in ("image_size", "patch_size", "n_classes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                bad.append(f"{name}={getattr(self, name)!r} must be a positive integer")
        if self.channels not in (1, 3):
            bad.append(f"channels={self.channels!r} must be 1 (grayscale) or 3 (RGB)")
        if self.patch_stride is not None and not 1 <= self.patch_stride <= self.patch_size:
            bad.append(f"patch_stride={self.patch_stride!r} must be in [1, patch_size]")
        if not bad and self.patch_size > self.image_size:
            bad.append(f"patch_size={self.patch_size} is larger than image_size={self.image_size}")
        elif not bad and (self.image_size - self.patch_size) % self.stride:
            bad.append(
                f"patches of {self.patch_size} pixels every {self.stride} do not tile an "
                f"image of {self.image_size}; choose sizes where (image - patch) % stride == 0"
            )
        if bad:
            raise ValueError("invalid ImageConfig: " + "; ".join(bad))

    @property
    def stride(self) -> int:
        return self.patch_size if self.patch_stride is None else self.patch_stride

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, cols) of patches."""
        side = (self.image_size - self.patch_size) // self.stride + 1
        return side, side

    @property
    def n_patches(self) -> int:
        rows, cols = self.grid
        return rows * cols

    @property
    def patch_dim(self) -> int:
        return self.channels * self.patch_size**2

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ImageConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def patchify(images: Tensor, patch_size: int, stride: int | None = None) -> Tensor:
    """Cut images into flattened patches, row by row: (B, C, Hi, Wi) -> (B, N, C*P*P).

    Patch n is at row ``n // cols`` and column ``n % cols`` of the grid; its vector holds
    channel 0's P*P pixels row by row, then channel 1's, ...
    """
    stride = patch_size if stride is None else stride
    patches = F.unfold(images, kernel_size=patch_size, stride=stride)  # (B, C*P*P, N)
    return patches.transpose(1, 2)  # (B, N, C*P*P)


def unpatchify(patches: Tensor, image_size: int, channels: int, patch_size: int) -> Tensor:
    """Put non-overlapping patches back together: (B, N, C*P*P) -> (B, C, Hi, Wi)."""
    return F.fold(
        patches.transpose(1, 2),  # (B, C*P*P, N)
        output_size=(image_size, image_size),
        kernel_size=patch_size,
        stride=patch_size,
    )


class VisionTransformer(nn.Module):
    """Patches -> linear projection -> [CLS] + patches + positions -> ``Encoder`` -> classes.

    ``model.position`` is qkv's learned ``PositionalEncoding`` over the 1 + N positions, so
    ``ModelConfig.positional`` must be ``"learned"`` and ``max_len`` at least 1 + N.
    """

    def __init__(self, config: ModelConfig, image: ImageConfig) -> None:
        super().__init__()
        if config.positional != "learned" or config.max_len < 1 + image.n_patches:
            raise ValueError(
                f"a ViT needs positional='learned' and max_len >= {1 + image.n_patches}, "
                f"got positional={config.positional!r}, max_len={config.max_len}"
            )
        self.config, self.image = config, image
        self.patch_embed = nn.Linear(image.patch_dim, config.d_model)
        self.cls = nn.Parameter(torch.zeros(1, 1, config.d_model))
        self.position = PositionalEncoding(config)
        self.dropout = Dropout(config.dropout, config.dropout_impl)
        self.encoder = Encoder(config)
        self.head = nn.Linear(config.d_model, image.n_classes)
        init_weights(self, config.d_model)
        nn.init.normal_(self.cls, std=0.02)

    def embed(self, images: Tensor) -> Tensor:
        """Images (B, C, Hi, Wi) in [0, 1] -> input sequence (B, S, D), [CLS] first."""
        patches = patchify(images, self.image.patch_size, self.image.stride)  # (B, N, C*P*P)
        x = self.patch_embed(patches)  # (B, N, D)
        cls = self.cls.expand(x.size(0), -1, -1).to(x.dtype)  # (B, 1, D)
        x = torch.cat([cls, x], dim=1)  # (B, S, D)
        return self.dropout(self.position(x))

    def forward(self, images: Tensor, attentions: list[Tensor] | None = None) -> Tensor:
        """Images (B, C, Hi, Wi) -> class logits (B, K); per-layer weights go to ``attentions``.

        Every image has all its patches, so no mask is needed.
        """
        x = self.encoder(self.embed(images), None, attentions)  # (B, S, D)
        return self.head(x[:, 0])  # (B, K)

    @torch.no_grad()
    def attention_maps(self, images: Tensor) -> dict[str, Tensor]:
        """Every layer's and head's attention weights, for pictures.

        Returns:
            ``{"encoder": (L, B, H, S, S), "logits": (B, K)}``, [CLS] at index 0 of S.
        """
        weights: list[Tensor] = []
        logits = self.forward(images, weights)
        return {"encoder": torch.stack(weights), "logits": logits}


def vit_model_config(config: ModelConfig, image: ImageConfig) -> ModelConfig:
    """``config`` made fit for ``image``: learned positions over 1 + N tokens, no decoder."""
    return dataclasses.replace(
        config, positional="learned", max_len=1 + image.n_patches, n_decoder_layers=0
    )
