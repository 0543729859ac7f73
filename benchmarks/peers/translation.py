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
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data import BOS_ID, EOS_ID, PAD_ID

from .common import length_groups, pad, sinusoid_table


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
        self.register_buffer("positions", sinusoid_table(max_len, d_model), persistent=False)
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


# ---------------------------------------------------------------- data, training, decoding


def encode_pairs(
    tokenizer: Any, pairs: list[tuple[str, str]], max_len: int
) -> list[tuple[list[int], list[int]]]:
    """(source ids, target ids with BOS ... EOS) per pair, pairs longer than ``max_len`` dropped."""
    sources = tokenizer.encode_batch([s for s, _ in pairs])
    targets = tokenizer.encode_batch([t for _, t in pairs])
    return [
        (s + [EOS_ID], [BOS_ID, *t, EOS_ID])
        for s, t in zip(sources, targets, strict=True)
        if len(s) < max_len and len(t) < max_len
    ]


def batches_of(
    examples: list[tuple[list[int], list[int]]], max_tokens: int, seed: int
) -> Callable[[int], Iterator[tuple[Tensor, Tensor, Tensor]]]:
    """Per epoch: (src (B, S), tgt_in (B, T), tgt_out (B, T)) batches of at most ``max_tokens``.

    Sentences sorted by length, packed up to ``max_tokens`` padded tokens, batch order shuffled.
    """
    groups = length_groups([max(len(s), len(t)) for s, t in examples], max_tokens)

    def epoch_batches(epoch: int) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        generator = torch.Generator().manual_seed(seed * 1000 + epoch)
        for g in torch.randperm(len(groups), generator=generator).tolist():
            rows = [examples[i] for i in groups[g]]
            tgt = pad([t for _, t in rows], PAD_ID)
            yield pad([s for s, _ in rows], PAD_ID), tgt[:, :-1], tgt[:, 1:]

    return epoch_batches


@torch.no_grad()
def translate(
    model: PeerTranslator, sources: list[list[int]], beam: int, batch_size: int = 64
) -> list[list[int]]:
    """Greedy (beam 1) or beam search, the whole prefix re-decoded each step (no cache).

    Beam scores are summed log-probabilities divided by the hypothesis length.
    """
    results: list[list[int]] = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        src = pad(chunk, PAD_ID)
        results += _search(model, src, beam, max_new=int(src.size(1) * 1.5) + 10)
    return results


def _search(model: PeerTranslator, src: Tensor, beam: int, max_new: int) -> list[list[int]]:
    """Beam search over a batch (B, S); returns each sentence's best ids without BOS/EOS."""
    b = src.size(0)
    src = src.repeat_interleave(beam, dim=0)  # (B*K, S)
    src_padding = src.eq(PAD_ID)
    memory = model.transformer.encoder(
        model.embed(src), src_key_padding_mask=src_padding
    )  # (B*K, S, D)
    tokens = torch.full((b * beam, 1), BOS_ID, dtype=torch.long)  # (B*K, 1)
    scores = torch.zeros(b, beam)
    scores[:, 1:] = float("-inf")  # at first only one live hypothesis per sentence
    finished = torch.zeros(b * beam, dtype=torch.bool)
    lengths = torch.zeros(b * beam)
    for _ in range(max_new):
        t = tokens.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(t).isinf()
        hidden = model.transformer.decoder(
            model.embed(tokens),
            memory,
            tgt_mask=causal,
            memory_key_padding_mask=src_padding,
            tgt_is_causal=True,
        )
        logp = F.log_softmax(model.output(hidden[:, -1]).float(), dim=-1)  # (B*K, V)
        vocab = logp.size(-1)
        logp[:, [PAD_ID, BOS_ID]] = float("-inf")  # never predicted
        # A finished hypothesis only extends with padding, at no cost.
        logp[finished] = float("-inf")
        logp[finished, PAD_ID] = 0.0
        total = (scores.reshape(-1, 1) + logp).reshape(b, beam * vocab)  # (B, K*V)
        scores, flat = total.topk(beam, dim=-1)  # (B, K)
        origin = (flat // vocab + torch.arange(b)[:, None] * beam).reshape(-1)  # (B*K,)
        new = (flat % vocab).reshape(-1, 1)
        tokens = torch.cat([tokens[origin], new], dim=1)
        was_finished = finished[origin]
        lengths = lengths[origin] + (~was_finished).float()
        finished = was_finished | new.squeeze(1).eq(EOS_ID)
        if finished.all():
            break
    normalized = scores.reshape(-1) / lengths.clamp(min=1)
    best = normalized.reshape(b, beam).argmax(dim=-1) + torch.arange(b) * beam
    out = []
    for row in tokens[best].tolist():
        ids = [i for i in row[1:] if i not in (PAD_ID,)]
        out.append(ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids)
    return out
