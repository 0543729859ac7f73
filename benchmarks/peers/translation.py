"""A plain peer translator, written as a PyTorch user would from ``torch.nn.Transformer``.

Nothing here comes from qkv's model code: one token embedding shared by source and target,
scaled by sqrt(d_model), plus sinusoidal positions; ``torch.nn.Transformer`` in between; the
output layer tied to the embedding; the causal mask of
``nn.Transformer.generate_square_subsequent_mask`` and key padding masks (True = blocked,
torch's convention); the loss over all (B, T, V) logits with ``ignore_index=pad``.

Legend: B batch, S source length, T target length, D model width, V vocabulary size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class PeerTranslator(nn.Module):
    """Encoder-decoder translator around ``torch.nn.Transformer``: (B, S), (B, T) -> (B, T, V).

    Args:
        vocab_size: one joint vocabulary for source and target.
        d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout,
            norm_first: passed to ``torch.nn.Transformer`` (dropout also on the embeddings).
        pad_id: the padding id, masked as keys and ignored by the loss.
        max_len: positions of the sinusoid table.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 256,
        nhead: int = 4,
        num_encoder_layers: int = 3,
        num_decoder_layers: int = 3,
        dim_feedforward: int = 1024,
        dropout: float = 0.1,
        norm_first: bool = True,
        pad_id: int = 0,
        max_len: int = 1024,
    ) -> None:
        super().__init__()
        self.pad_id, self.d_model = pad_id, d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
        position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (L, 1)
        inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(position * inv_freq)
        table[:, 1::2] = torch.cos(position * inv_freq)
        self.register_buffer("positions", table, persistent=False)  # (L, D)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(
            d_model,
            nhead,
            num_encoder_layers,
            num_decoder_layers,
            dim_feedforward,
            dropout,
            batch_first=True,
            norm_first=norm_first,
        )
        self.output = nn.Linear(d_model, vocab_size)
        self.output.weight = self.embedding.weight  # tied
        nn.init.zeros_(self.output.bias)

    def embed(self, tokens: Tensor) -> Tensor:
        """(B, T) ids -> (B, T, D): embedding * sqrt(D) + sinusoid, then dropout."""
        x = self.embedding(tokens) * math.sqrt(self.d_model)
        return self.dropout(x + self.positions[: tokens.size(1)])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Source ids (B, S) and target input ids (B, T) -> logits (B, T, V)."""
        # torch's float mask (-inf above the diagonal) as bool, the type of the padding masks
        # (mixing the two types is deprecated).
        causal = nn.Transformer.generate_square_subsequent_mask(
            tgt_in.size(1), device=tgt_in.device
        ).isinf()  # (T, T) True = a later position
        src_padding = src.eq(self.pad_id)  # (B, S) True = padding
        tgt_padding = tgt_in.eq(self.pad_id)  # (B, T)
        hidden = self.transformer(
            self.embed(src),
            self.embed(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_padding,
            tgt_key_padding_mask=tgt_padding,
            memory_key_padding_mask=src_padding,
            tgt_is_causal=True,
        )  # (B, T, D)
        return self.output(hidden)


def peer_loss(
    model: PeerTranslator, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, label_smoothing: float
) -> Tensor:
    """Mean label-smoothed cross-entropy over the real target tokens, from all (B, T, V) logits."""
    logits = model(src, tgt_in)  # (B, T, V)
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)),
        tgt_out.reshape(-1),
        ignore_index=model.pad_id,
        label_smoothing=label_smoothing,
    )
