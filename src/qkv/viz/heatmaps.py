"""Pictures of attention: heatmaps of every layer and head, [CLS] attention over an image,
and the three steps of one query.

Every ``*_figure`` function returns a matplotlib ``Figure`` (drawn off screen by Agg; no
pyplot, so no window and no global state) whose panels and labels tests can read;
``save_figure`` writes one to a PNG.

Legend: L layers, H heads, Q queries, K keys, N patches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qkv import checkpoint as ckpt

if TYPE_CHECKING:
    from qkv.viz.attention import RunAttention
    from qkv.viz.explain import ThreeSteps

CMAP = "viridis"
HEADS_PER_ROW = 4
# Tokens are shown as they are: "$" in a subword must not switch matplotlib to math text.
LABEL = dict(parse_math=False)


def save_figure(figure: Figure, path: str | Path, dpi: int = 110) -> Path:
    """Write ``figure`` as a PNG at ``path`` (atomically); return the path."""
    path = Path(path)
    FigureCanvasAgg(figure)  # drawn off screen, whatever pyplot's backend is
    ckpt.atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=dpi))
    return path


def draw_heatmap(
    ax: Axes, weights: np.ndarray, queries: Sequence[str], keys: Sequence[str], title: str
) -> None:
    """One attention matrix (Q, K) on ``ax``: rows are queries, columns keys, 0..1 colours."""
    ax.imshow(weights, cmap=CMAP, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(keys)), list(keys), rotation=90, fontsize=8, **LABEL)
    ax.set_yticks(range(len(queries)), list(queries), fontsize=8, **LABEL)
    ax.set_title(title, fontsize=10, **LABEL)
    ax.tick_params(length=0)


def heatmap_figure(
    weights: np.ndarray,
    queries: Sequence[str],
    keys: Sequence[str],
    title: str,
    heads: Sequence[int] | None = None,
) -> Figure:
    """A grid of heads, each an attention heatmap labelled with the tokens.

    Args:
        weights: (H', Q, K) the weights of the heads to draw.
        heads: the head number of each panel (default 0..H'-1); one head gives one large map.
    Returns:
        the figure, with one axes per head plus a colour bar.
    """
    heads = list(range(len(weights))) if heads is None else list(heads)
    n_cols = min(len(heads), HEADS_PER_ROW)
    n_rows = math.ceil(len(heads) / n_cols)
    side = min(max(3.0, 0.24 * max(len(keys), len(queries)) + 1.5), 14.0)
    if len(heads) == 1:
        side = min(side * 1.6, 16.0)
    figure = Figure(figsize=(n_cols * side + 1.0, n_rows * side + 0.8), layout="constrained")
    axes = figure.subplots(n_rows, n_cols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(heads):
            figure.delaxes(ax)
            continue
        draw_heatmap(ax, weights[i], queries, keys, f"head {heads[i]}")
    image = axes.flat[0].images[0]
    figure.colorbar(image, ax=[a for a in axes.flat[: len(heads)]], shrink=0.6, label="weight")
    figure.suptitle(title, **LABEL)
    return figure


def patch_overlay_figure(
    image: np.ndarray,
    grid: tuple[int, int],
    cls_weights: np.ndarray,
    title: str,
    heads: Sequence[int] | None = None,
) -> Figure:
    """The [CLS] token's attention over the patches, drawn over the image.

    Args:
        image: (Hi, Wi) or (Hi, Wi, C) in [0, 1].
        grid: (rows, cols) of patches.
        cls_weights: (H', N) the weights of [CLS] on the N patches, per head drawn.
        heads: the head number of each row of ``cls_weights`` (default 0..H'-1).
    Returns:
        the figure: one panel per head, then, for more than one head, their average.
    """
    rows, cols = grid
    heads = list(range(len(cls_weights))) if heads is None else list(heads)
    panels, names = list(cls_weights), [f"head {h}" for h in heads]
    if len(heads) > 1:
        panels, names = [*panels, cls_weights.mean(0)], [*names, "average of heads"]
    n_cols = min(len(panels), HEADS_PER_ROW + 1)
    n_rows = math.ceil(len(panels) / n_cols)
    figure = Figure(figsize=(2.6 * n_cols, 2.8 * n_rows + 0.6), layout="constrained")
    axes = figure.subplots(n_rows, n_cols, squeeze=False)
    height, width = image.shape[:2]
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            figure.delaxes(ax)
            continue
        ax.imshow(image, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
        patch = panels[i].reshape(rows, cols)  # (N,) -> (rows, cols), patches row by row
        ax.imshow(
            patch / max(float(patch.max()), 1e-12),
            cmap="inferno",
            alpha=0.55,
            extent=(-0.5, width - 0.5, height - 0.5, -0.5),
            interpolation="nearest",
        )
        ax.set_title(f"{names[i]}\n[CLS] share on patches {panels[i].sum():.2f}", fontsize=8)
        ax.set_axis_off()
    figure.suptitle(title, **LABEL)
    return figure


def _selected(count: int, chosen: int | None) -> list[int]:
    return list(range(count)) if chosen is None else [chosen]


def attention_pictures(
    attention: RunAttention, out_dir: str | Path, layer: int | None = None, head: int | None = None
) -> list[Path]:
    """Write the PNGs of ``attention`` into ``out_dir``: one per kind and layer.

    Token runs get a grid of heads per figure (or one large map with ``head``); ViT runs get
    the [CLS] attention over the image, per head and averaged.

    Returns:
        the written paths, in order.
    """
    out_dir = Path(out_dir)
    paths: list[Path] = []
    for kind in attention.kinds:
        for l in _selected(kind.n_layers, layer):
            if l >= kind.n_layers:
                continue  # e.g. --layer 3 with 6 encoder but 2 decoder layers
            heads = _selected(kind.n_heads, head)
            suffix = f"layer{l}" + (f"_head{head}" if head is not None else "")
            if attention.image is not None:
                title = f"layer {l}: where [CLS] looks; output {attention.output}"
                cls = kind.weights[l, heads, 0, 1:]  # (H', N): row 0 is [CLS], column 0 too
                figure = patch_overlay_figure(attention.image, attention.grid, cls, title, heads)
                paths.append(save_figure(figure, out_dir / f"vit_{suffix}.png"))
                continue
            title = f"{kind.title}, layer {l} (rows: queries, columns: keys)"
            figure = heatmap_figure(kind.weights[l, heads], kind.queries, kind.keys, title, heads)
            paths.append(save_figure(figure, out_dir / f"{kind.name}_{suffix}.png"))
    return paths


def three_steps_figure(steps: ThreeSteps) -> Figure:
    """The three steps of one query as three bar charts over the key tokens.

    The query's own key is red in self-attention; masked keys (score -inf) are drawn at 0.
    """
    keys = steps.keys
    figure = Figure(figsize=(12, max(3.0, 0.3 * len(keys) + 1.5)), layout="constrained")
    axes = figure.subplots(1, 3, sharey=True)
    rows = np.arange(len(keys))
    own = steps.token if steps.kind != "cross" else -1  # the query is one of the keys
    colours = ["tab:red" if j == own else "tab:blue" for j in rows]
    panels = (
        (steps.scores, f"1. score q·k/√{steps.head_dim}", "score"),
        (steps.weights, "2. softmax: weights (sum 1)", "weight"),
        (steps.shares, f"3. weighted sum of values\n‖output‖ = {steps.output_norm:.3f}", "share"),
    )
    for ax, (values, title, label) in zip(axes, panels, strict=True):
        ax.barh(rows, np.nan_to_num(values, neginf=0.0), color=colours)
        ax.axvline(0.0, color="black", linewidth=0.6)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(label)
    axes[0].set_yticks(rows, keys, fontsize=8, **LABEL)
    axes[0].invert_yaxis()
    figure.suptitle(
        f"{steps.title}, layer {steps.layer}, head {steps.head}: query {steps.query!r}", **LABEL
    )
    return figure
