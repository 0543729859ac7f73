"""Scores of labelling jobs (tagging, classification, images): accuracy, macro-F1, confusions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from qkv.checkpoint import atomic_write

CONFUSION = "confusion.png"  # the confusion matrix of a run or an evaluation


def label_scores(gold: Sequence[int], predicted: Sequence[int], n_labels: int) -> dict[str, float]:
    """Accuracy and macro-F1 in percent; macro-F1 over the labels in gold or predicted."""
    from sklearn.metrics import f1_score

    gold_a, pred_a = np.asarray(gold), np.asarray(predicted)
    if gold_a.shape != pred_a.shape:
        raise ValueError(f"{gold_a.shape[0]} gold labels but {pred_a.shape[0]} predictions")
    if gold_a.size == 0:
        return {"accuracy": 0.0, "macro_f1": 0.0}
    present = sorted(set(gold_a.tolist()) | set(pred_a.tolist()))
    return {
        "accuracy": 100.0 * float((gold_a == pred_a).mean()),
        "macro_f1": 100.0
        * float(f1_score(gold_a, pred_a, labels=present, average="macro", zero_division=0)),
    }


def confusion(gold: Sequence[int], predicted: Sequence[int], n_labels: int) -> np.ndarray:
    """(n_labels, n_labels) counts: row = gold label, column = predicted label."""
    matrix = np.zeros((n_labels, n_labels), dtype=np.int64)
    np.add.at(matrix, (np.asarray(gold, dtype=np.int64), np.asarray(predicted, dtype=np.int64)), 1)
    return matrix


def plot_confusion(matrix: np.ndarray, labels: Sequence[str], path: Path, title: str) -> Path:
    """A row-normalised confusion matrix as PNG, with counts in the cells when it is small."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(labels)
    rows = matrix.sum(axis=1, keepdims=True).clip(min=1)
    size = max(4.0, 0.45 * n + 2)
    fig, ax = plt.subplots(figsize=(size, size * 0.9))
    image = ax.imshow(matrix / rows, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(n), labels, rotation=90 if n > 6 else 0)
    ax.set_yticks(range(n), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title)
    if n <= 20:
        for i in range(n):
            for j in range(n):
                if matrix[i, j]:
                    ax.text(
                        j,
                        i,
                        str(matrix[i, j]),
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if matrix[i, j] / rows[i, 0] > 0.5 else "black",
                    )
    fig.colorbar(image, ax=ax, fraction=0.046, label="share of the gold row")
    fig.tight_layout()
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return Path(path)
