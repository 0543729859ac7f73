"""A plain peer tagger, written as a PyTorch user would from ``torch.nn.TransformerEncoder``.

Nothing here comes from qkv's model code. Each word is one token: the sum of three
embeddings, scaled by sqrt(d_model), plus sinusoidal positions:

- the word itself, from the training file's words seen at least twice (the rest, and every
  word not in training, are ``<unk>``, so the model learns what to do with unknown words);
- its last three characters, lower-cased (suffixes seen at least twice in training);
- its shape: lower-case, Capitalised, ALL CAPS, holds a digit, or none of these.

No other character features. ``nn.TransformerEncoder`` (pre-norm) reads the sentence; a
linear layer gives UPOS scores per word; cross-entropy over the real words only.

Legend: B batch, W words, D model width, K tags.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .common import encoder_stack, length_groups, pad, sinusoid_table

PAD, UNK = 0, 1  # ids of every peer vocabulary: padding, then unknown
SHAPES = ("<pad>", "lower", "title", "upper", "digit", "other")
MIN_COUNT = 2  # words and suffixes seen fewer times in training are <unk>


def shape(word: str) -> int:
    if any(c.isdigit() for c in word):
        return SHAPES.index("digit")
    if word.islower():
        return SHAPES.index("lower")
    if word.isupper():
        return SHAPES.index("upper")
    if word[:1].isupper():
        return SHAPES.index("title")
    return SHAPES.index("other")


def suffix(word: str) -> str:
    return word[-3:].lower()


def vocabulary(items: Sequence[str]) -> dict[str, int]:
    """Items seen at least ``MIN_COUNT`` times -> ids after ``<pad>`` and ``<unk>``."""
    counts = Counter(items)
    kept = sorted(w for w, n in counts.items() if n >= MIN_COUNT)
    return {w: i + 2 for i, w in enumerate(kept)}


@dataclass
class PeerVocab:
    """The peer's words, suffixes and tags, all learned from the training sentences."""

    words: dict[str, int]
    suffixes: dict[str, int]
    tags: list[str]

    @classmethod
    def build(cls, sentences: Sequence[tuple[Sequence[str], Sequence[str]]]) -> PeerVocab:
        words = [w for ws, _ in sentences for w in ws]
        tags = sorted({t for _, ts in sentences for t in ts})
        return cls(vocabulary(words), vocabulary([suffix(w) for w in words]), tags)

    def encode(self, words: Sequence[str]) -> tuple[list[int], list[int], list[int]]:
        """(word ids, suffix ids, shape ids) of one sentence."""
        return (
            [self.words.get(w, UNK) for w in words],
            [self.suffixes.get(suffix(w), UNK) for w in words],
            [shape(w) for w in words],
        )


class PeerTagger(nn.Module):
    """Word + suffix + shape embeddings, ``nn.TransformerEncoder``, a linear head.

    (B, W) ids of each kind -> (B, W, K) tag scores. The sizes are the tagger's
    (``common.encoder_sizes``), passed by the benchmark.
    """

    def __init__(
        self,
        n_words: int,
        n_suffixes: int,
        n_tags: int,
        *,
        d_model: int,
        nhead: int,
        num_layers: int,
        dim_feedforward: int,
        dropout: float,
        max_len: int = 1024,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.words = nn.Embedding(n_words, d_model, padding_idx=PAD)
        self.suffixes = nn.Embedding(n_suffixes, d_model, padding_idx=PAD)
        self.shapes = nn.Embedding(len(SHAPES), d_model, padding_idx=PAD)
        for table in (self.words, self.suffixes, self.shapes):
            nn.init.normal_(table.weight, std=d_model**-0.5)
        self.register_buffer("positions", sinusoid_table(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.encoder = encoder_stack(d_model, nhead, dim_feedforward, dropout, num_layers, "relu")
        self.head = nn.Linear(d_model, n_tags)

    def forward(self, words: Tensor, suffixes: Tensor, shapes: Tensor) -> Tensor:
        x = self.words(words) + self.suffixes(suffixes) + self.shapes(shapes)  # (B, W, D)
        x = self.dropout(x * math.sqrt(self.d_model) + self.positions[: words.size(1)])
        hidden = self.encoder(x, src_key_padding_mask=words.eq(PAD))  # (B, W, D)
        return self.head(hidden)  # (B, W, K)


Batch = tuple[Tensor, Tensor, Tensor, Tensor]  # words, suffixes, shapes (B, W); tags (B, W)


def peer_loss(model: PeerTagger, batch: Batch, label_smoothing: float) -> Tensor:
    """Mean label-smoothed cross-entropy over the real words (padding tags are -100)."""
    words, suffixes, shapes, tags = batch
    logits = model(words, suffixes, shapes)  # (B, W, K)
    return F.cross_entropy(
        logits.flatten(0, 1), tags.flatten(), ignore_index=-100, label_smoothing=label_smoothing
    )


def make_batch(vocab: PeerVocab, sentences: Sequence[tuple[Sequence[str], Sequence[str]]]):
    tag_ids = {t: i for i, t in enumerate(vocab.tags)}
    encoded = [vocab.encode(words) for words, _ in sentences]
    return (
        pad([e[0] for e in encoded], PAD),
        pad([e[1] for e in encoded], PAD),
        pad([e[2] for e in encoded], PAD),
        pad([[tag_ids.get(t, -100) for t in tags] for _, tags in sentences], -100),
    )


def batches_of(
    vocab: PeerVocab,
    sentences: Sequence[tuple[Sequence[str], Sequence[str]]],
    max_tokens: int,
    seed: int,
) -> Callable[[int], Iterator[Batch]]:
    """Per epoch: batches of at most ``max_tokens`` padded words, in shuffled order."""
    batches = [
        make_batch(vocab, [sentences[i] for i in g])
        for g in length_groups([len(w) for w, _ in sentences], max_tokens)
    ]

    def epoch_batches(epoch: int) -> Iterator[Batch]:
        generator = torch.Generator().manual_seed(seed * 1000 + epoch)
        for b in torch.randperm(len(batches), generator=generator).tolist():
            yield batches[b]

    return epoch_batches


@torch.no_grad()
def tag(
    model: PeerTagger, vocab: PeerVocab, sentences: Sequence[Sequence[str]], max_tokens: int = 4096
) -> list[list[str]]:
    """The predicted tag of every word of every sentence."""
    model.eval()
    out: list[list[str]] = [[] for _ in sentences]
    for g in length_groups([len(s) for s in sentences], max_tokens):
        words, suffixes, shapes, _ = make_batch(vocab, [(sentences[i], []) for i in g])
        best = model(words, suffixes, shapes).argmax(-1)  # (B, W)
        for row, i in enumerate(g):
            out[i] = [vocab.tags[k] for k in best[row, : len(sentences[i])].tolist()]
    return out
