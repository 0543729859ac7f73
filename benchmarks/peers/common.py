"""Pieces every peer shares, written as a PyTorch user would: padding, length-sorted batches,
the sinusoid table, and a pre-norm ``nn.TransformerEncoder`` stack.

Legend: L positions, D model width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from qkv.config import ModelConfig


def pad(rows: Sequence[Sequence[int]], value: int = 0) -> Tensor:
    """Right-pad id rows with ``value`` into a (B, T) long tensor, T the longest row."""
    out = torch.full((len(rows), max(map(len, rows), default=0)), value, dtype=torch.long)
    for r, row in enumerate(rows):
        out[r, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def encoder_sizes(config: ModelConfig) -> dict[str, Any]:
    """A qkv job's encoder sizes (its ``ModelConfig``) under the names this folder's encoder
    pieces take, so that a peer has the sizes of the job it is compared with."""
    return dict(
        d_model=config.d_model,
        nhead=config.n_heads,
        num_layers=config.n_encoder_layers,
        dim_feedforward=config.d_ff,
        dropout=config.dropout,
    )


def length_groups(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices sorted by length, packed into groups of at most ``max_tokens`` padded tokens."""
    groups: list[list[int]] = [[]]
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        # sorted by length, so this item is the longest of its group
        if groups[-1] and (len(groups[-1]) + 1) * lengths[i] > max_tokens:
            groups.append([])
        groups[-1].append(i)
    return groups


def sinusoid_table(max_len: int, d_model: int) -> Tensor:
    """(L, D) sines on even features, cosines on odd ones, wavelengths 2pi ... 10000 * 2pi."""
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (L, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


def encoder_stack(
    d_model: int,
    nhead: int,
    dim_feedforward: int,
    dropout: float,
    num_layers: int,
    activation: str = "gelu",
) -> nn.TransformerEncoder:
    """Pre-norm ``nn.TransformerEncoder`` (batch first) with the final LayerNorm a pre-norm
    stack needs; the nested-tensor fast path is for inference and stays off."""
    layer = nn.TransformerEncoderLayer(
        d_model,
        nhead,
        dim_feedforward,
        dropout,
        activation=activation,
        batch_first=True,
        norm_first=True,
    )
    return nn.TransformerEncoder(
        layer, num_layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False
    )
