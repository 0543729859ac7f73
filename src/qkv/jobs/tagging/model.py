"""The tagger: the encoder over subwords, each plus its word's character vector; a linear head.

Each word is split into subwords; the encoder runs over the subwords and the word's label is
read at its FIRST subword (the loss ignores the others). A small character CNN encodes the
whole word and is added to each of its subwords, so that an unseen word still shows its
suffix, capitals and digits where its label is read. Extra linear heads may learn other
columns of the treebank (XPOS, features, dependency relations) from the same vectors while
training; tagging reads the main head only.

Legend: B batch, S subwords, U distinct words of a batch, C characters of a word,
D model width, E character width, K labels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.attention import padding_mask
from qkv.config import ModelConfig
from qkv.data import PAD_ID, UNK_ID
from qkv.jobs.tagging.data import CHAR_PAD
from qkv.model import EncoderModel

# The word encoder's defaults, also those of ``qkv train tagger`` (--char-dim, --char-widths).
CHAR_DIM = 64
CHAR_WIDTHS = (3,)


def max_pool_words(h: Tensor, pad: Tensor) -> Tensor:
    """(U, D, C) convolution outputs, (U, 1, C) padding -> (U, D): ReLU of the max over each
    word's characters.

    ReLU is monotone, so it can follow the max (on (U, D) rather than (U, D, C)); and
    ``max`` sends the gradient back through its indices where ``amax`` compares every value
    with the maximum: the character encoder's forward and backward 1.29x as fast
    (``benchmarks/training_step.py``, its "chars").
    """
    return F.relu(h.masked_fill(pad, float("-inf")).max(dim=-1).values)


def max_pool_words_reference(h: Tensor, pad: Tensor) -> Tensor:
    """``max_pool_words`` as written: ReLU, padding to 0 (ReLU >= 0, so max ignores it), max."""
    return F.relu(h).masked_fill(pad, 0.0).amax(dim=-1)


class CharEncoder(nn.Module):
    """Characters of each word -> one vector per word: embed, convolve, max-pool, project.

    One convolution per width in ``widths`` (D channels each, odd widths so that each window
    is centred on a character); their max-pooled vectors are concatenated and projected back
    to D. A window that reaches the word's end marker sees a suffix of width - 1 characters.

    (U, C) character ids of U words -> (U, D). ``pool`` is ``max_pool_words`` or its reference.
    """

    pool = staticmethod(max_pool_words)

    def __init__(
        self, n_chars: int, char_dim: int, d_model: int, widths: tuple[int, ...] = CHAR_WIDTHS
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(n_chars, char_dim, padding_idx=CHAR_PAD)
        first, *more = widths
        # The first width keeps the name `conv`, so that runs saved with one width still load.
        self.conv = nn.Conv1d(char_dim, d_model, kernel_size=first, padding=first // 2)
        self.more_convs = nn.ModuleList(
            nn.Conv1d(char_dim, d_model, kernel_size=w, padding=w // 2) for w in more
        )
        self.proj = nn.Linear(d_model * len(widths), d_model)

    def forward(self, chars: Tensor) -> Tensor:
        x = self.embed(chars).transpose(1, 2)  # (U, E, C)
        pad = (chars == CHAR_PAD)[:, None, :]  # (U, 1, C)
        # (U, D, C) per width (odd widths keep C positions) -> (U, D)
        pooled = [self.pool(conv(x), pad) for conv in (self.conv, *self.more_convs)]
        return self.proj(torch.cat(pooled, dim=-1))  # (U, len(widths) * D) -> (U, D)


class TaggerModel(nn.Module):
    """``EncoderModel`` over subwords, each plus its word's character vector; a linear head.

    Args:
        config: the encoder's sizes (``src_vocab_size`` = subword vocabulary).
        n_labels: K, the tags.
        n_chars: character vocabulary of ``WordEncoder`` (unused with ``char_dim=0``).
        char_dim: E, width of the character embeddings; 0 leaves out the character encoder.
        char_widths: widths of the character encoder's convolutions (odd), one each.
        token_dropout: while training, the share of subwords replaced by ``<unk>``, so that
            the model learns to tag words from their characters and context alone.
        word_dropout: while training, the share of a batch's distinct words whose subwords
            all become ``<unk>``: whole words go missing, as unseen words do.
        rare_word_dropout: alpha; while training, a word seen c times in the training
            words is also hidden (as with ``word_dropout``) with chance alpha / (alpha + c),
            so that rare words, the nearest to unseen ones, go missing most often
            (Kiperwasser and Goldberg 2016). Needs the batch's ``word_counts``.
        aux_labels: labels of each extra head by column name (``AUX_COLUMNS``), learned
            alongside the tags while training.
    """

    def __init__(
        self,
        config: ModelConfig,
        n_labels: int,
        n_chars: int,
        char_dim: int = CHAR_DIM,
        token_dropout: float = 0.1,
        word_dropout: float = 0.0,
        aux_labels: dict[str, int] | None = None,
        char_widths: Sequence[int] = CHAR_WIDTHS,
        rare_word_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.config, self.token_dropout = config, token_dropout
        self.word_dropout, self.rare_word_dropout = word_dropout, rare_word_dropout
        self.body = EncoderModel(config)
        self.chars = (
            CharEncoder(n_chars, char_dim, config.d_model, tuple(char_widths))
            if char_dim > 0
            else None
        )
        self.head = nn.Linear(config.d_model, n_labels)
        self.aux_heads = nn.ModuleDict(
            {name: nn.Linear(config.d_model, k) for name, k in (aux_labels or {}).items()}
        )

    def forward(
        self,
        src: Tensor,
        word_index: Tensor,
        chars: Tensor,
        attentions: list[Tensor] | None = None,
        aux: bool = False,
        word_counts: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """src, word_index (B, S) and chars (U, C) of a ``TaggingBatch`` -> logits (B, S, K).

        ``attentions``, when given, receives each layer's weights (B, H, S, S). With ``aux``
        the extra heads' logits come too: (logits, {column: (B, S, K_column)}).
        ``word_counts`` (U,), the batch's, lets ``rare_word_dropout`` act.
        """
        tokens = src
        if self.training and self.token_dropout > 0:
            drop = torch.rand(src.shape, device=src.device) < self.token_dropout
            tokens = tokens.masked_fill(drop & (src != PAD_ID), UNK_ID)
        if self.training:
            hide = self.hide_chance(chars.shape[0], word_counts, src.device)  # (U,) or None
            if hide is not None:
                # One draw per distinct word (a row of chars), spread to all of its subwords.
                dropped = torch.rand(chars.shape[0], device=src.device) < hide  # (U,)
                tokens = tokens.masked_fill(dropped[word_index] & (src != PAD_ID), UNK_ID)
        # EncoderModel.forward embeds the tokens itself, so the character vectors go in
        # through its InputEmbedding and its Encoder, called one after the other here.
        extra = None if self.chars is None else self.chars(chars)[word_index]  # (B, S, D)
        x = self.body.embed(tokens, extra=extra)  # (B, S, D)
        h = self.body.encoder(x, padding_mask(src, self.config.pad_id), attentions)  # (B, S, D)
        if aux:
            return self.head(h), {name: head(h) for name, head in self.aux_heads.items()}
        return self.head(h)

    def hide_chance(
        self, n_words: int, word_counts: Tensor | None, device: torch.device
    ) -> Tensor | None:
        """(U,) chance that each distinct word of a batch is hidden while training: 1 - (1 -
        word_dropout) count / (alpha + count); None when nothing is hidden."""
        rare = self.rare_word_dropout > 0 and word_counts is not None
        if self.word_dropout == 0 and not rare:
            return None
        keep = torch.full((n_words,), 1.0 - self.word_dropout, device=device)  # (U,)
        if rare:
            counts = word_counts.to(device)  # (U,)
            keep = keep * counts / (self.rare_word_dropout + counts)
        return 1.0 - keep
