"""A trained tagger: tag sentences, write word/TAG lines or CoNLL-U, score against a treebank.

Legend: B batch, S subwords, K labels, L layers, H heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.config import option
from qkv.data import token_batches
from qkv.errors import InputError
from qkv.jobs.base import Predictor, picture_path
from qkv.jobs.tagging.data import (
    IGNORE,
    Example,
    TaggedSentence,
    WordEncoder,
    collate,
    read_conllu,
)
from qkv.jobs.tagging.model import TaggerModel
from qkv.labels import LabelVocab
from qkv.metrics import CONFUSION, confusion, label_scores, plot_confusion
from qkv.viz.attention import AttentionKind, RunAttention

FORMATS = ("word-tag", "conllu")


@dataclass
class TagOptions:
    """How ``Tagger`` writes and batches. The options of ``qkv tag``."""

    format: str = option(
        "word-tag",
        "word-tag: `word/TAG ...` lines; conllu: one CoNLL-U block per sentence",
        choices=FORMATS,
    )
    max_tokens: int = option(4096, "subwords per tagging batch, padding included")

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise InputError(f"--format {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.max_tokens < 1:
            raise InputError(f"--max-tokens {self.max_tokens} must be positive")


def predict_labels(
    model: TaggerModel, examples: Sequence[Example], max_tokens: int
) -> tuple[list[list[int]], float, int]:
    """Label ids at each example's first subwords, and the summed loss over labelled words.

    Returns:
        (predicted label ids per example, one per word; loss sum; labelled words)
    """
    device = next(model.parameters()).device
    results: list[list[int]] = [[] for _ in examples]
    total, count = 0.0, 0
    for b in token_batches([len(e.ids) for e in examples], max_tokens, shuffle=False, seed=0):
        batch = collate([examples[i] for i in b])
        src, targets = batch.src.to(device), batch.targets.to(device)
        logits = model(src, batch.word_index.to(device), batch.chars.to(device)).float()
        if batch.n_labels:
            loss = F.cross_entropy(
                logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum"
            )
            total, count = total + loss.item(), count + batch.n_labels
        best = logits.argmax(-1).cpu()  # (B, S)
        for row, i in enumerate(b):
            first = [
                s
                for s, w in enumerate(examples[i].word_index)
                if s == 0 or examples[i].word_index[s - 1] != w
            ]
            results[i] = best[row, first].tolist()
    return results, total, count


def conllu_block(number: int, text: str, tagged: list[tuple[str, str]], tagset: str) -> str:
    """One sentence as CoNLL-U: the tag in the UPOS or XPOS column, the rest ``_``.

    It ends with a newline, so that, written as one output line, it is followed by the blank
    line that closes a CoNLL-U sentence.
    """
    lines = [f"# sent_id = {number}", f"# text = {text}"]
    for i, (word, tag) in enumerate(tagged, start=1):
        upos, xpos = (tag, "_") if tagset == "upos" else ("_", tag)
        lines.append("\t".join([str(i), word, "_", upos, xpos, "_", "_", "_", "_", "_"]))
    return "\n".join(lines) + "\n"


class Tagger(Predictor):
    """A trained tagging run: ``Tagger.load(run_dir).tag(["The dog barks ."])``."""

    job = "tagger"

    def __init__(
        self,
        model: TaggerModel,
        encoder: WordEncoder,
        labels: LabelVocab,
        settings: Any,
        options: TagOptions | None = None,
    ) -> None:
        self.model, self.encoder, self.labels = model.eval(), encoder, labels
        self.settings = settings
        self.options = options or TagOptions()

    @property
    def tagset(self) -> str:
        return self.settings.tagset

    @staticmethod
    def _words(sentence: str | Sequence[str]) -> list[str]:
        return sentence.split() if isinstance(sentence, str) else list(sentence)

    @torch.no_grad()
    def _predict(self, sentences: Sequence[Sequence[str]]) -> list[list[int]]:
        """Label ids per word; long sentences are tagged in pieces the positions can hold."""
        examples, owner = [], []
        for i, words in enumerate(sentences):
            pieces = self.encoder.examples(words, None, self.settings.max_len)
            examples += pieces
            owner += [i] * len(pieces)
        results: list[list[int]] = [[] for _ in sentences]
        predicted, _, _ = predict_labels(self.model, examples, self.options.max_tokens)
        for i, ids in zip(owner, predicted, strict=True):
            results[i] += ids
        return results

    def tag(self, sentences: Sequence[str | Sequence[str]]) -> list[list[tuple[str, str]]]:
        """(word, tag) pairs per sentence; a string is split on whitespace into words."""
        words = [self._words(s) for s in sentences]
        predicted = self._predict(words)
        return [
            [(w, self.labels.names[t]) for w, t in zip(ws, ts, strict=True)]
            for ws, ts in zip(words, predicted, strict=True)
        ]

    def predict_lines(self, lines: list[str], first_number: int = 1) -> list[str]:
        """`word/TAG ...` per line, or its CoNLL-U block (``sent_id`` = the line number).

        An empty line gives an empty line; CoNLL-U has no empty sentences.
        """
        tagged = self.tag(lines)
        if self.options.format == "word-tag":
            return [" ".join(f"{w}/{t}" for w, t in pairs) for pairs in tagged]
        return [
            conllu_block(number, " ".join(line.split()), pairs, self.tagset) if pairs else ""
            for number, (line, pairs) in enumerate(zip(lines, tagged, strict=True), first_number)
        ]

    @torch.no_grad()
    def attention(self, text: str) -> RunAttention:
        """Tag ``text`` and collect every layer's and head's self-attention over its subwords."""
        words = self._words(text)
        examples = self.encoder.examples(words, None, self.settings.max_len)
        if len(examples) != 1:
            raise InputError(
                "the input is empty; give a sentence to look at"
                if not words
                else f"the sentence has {len(words)} words and needs one piece of at most "
                f"--max-len {self.settings.max_len} subwords; pass a shorter one"
            )
        batch = collate(examples)
        attentions: list[Tensor] = []
        device = self.device
        self.model(
            batch.src.to(device), batch.word_index.to(device), batch.chars.to(device), attentions
        )
        weights = torch.stack(attentions)[:, 0].float().cpu().numpy()  # (L, H, S, S)
        tokens = self.encoder.tokenizer.token_strings(examples[0].ids)
        output = " ".join(f"{w}/{t}" for w, t in self.tag([words])[0])
        kinds = [AttentionKind("encoder", weights, tokens, tokens)]  # (L, H, S, S)
        return RunAttention(self.job, text, output, kinds)

    def evaluate_data(self, data: str | None, out: Path | None) -> dict[str, Any]:
        """Accuracy and macro-F1 on the CoNLL-U file ``data`` (default: the run's --valid).

        The confusion matrix is drawn into ``out``/confusion.png only when ``out`` is given.
        """
        path = self.data_path(data, "FILE.conllu")
        sentences = read_conllu(path, self.tagset, "--data")
        scores = self.evaluate(sentences, picture_path(out, CONFUSION), name=path)
        return {"data": str(path), "tagset": self.tagset, **scores}

    def evaluate(
        self,
        sentences: Sequence[TaggedSentence],
        confusion_png: Path | None = None,
        name: str | Path = "data",
    ) -> dict[str, Any]:
        """Accuracy and macro-F1 (percent) against gold tags; optionally a confusion PNG.

        A gold tag the run never saw in training counts as a wrong answer (the model cannot
        give it) and gets its own row in the confusion matrix; ``unseen_gold_tags`` counts them.
        """
        names = list(self.labels.names)
        extra = sorted({t for s in sentences for t in s.tags} - set(names))
        index = {n: i for i, n in enumerate(names + extra)}
        gold = [index[t] for s in sentences for t in s.tags]
        predicted = [p for row in self._predict([s.words for s in sentences]) for p in row]
        scores = label_scores(gold, predicted, len(index))
        result: dict[str, Any] = {
            **scores,
            "words": len(gold),
            "sentences": len(sentences),
            "unseen_gold_tags": sum(g >= len(names) for g in gold),
        }
        if confusion_png is not None:
            matrix = confusion(gold, predicted, len(index))
            title = f"{self.tagset.upper()} on {Path(name).name}: {scores['accuracy']:.2f}%"
            result["confusion"] = str(plot_confusion(matrix, names + extra, confusion_png, title))
        return result
