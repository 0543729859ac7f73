"""Encoder and decoder layers: sublayers, each wrapped in a residual connection with LayerNorm.

Legend: B batch, S source length, T target length, D model width.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.attention import MultiHeadAttention
from qkv.config import ModelConfig
from qkv.dropout import Dropout


class FeedForward(nn.Module):
    """Position-wise feed-forward: Linear(D, d_ff), activation, dropout, Linear(d_ff, D)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.linear1 = nn.Linear(config.d_model, config.d_ff)
        self.linear2 = nn.Linear(config.d_ff, config.d_model)
        self.activation = F.gelu if config.activation == "gelu" else F.relu
        self.dropout = Dropout(config.dropout, config.dropout_impl)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # (B, T, D)


class SublayerConnection(nn.Module):
    """Residual connection and LayerNorm around one sublayer.

    Post-norm (paper): LayerNorm(x + Dropout(sublayer(x))).
    Pre-norm: x + Dropout(sublayer(LayerNorm(x))).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout, config.dropout_impl)
        self.norm_first = config.norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Multi-head self-attention, then feed-forward; each with residual + norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.feed_forward = FeedForward(config)
        self.self_attn_sublayer = SublayerConnection(config)
        self.feed_forward_sublayer = SublayerConnection(config)

    def forward(
        self, x: Tensor, mask: Tensor | None, attentions: list[Tensor] | None = None
    ) -> Tensor:
        """x (B, S, D), mask (B, 1, 1, S) or None -> (B, S, D); weights go to ``attentions``."""

        def self_attention(h: Tensor) -> Tensor:
            out, weights = self.self_attn(h, mask=mask, need_weights=attentions is not None)
            if attentions is not None:
                attentions.append(weights)
            return out

        x = self.self_attn_sublayer(x, self_attention)
        return self.feed_forward_sublayer(x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward; each with residual + norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.cross_attn = MultiHeadAttention(config)
        self.feed_forward = FeedForward(config)
        self.self_attn_sublayer = SublayerConnection(config)
        self.cross_attn_sublayer = SublayerConnection(config)
        self.feed_forward_sublayer = SublayerConnection(config)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None = None,
        self_attentions: list[Tensor] | None = None,
        cross_attentions: list[Tensor] | None = None,
    ) -> Tensor:
        """x (B, T, D) attends causally to itself, then to ``memory`` (B, S, D).

        Args:
            src_mask: (B, 1, 1, S) bool, True = real source token.
            tgt_mask: optional extra mask on target keys, e.g. padding (B, 1, 1, T); the
                causal mask is always applied.
        """
        need = self_attentions is not None

        def self_attention(h: Tensor) -> Tensor:
            out, weights = self.self_attn(h, mask=tgt_mask, is_causal=True, need_weights=need)
            if need:
                self_attentions.append(weights)
            return out

        def cross_attention(h: Tensor) -> Tensor:
            out, weights = self.cross_attn(h, memory, mask=src_mask, need_weights=need)
            if need:
                cross_attentions.append(weights)
            return out

        x = self.self_attn_sublayer(x, self_attention)
        x = self.cross_attn_sublayer(x, cross_attention)
        return self.feed_forward_sublayer(x, self.feed_forward)
