"""The classifier's models: an encoder pooled into label scores, and a masked language model.

The ``[CLS]`` token is the reserved ``<s>`` id, which encoder-only inputs never use otherwise;
the masked language model's ``<mask>`` is one id past the tokenizer's vocabulary, so every
classifier's embedding table has that one extra row and can take pretrained weights as they are.

Legend: B batch, S sequence length, D model width, C labels, V vocabulary size, M masked
positions, N texts.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from qkv import checkpoint as ckpt
from qkv.attention import padding_mask
from qkv.config import ModelConfig
from qkv.data import PAD_ID, pad_batch, token_batches
from qkv.errors import InputError
from qkv.model import EncoderModel

POOLINGS = ("cls", "mean")


def pool(states: Tensor, real: Tensor, pooling: str) -> Tensor:
    """One vector per sequence: (B, S, D) states, (B, S) bool real tokens -> (B, D).

    ``cls`` takes position 0; ``mean`` averages the real positions only.
    """
    if pooling == "cls":
        return states[:, 0]
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
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.d_model, n_labels)

    def forward(self, src: Tensor, attentions: list[Tensor] | None = None) -> Tensor:
        """Label logits (B, C); appends each layer's (B, H, S, S) weights to ``attentions``."""
        real = src != self.config.pad_id  # (B, S)
        states = self.encoder(src, padding_mask(src, self.config.pad_id), attentions)  # (B, S, D)
        return self.head(self.dropout(pool(states, real, self.pooling)))  # (B, C)


class MaskedLanguageModel(nn.Module):
    """Encoder and an output layer tied to its token embedding, scoring chosen positions."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = EncoderModel(config)
        self.output = nn.Linear(config.d_model, config.src_vocab_size)
        self.output.weight = self.encoder.embed.token.weight

    def forward(self, src: Tensor, select: Tensor | None = None) -> Tensor:
        """ids (B, S) -> logits (B, S, V), or (M, V) at the M positions where ``select`` is True.

        Scoring only the masked positions saves most of the work: the output layer over the
        vocabulary costs more than the encoder of a small model.
        """
        states = self.encoder(src)  # (B, S, D)
        return self.output(states if select is None else states[select])


def load_encoder(model: SequenceClassifier, weights: Path) -> None:
    """Copy into ``model`` the encoder of the masked language model saved at ``weights``."""
    language_model = MaskedLanguageModel(model.config)
    ckpt.load_weights(language_model, weights)
    model.encoder.load_state_dict(language_model.encoder.state_dict())


def batched_logits(model: nn.Module, ids: list[list[int]], max_tokens: int) -> Tensor:
    """The model's outputs (N, C) for every sequence, in input order, from length-sorted batches."""
    device = next(model.parameters()).device
    rows: list[Tensor | None] = [None] * len(ids)
    for batch in token_batches([len(s) for s in ids], max_tokens, shuffle=False, seed=0):
        logits = model(pad_batch([ids[i] for i in batch], PAD_ID).to(device)).float()  # (B, C)
        for i, row in zip(batch, logits, strict=True):
            rows[i] = row
    return torch.stack(rows)  # (N, C)
