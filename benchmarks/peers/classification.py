"""A plain peer sentence classifier, written as a PyTorch user would from ``nn.TransformerEncoder``.

Nothing here comes from qkv's model code: a token embedding over the subwords of the
tokenizer a qkv run saved (so both sides read the same ids), learned positions, a stack of
``nn.TransformerEncoderLayer`` (pre-norm, GELU), the mean of the real positions' outputs,
dropout and one linear layer. No pretraining: the labeled training texts are all it sees,
for the whole budget, and its last weights are scored.

Legend: B batch, S sequence length, D model width, C labels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.data import PAD_ID, SubwordTokenizer
from qkv.jobs.classification import ClassifierJob
from qkv.jobs.classification.data import LabeledTexts, encode_texts

from .common import encoder_sizes, encoder_stack, length_groups, pad
from .loop import PeerRecipe, train_for

# The qkv classifier's sizes and fine-tuning recipe (its job defaults), so that the two
# differ in the code and in pretraining, not in the sizes chosen. The peer keeps lr 5e-4, the
# job's default when its figures were measured: qkv's 1e-3 was chosen on dev for a pretrained
# encoder; the peer at 1e-3 on dev, 73.39% and 74.08% against 71.90% and 74.66% (seeds 1-2),
# within the noise (docs/benchmarks.md, SST-2).
_QKV = ModelConfig.preset(ClassifierJob.preset, **ClassifierJob.model_defaults)
SIZES = encoder_sizes(_QKV)
_TRAIN = ClassifierJob.train_defaults
RECIPE = PeerRecipe(
    lr=5e-4,
    warmup_steps=_TRAIN["warmup_steps"],
    weight_decay=_TRAIN["weight_decay"],
    clip_norm=1.0,
    label_smoothing=ClassifierJob.Settings().label_smoothing,
)
MAX_LEN = 128  # subwords kept per text
MAX_TOKENS = 1024  # padded tokens per batch


class PeerClassifier(nn.Module):
    """Embedding + positions, ``nn.TransformerEncoder``, mean pooling, linear: (B, S) -> (B, C).

    The sizes are the classifier job's (``SIZES``)."""

    def __init__(
        self,
        vocab_size: int,
        n_labels: int,
        *,
        d_model: int,
        nhead: int,
        num_layers: int,
        dim_feedforward: int,
        dropout: float,
        max_len: int = MAX_LEN,
        pad_id: int = PAD_ID,
    ) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.positions = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.encoder = encoder_stack(d_model, nhead, dim_feedforward, dropout, num_layers)
        self.head = nn.Linear(d_model, n_labels)

    def forward(self, tokens: Tensor) -> Tensor:
        """Token ids (B, S) -> label logits (B, C)."""
        padding = tokens.eq(self.pad_id)  # (B, S) True = padding, torch's convention
        where = torch.arange(tokens.size(1), device=tokens.device)  # (S,)
        x = self.dropout(self.embedding(tokens) + self.positions(where))  # (B, S, D)
        states = self.encoder(x, src_key_padding_mask=padding)  # (B, S, D)
        real = (~padding).unsqueeze(-1).to(states.dtype)  # (B, S, 1)
        pooled = (states * real).sum(1) / real.sum(1).clamp(min=1.0)  # (B, D)
        return self.head(self.dropout(pooled))


def batches_of(
    ids: list[list[int]], labels: list[int], max_tokens: int, seed: int
) -> Callable[[int], Iterator[tuple[Tensor, Tensor]]]:
    """Per epoch: (tokens (B, S), labels (B,)) batches by length, in a shuffled order."""
    groups = length_groups([len(s) for s in ids], max_tokens)

    def epoch_batches(epoch: int) -> Iterator[tuple[Tensor, Tensor]]:
        generator = torch.Generator().manual_seed(seed * 1000 + epoch)
        for g in torch.randperm(len(groups), generator=generator).tolist():
            yield pad([ids[i] for i in groups[g]]), torch.tensor([labels[i] for i in groups[g]])

    return epoch_batches


@torch.no_grad()
def predict(model: PeerClassifier, ids: list[list[int]], max_tokens: int = 4096) -> list[int]:
    """The most probable label id of each text, in input order."""
    model.eval()
    predicted = [0] * len(ids)
    for group in length_groups([len(s) for s in ids], max_tokens):
        labels = model(pad([ids[i] for i in group])).argmax(-1).tolist()  # (B,)
        for i, label in zip(group, labels, strict=True):
            predicted[i] = label
    return predicted


def train_and_test(
    tokenizer_file: Path,
    train: LabeledTexts,
    test: LabeledTexts,
    seconds: float,
    seed: int,
    lowercase: bool = True,
) -> dict[str, Any]:
    """Train a peer on ``train`` for ``seconds`` with the qkv run's tokenizer; score ``test``.

    Args:
        tokenizer_file: the ``tokenizer.json`` a qkv classifier run saved.
        lowercase: lower-case the texts first, as the qkv run did.

    Returns:
        Test accuracy in percent, the texts scored, and the training loop's figures.
    """
    tokenizer = SubwordTokenizer.load(tokenizer_file)
    names = sorted(set(train.labels))
    index = {name: i for i, name in enumerate(names)}

    def encoded(data: LabeledTexts) -> list[list[int]]:
        texts = [t.lower() for t in data.texts] if lowercase else data.texts
        return encode_texts(tokenizer, texts, MAX_LEN, cls=False)

    torch.manual_seed(seed)
    model = PeerClassifier(tokenizer.vocab_size, len(names), **SIZES)
    train_labels = [index[label] for label in train.labels]
    batches = batches_of(encoded(train), train_labels, MAX_TOKENS, seed)

    def loss_fn(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        tokens, gold = batch
        return F.cross_entropy(model(tokens), gold, label_smoothing=RECIPE.label_smoothing)

    loop = train_for(model, batches, loss_fn, seconds, RECIPE, seed)
    predicted = predict(model, encoded(test))
    gold = [index.get(label, -1) for label in test.labels]
    right = sum(p == g for p, g in zip(predicted, gold, strict=True))
    return {
        "test_accuracy": round(100.0 * right / len(gold), 2),
        "test_texts": len(gold),
        "parameters": sum(p.numel() for p in model.parameters()),
        **loop,
    }
