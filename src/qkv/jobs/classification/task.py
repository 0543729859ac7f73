"""Sentence classification and masked language modelling for the ``Trainer``.

``ClassificationTask`` fine-tunes a ``SequenceClassifier`` on labeled texts;
``MaskedLMTask`` pretrains the encoder of a ``MaskedLanguageModel`` on any text, by predicting
words hidden behind ``<mask>``.

Legend: B batch, S sequence length, C labels, V vocabulary size, M masked positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data import PAD_ID, SPECIAL_TOKENS, UNK_ID, pad_batch, token_batches
from qkv.jobs.classification.model import batched_logits
from qkv.metrics import label_scores

FIRST_WORD_ID = len(SPECIAL_TOKENS)  # ids below are <pad>, <s>, </s>, <unk>
IGNORE = -100  # cross_entropy's ignore_index: a position with nothing to predict


def mask_tokens(
    src: Tensor, mask_id: int, prob: float, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Choose ``prob`` of the word tokens to predict: 80% become <mask>, 10% a random word.

    Returns:
        (inputs (B, S), targets (B, S) with -100 where nothing is predicted)
    """
    chosen = (torch.rand(src.shape, generator=generator) < prob).to(src.device)
    chosen &= src >= FIRST_WORD_ID
    how = torch.rand(src.shape, generator=generator).to(src.device)
    random_ids = torch.randint(FIRST_WORD_ID, mask_id, src.shape, generator=generator)
    inputs = torch.where(chosen & (how < 0.8), torch.full_like(src, mask_id), src)
    inputs = torch.where(chosen & (how >= 0.9), random_ids.to(src.device), inputs)
    return inputs, src.masked_fill(~chosen, IGNORE)


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
            word_dropout: chance that a training word becomes <unk> (regularisation).
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
        """Mean label-smoothed cross-entropy per text; words drop to <unk> at ``word_dropout``."""
        src = batch["src"]
        if self.word_dropout > 0:
            dropped = torch.rand(src.shape, device=src.device) < self.word_dropout
            src = src.masked_fill(dropped & (src >= FIRST_WORD_ID), UNK_ID)
        logits = model(src).float()  # (B, C)
        loss = F.cross_entropy(logits, batch["labels"], label_smoothing=self.label_smoothing)
        return loss, int((src != PAD_ID).sum())

    def validate(self, model: nn.Module) -> dict[str, float]:
        logits = batched_logits(model, self.valid_ids, self.max_tokens)  # (N, C)
        gold = torch.tensor(self.valid_labels)
        loss = F.cross_entropy(logits.cpu(), gold).item()
        scores = label_scores(gold.tolist(), logits.argmax(-1).tolist(), self.n_labels)
        return {"loss": loss, **scores}


class MaskedLMTask:
    """Masked language modelling on unlabeled text, to pretrain the encoder."""

    name = "masked_lm"
    metric = "accuracy"  # of the masked tokens
    metric_names = ("loss", "accuracy")

    def __init__(
        self,
        train_ids: list[list[int]],
        valid_ids: list[list[int]],
        mask_id: int,
        max_tokens: int,
        mask_prob: float = 0.15,
    ) -> None:
        self.train_ids, self.valid_ids = train_ids, valid_ids
        self.mask_id, self.max_tokens, self.mask_prob = mask_id, max_tokens, mask_prob

    def train_batches(self, epoch: int, seed: int) -> list[Tensor]:
        lengths = [len(s) for s in self.train_ids]
        batches = token_batches(lengths, self.max_tokens, True, seed, epoch)
        return [pad_batch([self.train_ids[i] for i in b], PAD_ID) for b in batches]

    def loss(self, model: nn.Module, batch: Tensor) -> tuple[Tensor, int]:
        """Mean cross-entropy over the masked positions."""
        inputs, targets = mask_tokens(batch, self.mask_id, self.mask_prob)
        chosen = targets != IGNORE  # (B, S)
        logits = model(inputs, chosen).float()  # (M, V)
        loss = F.cross_entropy(logits, targets[chosen], reduction="sum")
        return loss / max(int(chosen.sum()), 1), int((batch != PAD_ID).sum())

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Loss and accuracy on the same masked positions at every validation."""
        generator = torch.Generator().manual_seed(0)
        device = next(model.parameters()).device
        total, right, count = 0.0, 0, 0
        lengths = [len(s) for s in self.valid_ids]
        for b in token_batches(lengths, self.max_tokens, shuffle=False, seed=0):
            src = pad_batch([self.valid_ids[i] for i in b], PAD_ID)  # (B, S)
            inputs, targets = mask_tokens(src, self.mask_id, self.mask_prob, generator)
            chosen = targets != IGNORE  # (B, S)
            logits = model(inputs.to(device), chosen.to(device)).float().cpu()  # (M, V)
            total += F.cross_entropy(logits, targets[chosen], reduction="sum").item()
            right += int((logits.argmax(-1) == targets[chosen]).sum())
            count += int(chosen.sum())
        return {"loss": total / max(count, 1), "accuracy": 100.0 * right / max(count, 1)}
