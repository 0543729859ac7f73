"""Input part: token embeddings scaled by sqrt(d_model), plus positional encoding, then dropout.

Legend: B batch, T sequence length, D model width, V vocabulary size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.dropout import Dropout


def sinusoid_table(max_len: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/D)), PE[pos, 2i+1] = cos(...): (max_len, D)."""
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (L, 1)
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )  # (D/2,)
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table


class PositionalEncoding(nn.Module):
    """Adds the position of each token: fixed sinusoids (paper, 3.5) or a learned table."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.learned = config.positional == "learned"
        if self.learned:
            self.table = nn.Parameter(torch.zeros(config.max_len, config.d_model))
            nn.init.normal_(self.table, std=0.02)
        else:
            table = sinusoid_table(config.max_len, config.d_model)
            self.register_buffer("table", table, persistent=False)

    def forward(self, x: Tensor, start_pos: int = 0) -> Tensor:
        """x (B, T, D) -> x + PE[start_pos : start_pos + T]."""
        end = start_pos + x.size(1)
        if end > self.table.size(0):
            raise ValueError(
                f"sequence of {end} positions is longer than max_len="
                f"{self.table.size(0)}; raise ModelConfig.max_len"
            )
        return x + self.table[start_pos:end].to(x.dtype)


class InputEmbedding(nn.Module):
    """Token ids (B, T) -> embeddings * sqrt(D) + positional encoding, with dropout: (B, T, D)."""

    def __init__(
        self, config: ModelConfig, vocab_size: int, token_embedding: nn.Embedding | None = None
    ) -> None:
        super().__init__()
        # A shared matrix (source = target embedding) is passed in rather than created.
        self.token = token_embedding or nn.Embedding(vocab_size, config.d_model)
        self.position = PositionalEncoding(config)
        self.dropout = Dropout(config.dropout, config.dropout_impl)
        self.scale = math.sqrt(config.d_model)

    def forward(self, tokens: Tensor, start_pos: int = 0, extra: Tensor | None = None) -> Tensor:
        """Embed ``tokens`` and add their positions.

        Args:
            tokens: (B, T) token ids.
            start_pos: the position of the first token (decoding with a KV cache).
            extra: (B, T, D) vectors added to the scaled token embeddings before the
                positional encoding (a tagger's character vectors), or None.

        Returns:
            (B, T, D) input vectors, dropout applied.
        """
        x = self.token(tokens) * self.scale  # (B, T, D)
        if extra is not None:
            x = x + extra.to(x.dtype)
        return self.dropout(self.position(x, start_pos))
