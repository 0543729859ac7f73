"""Tagging for the ``Trainer``: batches of first-subword labels, label-smoothed loss per word
(plus the extra heads' losses, weighted), validation accuracy and macro-F1.

Legend: B batch, S subwords, K labels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data import token_batches
from qkv.jobs.tagging.data import (
    IGNORE,
    Example,
    TaggedSentence,
    TaggingBatch,
    WordEncoder,
    collate,
    spelling_counts,
)
from qkv.jobs.tagging.predict import predict_labels
from qkv.labels import LabelVocab
from qkv.metrics import label_scores


class TaggingTask:
    """Batches, loss and validation of tagging for the ``Trainer``."""

    name = "tagger"
    metric = "accuracy"
    metric_names = ("loss", "accuracy", "macro_f1")

    def __init__(
        self,
        encoder: WordEncoder,
        labels: LabelVocab,
        train: Sequence[TaggedSentence],
        valid: Sequence[TaggedSentence],
        max_len: int,
        max_tokens: int,
        label_smoothing: float,
        aux_labels: dict[str, LabelVocab] | None = None,
        aux_weight: float = 0.0,
        count_words: bool = False,
    ) -> None:
        self.labels = labels
        self.max_tokens, self.label_smoothing = max_tokens, label_smoothing
        self.aux_weight = aux_weight
        self.train = encode_sentences(encoder, labels, train, max_len, aux_labels)
        self.valid = encode_sentences(encoder, labels, valid, max_len)
        # Each training word's count, for the model's rare_word_dropout; None when it is off.
        self.counts = spelling_counts(self.train) if count_words else None

    def train_batches(self, epoch: int, seed: int) -> list[TaggingBatch]:
        lengths = [len(e.ids) for e in self.train]
        batches = token_batches(lengths, self.max_tokens, shuffle=True, seed=seed, epoch=epoch)
        return [collate([self.train[i] for i in b], self.counts) for b in batches]

    def loss(self, model: nn.Module, batch: TaggingBatch) -> tuple[Tensor, int]:
        """Label-smoothed cross-entropy per word, read at first subwords only; with extra
        heads, plus ``aux_weight`` times each of their cross-entropies per word."""
        logits, extra = model(
            batch.src, batch.word_index, batch.chars, aux=True, word_counts=batch.word_counts
        )  # (B, S, K)
        loss = self._word_loss(logits, batch.targets)
        for name, targets in batch.aux_targets.items():
            loss = loss + self.aux_weight * self._word_loss(extra[name], targets)
        return loss / max(batch.n_labels, 1), batch.n_labels

    def _word_loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Summed label-smoothed cross-entropy of (B, S, K) logits at (B, S) targets."""
        return F.cross_entropy(
            logits.flatten(0, 1).float(),
            targets.flatten(),
            ignore_index=IGNORE,
            label_smoothing=self.label_smoothing,
            reduction="sum",
        )

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Loss (no smoothing), accuracy and macro-F1 over the validation words."""
        predicted, total, count = predict_labels(model, self.valid, self.max_tokens)
        gold = [t for e in self.valid for t in e.targets if t != IGNORE]
        flat = [p for row in predicted for p in row]
        return {"loss": total / max(count, 1), **label_scores(gold, flat, len(self.labels))}


def encode_sentences(
    encoder: WordEncoder,
    labels: LabelVocab,
    sentences: Sequence[TaggedSentence],
    max_len: int,
    aux_labels: dict[str, LabelVocab] | None = None,
) -> list[Example]:
    """Examples of gold-tagged sentences, cut into pieces of at most ``max_len`` subwords;
    with ``aux_labels``, each sentence's values of those columns as extra targets."""
    out = []
    for s in sentences:
        aux = {
            name: [vocab.id(v) for v in s.aux[name]] for name, vocab in (aux_labels or {}).items()
        }
        out += encoder.examples(s.words, [labels.id(t) for t in s.tags], max_len, aux)
    return out
