"""Looking inside a trained run: its attention maps, and the three steps of one query.

``run_attention`` loads any run kind and gathers every layer's and head's weights with the
token names to label them. ``explain_query`` recomputes one query of the encoder's
self-attention from the layer's own input and projections, as the source text tells it:
score the query against every key (q·k/√d_k), softmax the scores into a distribution, and
take the weighted sum of the values.

Legend: L layers, H heads, S tokens, Q queries, K keys, D model width, Dh head width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from qkv import checkpoint as ckpt
from qkv.errors import InputError
from qkv.layers import EncoderLayer

def encoder_layers(model: nn.Module) -> list[EncoderLayer]:
    """The encoder's layers in order, wherever the model keeps them."""
    return [m for m in model.modules() if isinstance(m, EncoderLayer)]


def check_index(value: int, count: int, option: str, what: str) -> None:
    """An InputError naming ``option`` when ``value`` is not in [0, count)."""
    if not 0 <= value < count:
        raise InputError(f"{option} {value} is out of range: the {what} are 0 to {count - 1}")


@dataclass
class ThreeSteps:
    """One query of the encoder's self-attention, step by step, with the model's numbers.

    Args:
        scores: (K,) step 1, q·k/√d_k for every key.
        weights: (K,) step 2, the softmax of the scores.
        values: (K, Dh) the value vectors of the keys.
        output: (Dh,) step 3, the weighted sum of the values.
        model_weights: (K,) the weights the model itself reported for this query.
    """

    attention: RunAttention
    layer: int
    head: int
    token: int
    head_dim: int
    scores: np.ndarray
    weights: np.ndarray
    values: np.ndarray
    output: np.ndarray
    model_weights: np.ndarray
    keys: list[str] = field(default_factory=list)

    @property
    def query(self) -> str:
        return self.keys[self.token]

    @property
    def value_norms(self) -> np.ndarray:
        """‖v‖ of each key: (K,)."""
        return np.linalg.norm(self.values, axis=-1)

    @property
    def output_norm(self) -> float:
        return float(np.linalg.norm(self.output))

    @property
    def shares(self) -> np.ndarray:
        """Each key's weight·v projected on the output: (K,), summing to ‖output‖."""
        norm = self.output_norm
        if norm == 0.0:
            return np.zeros_like(self.weights)
        return (self.weights[:, None] * self.values) @ self.output / norm

    def top(self, n: int = 3) -> list[int]:
        """The keys that contribute most to the output, largest first."""
        return [int(i) for i in np.argsort(-self.shares, kind="stable")[:n]]


def _capture_input(module: nn.Module) -> tuple[list[tuple[Tensor, Tensor | None]], Any]:
    """A forward pre-hook on ``module`` recording (input, mask) of calls that want weights."""
    seen: list[tuple[Tensor, Tensor | None]] = []

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        if kwargs.get("need_weights") and kwargs.get("memory") is None and len(args) == 1:
            seen.append((args[0].detach(), kwargs.get("mask")))

    return seen, module.register_forward_pre_hook(hook, with_kwargs=True)


@torch.no_grad()
def three_steps(layer: EncoderLayer, x: Tensor, mask: Tensor | None, head: int, token: int):
    """Scores, weights, values and output of query ``token`` of ``head``.

    Args:
        layer: the encoder layer whose self-attention is recomputed.
        x: (1, S, D) what its ``self_attn`` saw (after the pre-norm, if any).
        mask: (1, 1, 1, S) bool, True = may attend, or None.
    Returns:
        numpy arrays: scores (K,), weights (K,), values (K, Dh), output (Dh,)
    """
    attn = layer.self_attn
    _, S, D = x.shape
    H = attn.n_heads
    q, k, v = attn.in_proj(x).chunk(3, dim=-1)  # (1, S, D) each, from [W_q; W_k; W_v]
    q, k, v = (t.view(S, H, D // H).transpose(0, 1)[head] for t in (q, k, v))  # (S, Dh)
    # Step 1: the query against every key, scaled by √d_k so the softmax stays soft.
    scores = k @ q[token] / math.sqrt(D // H)  # (K,)
    if mask is not None:
        rows = mask[0, 0]  # (1 or Q, K)
        scores = scores.masked_fill(~rows[token if rows.size(0) > 1 else 0], float("-inf"))
    # Step 2: softmax turns the scores into a distribution over the keys.
    weights = torch.softmax(scores.float(), dim=-1)  # (K,)
    # Step 3: the weighted sum of the values.
    output = weights @ v.float()  # (Dh,)
    return (t.float().cpu().numpy() for t in (scores, weights, v, output))


def explain_query(run_dir: str | Path, text: str, token: int, layer: int, head: int) -> ThreeSteps:
    """Recompute query ``token`` of encoder layer ``layer``, head ``head`` on ``text``."""
    task, runner = load_runner(run_dir)
    return explain_with(task, runner, text, token, layer, head)


def explain_with(
    task: str, runner: Any, text: str, token: int, layer: int, head: int
) -> ThreeSteps:
    """``explain_query`` with a loaded runner (see ``load_runner``).

    q, k and v come from the input the layer's ``self_attn`` received (captured with a
    forward pre-hook) and its packed ``in_proj``, split into heads.
    """
    layers = encoder_layers(runner.model)
    if not layers:
        raise InputError(f"a {task} model without encoder layers has no self-attention to explain")
    check_index(layer, len(layers), "--layer", "encoder layers")
    check_index(head, layers[layer].self_attn.n_heads, "--head", "heads")
    seen, handle = _capture_input(layers[layer].self_attn)
    try:
        attention = collect_attention(task, runner, text)
    finally:
        handle.remove()
    encoder = attention.kind("encoder")
    tokens = " ".join(encoder.queries)
    check_index(token, len(encoder.queries), "--token", f"tokens of '{tokens}'")
    if not seen:
        raise InputError(f"the {task} model never showed the input of encoder layer {layer}")
    x, mask = seen[-1]
    scores, weights, values, output = three_steps(layers[layer], x[:1], mask, head, token)
    return ThreeSteps(
        attention=attention,
        layer=layer,
        head=head,
        token=token,
        head_dim=values.shape[-1],
        scores=scores,
        weights=weights,
        values=values,
        output=output,
        model_weights=encoder.weights[layer, head, token],
        keys=encoder.keys,
    )


def _bar(fraction: float, width: int = 20) -> str:
    """A horizontal bar of ``fraction`` (0..1) of ``width`` characters, in eighths."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    return "█" * full + ("" if rest == 0 else " ▏▎▍▌▋▊▉"[rest])


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_steps(steps: ThreeSteps) -> str:
    """A terminal table of the three steps: one row per key token."""
    a = steps.attention
    scale = math.sqrt(steps.head_dim)
    width = max(min(max(len(t) for t in steps.keys) + 2, 24), len("key token") + 2)
    lines = [
        f"input: {a.input}",
        f"output: {a.output}",
        f"{KIND_TITLES['encoder']}, layer {steps.layer}, head {steps.head}: query token "
        f"{steps.token} {steps.query!r} against {len(steps.keys)} keys (d_k = {steps.head_dim})",
        "",
        f"step 1  score   = q·k / √d_k = q·k / {scale:.2f}",
        "step 2  weight  = softmax of the scores: a distribution over the keys, sum 1",
        "step 3  output  = Σ weight × v, a vector of d_k numbers; share = (weight × v) projected "
        "on the output",
        "",
        f"{'#':>3}  {'key token':<{width}}{'score':>9}{'weight':>9}  {'':<20}"
        f"{'weight×‖v‖':>11}{'share':>9}",
    ]
    top = max(float(steps.weights.max()), 1e-12)
    contributions = steps.weights * steps.value_norms
    for j, key in enumerate(steps.keys):
        mark = "*" if j == steps.token else " "
        lines.append(
            f"{j:>3}{mark} {_fit(key, width - 1):<{width}}{steps.scores[j]:>9.3f}"
            f"{steps.weights[j]:>9.4f}  {_bar(steps.weights[j] / top):<20}"
            f"{contributions[j]:>11.4f}{steps.shares[j]:>9.4f}"
        )
    best = ", ".join(f"{steps.keys[j]!r} ({steps.shares[j]:.3f})" for j in steps.top())
    gap = float(np.abs(steps.weights - steps.model_weights).max())
    lines += [
        "",
        f"weights sum to {steps.weights.sum():.6f}; ‖output‖ = {steps.output_norm:.4f} "
        f"= the sum of the shares",
        f"contributing most: {best}",
        f"the model's own weights for this query differ from these by at most {gap:.1e}",
        "(* marks the query token itself)",
    ]
    return "\n".join(lines)
