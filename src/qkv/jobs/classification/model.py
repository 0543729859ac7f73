"""The classifier's model: an encoder pooled into label scores.

The ``[CLS]`` token is the reserved ``<s>`` id, which encoder-only inputs never use otherwise.
The embedding table has one row past the tokenizer's vocabulary, the masked language model's
``<mask>`` (``qkv.jobs.pretraining``), so that it takes pretrained weights as they are.

Legend: B batch, S sequence length, D model width, C labels, N texts.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkv.attention import padding_mask
from qkv.config import ModelConfig
from qkv.data import PAD_ID, pad_batch, token_batches
from qkv.dropout import Dropout
from qkv.errors import InputError
from qkv.model import EncoderModel

POOLINGS = ("cls", "mean", "max")


def pool(states: Tensor, real: Tensor, pooling: str) -> Tensor:
    """One vector per sequence: (B, S, D) states, (B, S) bool real tokens -> (B, D).

    ``cls`` takes position 0; ``mean`` averages the real positions only; ``max`` takes each
    feature's largest value over the real positions (max-over-time, as in Kim 2014).
    """
    if pooling == "cls":
        return states[:, 0]
    if pooling == "max":
        padding = ~real.unsqueeze(-1)  # (B, S, 1)
        return states.masked_fill(padding, torch.finfo(states.dtype).min).amax(1)
    weights = real.unsqueeze(-1).to(states.dtype)  # (B, S, 1)
    return (states * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class SequenceClassifier(nn.Module):
    """Encoder, pooling, dropout and a linear layer: token ids (B, S) -> label logits (B, C)."""

    def __init__(self, config: ModelConfig, n_labels: int, pooling: str = "mean") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise InputError(f"--pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        self.config, self.pooling = config, pooling
        self.encoder = EncoderModel(config)
        self.dropout = Dropout(config.dropout, config.dropout_impl)
        self.head = nn.Linear(config.d_model, n_labels)

    def forward(self, src: Tensor, attentions: list[Tensor] | None = None) -> Tensor:
        """Label logits (B, C); appends each layer's (B, H, S, S) weights to ``attentions``."""
        real = src != self.config.pad_id  # (B, S)
        states = self.encoder(src, padding_mask(src, self.config.pad_id), attentions)  # (B, S, D)
        return self.head(self.dropout(pool(states, real, self.pooling)))  # (B, C)


def batched_logits(model: nn.Module, ids: list[list[int]], max_tokens: int) -> Tensor:
    """The model's outputs (N, C) for every sequence, in input order, from length-sorted batches."""
    device = next(model.parameters()).device
    rows: list[Tensor | None] = [None] * len(ids)
    for batch in token_batches([len(s) for s in ids], max_tokens, shuffle=False, seed=0):
        logits = model(pad_batch([ids[i] for i in batch], PAD_ID).to(device)).float()  # (B, C)
        for i, row in zip(batch, logits, strict=True):
            rows[i] = row
    return torch.stack(rows)  # (N, C)
