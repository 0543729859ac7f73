"""Attention, in the source text's three steps, and multi-head attention with a KV cache.

Mask convention, used everywhere in qkv: a boolean tensor where **True means "may attend"**
and False means "blocked", broadcastable to the scores' shape (B, H, Tq, Tk). This is the
convention of ``torch.nn.functional.scaled_dot_product_attention``; note that
``torch.nn.Transformer``'s ``*_key_padding_mask`` arguments use the opposite one.

Legend: B batch, H heads, Tq query length, Tk key length, D model width, Dh head width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.config import ModelConfig

# Before torch 2.5, SDPA returned NaN for a query row whose keys are all masked.
_SDPA_ZEROES_EMPTY_ROWS = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens: (B, S) token ids -> (B, 1, 1, S) bool, True = attend."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(q_len: int, k_len: int | None = None, device: torch.device | None = None) -> Tensor:
    """Each query sees its own and earlier positions: (1, 1, Tq, Tk) bool, True = attend.

    With ``k_len > q_len`` the queries are the last ``q_len`` positions (a cached prefix
    comes first), so query i sits at position ``k_len - q_len + i``.
    """
    k_len = q_len if k_len is None else k_len
    offset = k_len - q_len
    rows = torch.arange(q_len, device=device)[:, None] + offset
    cols = torch.arange(k_len, device=device)[None, :]
    return (cols <= rows)[None, None]


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """The three steps written out. Returns the output (B, H, Tq, Dh) and weights (B, H, Tq, Tk).

    A query whose keys are all masked gets all-zero weights and a zero output, never NaN.
    """
    # Step 1: score the query against every key, scaled so the softmax stays soft.
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    # Step 2: softmax over the keys turns the scores into a distribution.
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # all-masked rows: NaN -> 0
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)
    # Step 3: the weighted sum of the values.
    return weights @ v, weights  # (B, H, Tq, Dh), (B, H, Tq, Tk)


# On a CPU, short key sequences run faster as the three steps in plain batched matmuls than
# in the fused kernel: 2-5x for bf16 training at 24-128 keys, 1.4-3x for the one query of
# a cached decoding step (benchmarks/speed.py, section "attention"); at 256 keys the two are
# level or the fused kernel wins. Long sequences keep the fused kernel, whose memory grows
# linearly in T rather than quadratically.
SHORT_KEYS = 128


def fused_pays(q: Tensor, k: Tensor) -> bool:
    """Whether ``impl="auto"`` takes the fused kernel for queries ``q`` and keys ``k``."""
    if q.device.type != "cpu" or k.size(-2) > SHORT_KEYS:
        return True
    return q.dtype == torch.float32 and q.size(-2) > 1


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    impl: str = "auto",
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention over (B, H, T, Dh) tensors; ``impl`` picks the path.

    Args:
        mask: bool, True = attend, broadcastable to (B, H, Tq, Tk).
        is_causal: add the causal mask (queries and keys aligned at the end).
        impl: ``"sdpa"`` (fused kernel), ``"reference"`` (the three steps), or ``"auto"``:
            the fused kernel where it measured faster (``fused_pays``), else the three steps.
        need_weights: also return the weights; forces the reference path.
    Returns:
        (output (B, H, Tq, Dh), weights (B, H, Tq, Tk) or None)
    """
    if impl == "auto":
        impl = "sdpa" if fused_pays(q, k) else "reference"
    if is_causal and q.size(-2) == 1:
        is_causal = False  # one new query (cached decoding) sees every key so far
    if is_causal:
        causal = causal_mask(q.size(-2), k.size(-2), device=q.device)
        # SDPA's own is_causal aligns at the top-left; only use it where that is the same.
        if impl == "sdpa" and not need_weights and mask is None and q.size(-2) == k.size(-2):
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
            return out, None
        mask = causal if mask is None else mask & causal
    if impl == "reference" or need_weights:
        return reference_attention(q, k, v, mask, dropout_p)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    if mask is not None and not _SDPA_ZEROES_EMPTY_ROWS:
        out = out.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return out, None


class KVCache(nn.Module):
    """Keys and values of the positions decoded so far, in preallocated buffers.

    ``update`` writes the new positions and returns everything cached up to them.
    """

    def __init__(
        self,
        batch_size: int,
        n_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        shape = (batch_size, n_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.spare: tuple[Tensor, Tensor] | None = None  # the other pair, for reorder
        self.length = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, H, t, Dh) keys and values; return all cached, (B, H, length, Dh)."""
        end = self.length + k.size(2)
        if end > self.k.size(2):
            raise ValueError(f"KV cache holds {self.k.size(2)} positions; {end} were asked for")
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search); only the filled positions move.

        The rows are gathered straight into a second pair of buffers, which then swap
        places with the first: one copy of the filled part, not a gather and a copy back.
        """
        if index.numel() != self.k.size(0):
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
            self.spare = None
            return
        end = self.length
        if self.spare is None:
            self.spare = (torch.empty_like(self.k), torch.empty_like(self.v))
        k, v = self.spare
        torch.index_select(self.k[:, :, :end], 0, index, out=k[:, :, :end])
        torch.index_select(self.v[:, :, :end], 0, index, out=v[:, :, :end])
        self.spare = (self.k, self.v)
        self.k, self.v = k, v

    def reset(self) -> None:
        self.length = 0


class MultiHeadAttention(nn.Module):
    """Multi-head attention as self-attention or as encoder-decoder (cross) attention.

    Q, K and V projections are one packed (3D, D) matrix, as in ``torch.nn.MultiheadAttention``:
    self-attention projects all three in one matmul; cross-attention projects Q from the
    target and K, V from the encoder output with the two halves.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.d_model = config.d_model
        self.dropout_p = config.attention_dropout
        self.impl = config.attention_impl
        self.in_proj = nn.Linear(config.d_model, 3 * config.d_model)  # [W_q; W_k; W_v]
        self.out_proj = nn.Linear(config.d_model, config.d_model)
        self.kv_cache: KVCache | None = None
        # Cross-attention: with cache_memory set, the source's K and V are projected once
        # per source and kept in memory_kv until reset_cache().
        self.cache_memory = False
        self.memory_kv: tuple[Tensor, Tensor] | None = None

    def setup_cache(
        self,
        batch_size: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | None,
        cross: bool,
    ) -> None:
        """Prepare for incremental decoding: a KV cache (self) or a per-source K, V (cross)."""
        if cross:
            self.cache_memory, self.memory_kv = True, None
        else:
            self.kv_cache = KVCache(
                batch_size, self.n_heads, max_len, self.d_model // self.n_heads, dtype, device
            )

    def reset_cache(self) -> None:
        if self.kv_cache is not None:
            self.kv_cache.reset()
        self.memory_kv = None

    def reorder_cache(self, index: Tensor) -> None:
        if self.kv_cache is not None:
            self.kv_cache.reorder(index)
        if self.memory_kv is not None:
            self.memory_kv = tuple(t.index_select(0, index) for t in self.memory_kv)

    def remove_cache(self) -> None:
        self.kv_cache, self.cache_memory, self.memory_kv = None, False, None

    def _split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, H, T, Dh)

    def _project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        D = self.d_model
        kv = F.linear(memory, self.in_proj.weight[D:], self.in_proj.bias[D:])  # (B, S, 2D)
        k, v = kv.chunk(2, dim=-1)
        return self._split_heads(k), self._split_heads(v)  # (B, H, S, Dh) each

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, T, D) to itself, or to ``memory`` (B, S, D) when given.

        With a KV cache set up (``kv_cache`` for self-attention, ``memory_kv`` filled on the
        first call for cross-attention), only the new positions of ``x`` are passed.

        Returns:
            (output (B, T, D), weights (B, H, T, Tk) when ``need_weights`` else None)
        """
        B, T, D = x.shape
        if memory is None:
            q, k, v = map(self._split_heads, self.in_proj(x).chunk(3, dim=-1))  # (B, H, T, Dh)
            if self.kv_cache is not None:
                k, v = self.kv_cache.update(k, v)
        else:
            q = self._split_heads(F.linear(x, self.in_proj.weight[:D], self.in_proj.bias[:D]))
            if self.memory_kv is None:
                k, v = self._project_memory(memory)
                if self.cache_memory:
                    self.memory_kv = (k, v)
            else:
                k, v = self.memory_kv
        out, weights = attention(
            q,
            k,
            v,
            mask,
            is_causal=is_causal,
            dropout_p=self.dropout_p if self.training else 0.0,
            impl=self.impl,
            need_weights=need_weights,
        )
        out = out.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.out_proj(out), weights
