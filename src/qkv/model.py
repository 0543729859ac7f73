"""The models: encoder and decoder stacks, the output part, and the two model shapes.

``Transformer`` is the encoder-decoder of the paper (translation); ``EncoderModel`` is the
encoder alone, the base of the tagging, classification and ViT heads.

Legend: B batch, S source length, T target length, D model width, V vocabulary size,
L layers, H heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.attention import padding_mask
from qkv.config import ModelConfig
from qkv.embeddings import InputEmbedding
from qkv.layers import DecoderLayer, EncoderLayer


def _final_norm(config: ModelConfig) -> nn.Module:
    if config.use_final_norm:
        return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
    return nn.Identity()


class Encoder(nn.Module):
    """N identical encoder layers over embedded inputs: (B, S, D) -> (B, S, D)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.norm = _final_norm(config)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, attentions: list[Tensor] | None = None
    ) -> Tensor:
        """``mask`` (B, 1, 1, S) bool, True = real token; weights go to ``attentions``."""
        for layer in self.layers:
            x = layer(x, mask, attentions)
        return self.norm(x)


class Decoder(nn.Module):
    """N identical decoder layers: embedded target (B, T, D) and memory (B, S, D) -> (B, T, D)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        self.norm = _final_norm(config)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        self_attentions: list[Tensor] | None = None,
        cross_attentions: list[Tensor] | None = None,
    ) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask, self_attentions, cross_attentions)
        return self.norm(x)


class OutputLayer(nn.Module):
    """Output part: a linear layer to the vocabulary, then softmax. (B, T, D) -> (B, T, V)."""

    def __init__(self, config: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(config.d_model, vocab_size)

    def forward(self, x: Tensor) -> Tensor:
        """Logits; the loss and the decoders take the softmax themselves, in fp32."""
        return self.proj(x)

    def log_probs(self, x: Tensor) -> Tensor:
        return F.log_softmax(self.proj(x).float(), dim=-1)


def init_weights(module: nn.Module, d_model: int) -> None:
    """Xavier-uniform matrices (as torch.nn.Transformer), zero biases, N(0, D^-1/2) embeddings."""
    for name, param in module.named_parameters():
        if name.endswith("token.weight"):
            nn.init.normal_(param, std=d_model**-0.5)
        elif param.dim() > 1 and not name.endswith("position.table"):
            nn.init.xavier_uniform_(param)
        elif name.endswith("bias"):
            nn.init.zeros_(param)


class Transformer(nn.Module):
    """The encoder-decoder Transformer: embed, encode the source once, decode the target.

    Masks follow qkv's convention (True = may attend; see ``qkv.attention``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.src_embed = InputEmbedding(config, config.src_vocab_size)
        shared = self.src_embed.token if config.share_embeddings else None
        self.tgt_embed = InputEmbedding(config, config.tgt_vocab_size, token_embedding=shared)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.output = OutputLayer(config, config.tgt_vocab_size)
        init_weights(self, config.d_model)
        if config.tie_output:
            self.output.proj.weight = self.tgt_embed.token.weight
        self.cache_position: int | None = None  # next target position when a cache is set up

    def src_mask(self, src: Tensor) -> Tensor:
        """(B, S) ids -> (B, 1, 1, S) bool: True where the source token is not padding."""
        return padding_mask(src, self.config.pad_id)

    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, attentions: list[Tensor] | None = None
    ) -> Tensor:
        """Source ids (B, S) -> memory (B, S, D)."""
        src_mask = self.src_mask(src) if src_mask is None else src_mask
        return self.encoder(self.src_embed(src), src_mask, attentions)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None = None,
        self_attentions: list[Tensor] | None = None,
        cross_attentions: list[Tensor] | None = None,
        select: Tensor | None = None,
    ) -> Tensor:
        """Target ids (B, T) and memory (B, S, D) -> logits (B, T, V).

        With a cache set up (``setup_cache``), pass only the new target positions: they are
        placed after those decoded so far, and the earlier keys and values come from the cache.
        ``select`` (B, T) bool scores only those positions: logits (N, V) for the N selected,
        in row-major order, so no output-layer work is spent on padding.
        """
        start = 0
        if self.cache_position is not None:
            start, self.cache_position = self.cache_position, self.cache_position + tgt.size(1)
        x = self.tgt_embed(tgt, start_pos=start)  # (B, T, D)
        x = self.decoder(x, memory, src_mask, tgt_mask, self_attentions, cross_attentions)
        if select is not None:
            x = x[select]  # (B, T, D) -> (N, D)
        return self.output(x)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        select: Tensor | None = None,
    ) -> Tensor:
        """Source (B, S) and target input (B, T) ids -> logits (B, T, V) for the next tokens.

        ``tgt_mask`` is an optional key mask on the target, e.g. ``padding_mask(tgt, pad)``;
        the causal mask is always applied, and right-padding needs no mask for the real tokens.
        ``select`` (B, T) bool: logits (N, V) of the selected positions only (see ``decode``).
        """
        src_mask = self.src_mask(src) if src_mask is None else src_mask
        memory = self.encode(src, src_mask)
        return self.decode(tgt, memory, src_mask, tgt_mask, select=select)

    def log_probs(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Log-softmax over the vocabulary of ``forward``: (B, T, V), fp32."""
        return F.log_softmax(self.forward(src, tgt).float(), dim=-1)

    @torch.no_grad()
    def attention_maps(self, src: Tensor, tgt: Tensor) -> dict[str, Tensor]:
        """Every layer's and head's attention weights, for pictures.

        Returns:
            ``{"encoder": (L, B, H, S, S), "decoder": (L, B, H, T, T),
            "cross": (L, B, H, T, S), "logits": (B, T, V)}``
        """
        enc, dec, cross = [], [], []
        src_mask = self.src_mask(src)
        memory = self.encode(src, src_mask, attentions=enc)
        logits = self.decode(tgt, memory, src_mask, None, dec, cross)
        return {
            "encoder": torch.stack(enc),
            "decoder": torch.stack(dec),
            "cross": torch.stack(cross),
            "logits": logits,
        }

    # -- incremental decoding ---------------------------------------------------------------

    def setup_cache(
        self,
        batch_size: int,
        max_len: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> None:
        """Give each decoder layer a KV cache for ``batch_size`` sequences of up to ``max_len``."""
        ref = self.output.proj.weight
        for layer in self.decoder.layers:
            layer.self_attn.setup_cache(
                batch_size,
                self.config.max_len if max_len is None else max_len,
                dtype or ref.dtype,
                device or ref.device,
                cross=False,
            )
            layer.cross_attn.setup_cache(batch_size, 0, ref.dtype, ref.device, cross=True)
        self.cache_position = 0

    def reset_cache(self) -> None:
        """Forget the decoded positions and the source's keys and values; keep the buffers."""
        for layer in self.decoder.layers:
            layer.self_attn.reset_cache()
            layer.cross_attn.reset_cache()
        self.cache_position = 0

    def reorder_cache(self, index: Tensor, same_source: bool = False) -> None:
        """Keep the cached rows ``index`` (B',) in that order, e.g. the surviving beams.

        ``same_source``: every row keeps a source it already had (the beams of one sentence
        trading places), so the encoder-decoder keys and values, equal for all beams of a
        sentence, need not move; only the self-attention caches are copied.
        """
        for layer in self.decoder.layers:
            layer.self_attn.reorder_cache(index)
            if not same_source:
                layer.cross_attn.reorder_cache(index)

    def remove_cache(self) -> None:
        for layer in self.decoder.layers:
            layer.self_attn.remove_cache()
            layer.cross_attn.remove_cache()
        self.cache_position = None


class EncoderModel(nn.Module):
    """The encoder alone over token ids: (B, S) -> contextual vectors (B, S, D).

    The base of per-token (tagging) and per-sequence (classification) heads.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = InputEmbedding(config, config.src_vocab_size)
        self.encoder = Encoder(config)
        init_weights(self, config.d_model)

    def forward(
        self, src: Tensor, src_mask: Tensor | None = None, attentions: list[Tensor] | None = None
    ) -> Tensor:
        src_mask = padding_mask(src, self.config.pad_id) if src_mask is None else src_mask
        return self.encoder(self.embed(src), src_mask, attentions)
