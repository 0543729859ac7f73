"""Pictures of training and of the model's inputs: the curves in a run's metrics.csv and the
sinusoidal positional encoding.

Like ``heatmaps``, every ``*_figure`` returns a matplotlib ``Figure`` drawn off screen; write
it with ``qkv.viz.heatmaps.save_figure``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from matplotlib.figure import Figure

from qkv import checkpoint as ckpt
from qkv.embeddings import sinusoid_table
from qkv.errors import InputError
from qkv.viz.heatmaps import LABEL


def read_metrics(path: str | Path) -> dict[str, list[tuple[float, float]]]:
    """metrics.csv as column -> [(step, value)] over the rows where the column is filled."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no metrics here; is this the --out folder of `qkv train`?")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (csv.Error, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a metrics CSV file ({error})") from None
    if not rows or "step" not in rows[0]:
        raise InputError(f"{path}: no metric rows; train for at least --log-every steps")
    series: dict[str, list[tuple[float, float]]] = {}
    validated: set[str] = set()  # steps with a validation row already
    for row in rows:
        # The last checkpoints averaged are no point of the curve; the last step's own weights
        # ("final") are. Runs before the "averaged" mark wrote "final" for both, the average
        # second or alone at a step validated in the loop: a step's first validation counts.
        note = row.get("note")
        if note == ckpt.AVERAGED or (note == ckpt.FINAL and row.get("step") in validated):
            continue
        if any(column.startswith("val_") and value for column, value in row.items()):
            validated.add(row.get("step"))
        for column, value in row.items():
            if column in ("step", "epoch", "elapsed_s", "note") or value in ("", None):
                continue
            try:
                series.setdefault(column, []).append((float(row["step"]), float(value)))
            except ValueError:
                raise InputError(f"{path}: {column}={value!r} is not a number") from None
    return series


def training_curves_figure(metrics: dict[str, list[tuple[float, float]]], title: str) -> Figure:
    """Loss (train and validation), each validation metric, and the learning rate by step.

    Returns:
        the figure: one panel for the losses, one per validation metric, one for ``lr``.
    """
    losses = [c for c in ("train_loss", "val_loss") if c in metrics]
    others = [c for c in metrics if c.startswith("val_") and c != "val_loss"]
    panels: list[tuple[str, list[str]]] = [("loss", losses)] if losses else []
    panels += [(c.removeprefix("val_"), [c]) for c in others]
    if "lr" in metrics:
        panels.append(("learning rate", ["lr"]))
    if not panels:
        raise InputError("metrics.csv has no loss, validation or learning-rate column to draw")
    n_cols = min(len(panels), 3)
    n_rows = math.ceil(len(panels) / n_cols)
    figure = Figure(figsize=(4.2 * n_cols, 3.2 * n_rows + 0.5), layout="constrained")
    axes = figure.subplots(n_rows, n_cols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            figure.delaxes(ax)
            continue
        name, columns = panels[i]
        for column in columns:
            steps, values = zip(*metrics[column], strict=True)
            marker = "o" if column.startswith("val_") else None
            ax.plot(steps, values, marker=marker, markersize=3, label=column)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(columns) > 1:
            ax.legend(fontsize=8)
    figure.suptitle(title, **LABEL)
    return figure


def positional_encoding_figure(max_len: int = 100, d_model: int = 128) -> Figure:
    """The sinusoid table PE (positions x dimensions), and a few of its columns as waves."""
    if max_len < 1 or d_model < 2 or d_model % 2:
        raise InputError(
            f"--max-len {max_len} must be at least 1 and --d-model {d_model} an even number >= 2"
        )
    table = sinusoid_table(max_len, d_model).numpy()  # (max_len, D)
    figure = Figure(figsize=(12, 4.5), layout="constrained")
    left, right = figure.subplots(1, 2, width_ratios=(3, 2))
    image = left.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    left.set_xlabel("dimension i")
    left.set_ylabel("position")
    left.set_title(f"PE[pos, 2i] = sin(pos / 10000^(2i/{d_model})), PE[pos, 2i+1] = cos(...)")
    figure.colorbar(image, ax=left, shrink=0.8)
    for i in sorted({0, 2, min(8, d_model - 2), d_model // 2, d_model - 2}):
        right.plot(table[:, i], label=f"dimension {i}")
    right.set_xlabel("position")
    right.set_title("low dimensions turn fast, high ones slowly")
    right.legend(fontsize=8)
    return figure
