"""Tagging for the ``Trainer``: batches of first-subword labels, label-smoothed loss per word,
validation accuracy and macro-F1.

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
    ) -> None:
        self.labels = labels
        self.max_tokens, self.label_smoothing = max_tokens, label_smoothing
        self.train = encode_sentences(encoder, labels, train, max_len)
        self.valid = encode_sentences(encoder, labels, valid, max_len)

    def train_batches(self, epoch: int, seed: int) -> list[TaggingBatch]:
        lengths = [len(e.ids) for e in self.train]
        batches = token_batches(lengths, self.max_tokens, shuffle=True, seed=seed, epoch=epoch)
        return [collate([self.train[i] for i in b]) for b in batches]

    def loss(self, model: nn.Module, batch: TaggingBatch) -> tuple[Tensor, int]:
        """Label-smoothed cross-entropy per word, read at first subwords only."""
        logits = model(batch.src, batch.word_index, batch.chars)  # (B, S, K)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(),
            batch.targets.flatten(),
            ignore_index=IGNORE,
            label_smoothing=self.label_smoothing,
            reduction="sum",
        )
        return loss / max(batch.n_labels, 1), batch.n_labels

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Loss (no smoothing), accuracy and macro-F1 over the validation words."""
        predicted, total, count = predict_labels(model, self.valid, self.max_tokens)
        gold = [t for e in self.valid for t in e.targets if t != IGNORE]
        flat = [p for row in predicted for p in row]
        return {"loss": total / max(count, 1), **label_scores(gold, flat, len(self.labels))}


def encode_sentences(
    encoder: WordEncoder, labels: LabelVocab, sentences: Sequence[TaggedSentence], max_len: int
) -> list[Example]:
    """Examples of gold-tagged sentences, cut into pieces of at most ``max_len`` subwords."""
    out = []
    for s in sentences:
        out += encoder.examples(s.words, [labels.id(t) for t in s.tags], max_len)
    return out
