"""The objects every picture of attention is drawn from: one kind of attention, one run's input.

A job's predictor builds a ``RunAttention`` from its model (``Predictor.attention``); heatmaps,
the HTML page and ``explain`` read only these.

Legend: L layers, H heads, Q queries, K keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qkv.errors import InputError

KIND_TITLES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder masked self-attention",
    "cross": "encoder-decoder attention",
}
CLS_TOKEN = "[CLS]"


@dataclass
class AttentionKind:
    """One kind of attention of a run over one input, every layer and head.

    Args:
        name: ``"encoder"``, ``"decoder"`` or ``"cross"``.
        weights: (L, H, Q, K); each row a distribution over the keys.
        queries: the Q tokens that ask (rows).
        keys: the K tokens that are looked at (columns).
    """

    name: str
    weights: np.ndarray
    queries: list[str]
    keys: list[str]

    @property
    def title(self) -> str:
        return KIND_TITLES[self.name]

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]


@dataclass
class RunAttention:
    """What a run made of one input: its output and all its attention weights.

    ``job`` names the run's job (``Predictor.job``), for titles and messages only: nothing
    here depends on it. ``image`` and ``grid`` (rows, cols of patches) are set for runs that
    read an image, whose token 0 is [CLS] and whose other tokens are the patches, row by row.
    """

    job: str
    input: str
    output: str
    kinds: list[AttentionKind]
    image: np.ndarray | None = None
    grid: tuple[int, int] | None = None

    def kind(self, name: str) -> AttentionKind:
        for kind in self.kinds:
            if kind.name == name:
                return kind
        names = ", ".join(k.name for k in self.kinds)
        what = KIND_TITLES.get(name, "attention")
        raise InputError(f"a {self.job} run has no {what} ({name!r}); its kinds are: {names}")


def run_attention(run_dir: str | Path, text: str, device: str = "cpu") -> RunAttention:
    """Load the run in ``run_dir`` (any job) and gather its attention on ``text``."""
    from qkv.jobs import load_run

    if not text.strip():
        raise InputError("the input is empty; give something to look at")
    return load_run(run_dir, device).attention(text)


def check_index(value: int, count: int, option: str, what: str) -> None:
    """An InputError naming ``option`` when ``value`` is not in [0, count)."""
    if not 0 <= value < count:
        raise InputError(f"{option} {value} is out of range: the {what} are 0 to {count - 1}")
