"""A trained classifier: label texts, score it on labeled data, show its attention.

Legend: N texts, C labels, L layers, H heads, S sequence length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from qkv.config import option
from qkv.data import SubwordTokenizer
from qkv.errors import InputError
from qkv.jobs.base import JobSettings, Predictor, picture_path
from qkv.jobs.classification.data import LabeledTexts, encode_texts, read_labeled
from qkv.jobs.classification.model import SequenceClassifier, batched_logits
from qkv.labels import LabelVocab
from qkv.metrics import CONFUSION, confusion, label_scores, plot_confusion
from qkv.viz.attention import CLS_TOKEN, AttentionKind, RunAttention


@dataclass
class ClassifyOptions:
    """How ``Classifier`` batches texts: the options of ``qkv classify`` and ``qkv evaluate``."""

    max_tokens: int = option(4096, "subword tokens per batch, padding included")

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InputError(f"--max-tokens {self.max_tokens} must be at least 1")


class Classifier(Predictor):
    """A trained classification run: ``Classifier.load(run_dir).predict(["a fine film"])``."""

    job = "classifier"

    def __init__(
        self,
        model: SequenceClassifier,
        tokenizer: SubwordTokenizer,
        labels: LabelVocab,
        settings: JobSettings | None = None,
        options: ClassifyOptions | None = None,
    ) -> None:
        """``settings`` are the run's ``ClassifierSettings`` (max_len, format, valid)."""
        self.model, self.tokenizer, self.labels = model.eval(), tokenizer, labels
        self.settings = settings
        self.options = options or ClassifyOptions()
        asked = getattr(settings, "max_len", model.config.max_len)
        self.max_len = min(asked, model.config.max_len)  # positions the model has

    @property
    def uses_cls(self) -> bool:
        return self.model.pooling == "cls"

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        if getattr(self.settings, "lowercase", False):
            texts = [t.lower() for t in texts]  # as the run's training texts were
        return encode_texts(self.tokenizer, texts, self.max_len, self.uses_cls)

    @torch.no_grad()
    def probabilities(self, texts: Sequence[str]) -> Tensor:
        """Softmax over the labels for each text: (N, C), columns in ``labels.names`` order."""
        if not texts:
            return torch.zeros(0, len(self.labels))
        logits = batched_logits(self.model, self.encode(texts), self.options.max_tokens)
        return logits.softmax(-1).cpu()  # (N, C)

    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """The most probable label of each text and its probability."""
        best = self.probabilities(texts).max(-1)
        return [
            (self.labels.names[i], p)
            for p, i in zip(best.values.tolist(), best.indices.tolist(), strict=True)
        ]

    def predict_lines(self, lines: list[str], first_number: int = 1) -> list[str]:
        """``label<TAB>probability`` per line; an empty line gives an empty line."""
        todo = [i for i, line in enumerate(lines) if line.strip()]
        outputs = [""] * len(lines)
        for i, (label, p) in zip(todo, self.predict([lines[i] for i in todo]), strict=True):
            outputs[i] = f"{label}\t{p:.4f}"
        return outputs

    def evaluate(self, data: LabeledTexts, confusion_png: Path | None = None) -> dict[str, Any]:
        """Accuracy and macro-F1 in percent; a label never seen in training is an InputError.

        Args:
            data: the labeled texts.
            confusion_png: where to draw the confusion matrix, if anywhere.
        """
        gold = [self.labels.id(label, data.where(i)) for i, label in enumerate(data.labels)]
        predicted = self.probabilities(data.texts).argmax(-1).tolist()
        scores: dict[str, Any] = label_scores(gold, predicted, len(self.labels))
        scores["texts"] = len(data)
        if confusion_png is not None:
            matrix = confusion(gold, predicted, len(self.labels))
            title = f"{Path(data.source).name}: accuracy {scores['accuracy']:.1f}%"
            scores["confusion_png"] = str(
                plot_confusion(matrix, self.labels.names, confusion_png, title)
            )
        return scores

    def evaluate_data(self, data: str | None, out: Path | None) -> dict[str, Any]:
        """Scores on the labeled file ``data`` (default: the run's validation file).

        The file is read in the run's ``--format``; the confusion matrix goes into ``out``
        when it is given, never into the run folder.
        """
        path = self.data_path(data, "FILE")
        texts = read_labeled(path, getattr(self.settings, "format", "auto"))
        return {"data": str(path), **self.evaluate(texts, picture_path(out, CONFUSION))}

    @torch.no_grad()
    def attention(self, text: str) -> RunAttention:
        """The label of ``text`` and every layer's and head's attention over its subwords.

        The tokens start with [CLS] when the run pools by it.
        """
        ids = self.encode([text])[0]
        attentions: list[Tensor] = []
        src = torch.tensor([ids], device=self.device)  # (1, S)
        logits = self.model(src, attentions).float()  # (1, C)
        probability, index = logits.softmax(-1)[0].max(-1)
        tokens = self.tokenizer.token_strings(ids)
        if self.uses_cls:
            tokens[0] = CLS_TOKEN
        weights = torch.stack(attentions)[:, 0].float().cpu().numpy()  # (L, H, S, S)
        output = f"{self.labels.names[int(index)]} (probability {float(probability):.2f})"
        return RunAttention(
            self.job, text, output, [AttentionKind("encoder", weights, tokens, tokens)]
        )
