"""Sentence classification for the ``Trainer``: ``ClassificationTask`` fine-tunes a
``SequenceClassifier`` on labeled texts.

Legend: B batch, S sequence length, C labels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data import PAD_ID, hide_words, pad_batch, token_batches
from qkv.jobs.classification.model import batched_logits
from qkv.metrics import label_scores


class ClassificationTask:
    """Batches, loss and validation of sentence classification for the ``Trainer``."""

    name = "classifier"
    metric = "accuracy"
    metric_names = ("loss", "accuracy", "macro_f1")

    def __init__(
        self,
        train: tuple[list[list[int]], list[int]],
        valid: tuple[list[list[int]], list[int]],
        n_labels: int,
        max_tokens: int,
        label_smoothing: float = 0.0,
        word_dropout: float = 0.0,
    ) -> None:
        """``train`` and ``valid`` are (subword ids, label ids) of each text.

        Args:
            max_tokens: tokens per batch, padding included.
            label_smoothing: of the training loss (validation loss has none).
            word_dropout: chance that a training subword becomes <unk> (regularisation).
        """
        (self.train_ids, self.train_labels), (self.valid_ids, self.valid_labels) = train, valid
        self.n_labels, self.max_tokens = n_labels, max_tokens
        self.label_smoothing, self.word_dropout = label_smoothing, word_dropout

    def train_batches(self, epoch: int, seed: int) -> list[dict[str, Tensor]]:
        lengths = [len(s) for s in self.train_ids]
        batches = token_batches(lengths, self.max_tokens, True, seed, epoch)
        return [
            {
                "src": pad_batch([self.train_ids[i] for i in b], PAD_ID),  # (B, S)
                "labels": torch.tensor([self.train_labels[i] for i in b]),  # (B,)
            }
            for b in batches
        ]

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, int]:
        """Mean label-smoothed cross-entropy per text; subwords become <unk> at ``word_dropout``."""
        src = hide_words(batch["src"], self.word_dropout)  # (B, S)
        logits = model(src).float()  # (B, C)
        loss = F.cross_entropy(logits, batch["labels"], label_smoothing=self.label_smoothing)
        return loss, int((src != PAD_ID).sum())

    def validate(self, model: nn.Module) -> dict[str, float]:
        logits = batched_logits(model, self.valid_ids, self.max_tokens)  # (N, C)
        gold = torch.tensor(self.valid_labels)
        loss = F.cross_entropy(logits.cpu(), gold).item()
        scores = label_scores(gold.tolist(), logits.argmax(-1).tolist(), self.n_labels)
        return {"loss": loss, **scores}
