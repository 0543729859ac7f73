"""The three steps of attention for one query, with a trained run's own numbers.

``explain_query`` recomputes one query of one head of one layer from what that layer's
``MultiHeadAttention`` received (captured with a forward pre-hook while the predictor runs)
and its own projections, as the source text tells it: score the query against every key
(q·k/√d_k), softmax the scores into a distribution, and take the weighted sum of the values.
It then sets the result beside the weights the model itself reported (``RunAttention``).

Three kinds, found by the layers a model has, never by its job's name:
- ``encoder``: self-attention of an ``EncoderLayer`` (every job has it);
- ``decoder``: masked self-attention of a ``DecoderLayer``: queries and keys are ``<s>`` and
  the output so far, and the causal mask lets query t see keys 0..t only;
- ``cross``: encoder-decoder attention of a ``DecoderLayer``: the query comes from the
  target side, keys and values from the encoder output (``memory``) under the source mask.

Legend: S tokens, Q queries, K keys, D model width, Dh head width.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.attention import MultiHeadAttention, causal_mask
from qkv.errors import InputError
from qkv.layers import DecoderLayer, EncoderLayer
from qkv.viz.attention import KIND_TITLES, RunAttention, check_index

if TYPE_CHECKING:
    from qkv.jobs.base import Predictor

# Where each kind's MultiHeadAttention lives: (layer class, its attribute, what the layers are).
KIND_MODULES = {
    "encoder": (EncoderLayer, "self_attn", "encoder layers"),
    "decoder": (DecoderLayer, "self_attn", "decoder layers"),
    "cross": (DecoderLayer, "cross_attn", "decoder layers"),
}


@dataclass
class ThreeSteps:
    """One query of one kind of attention, step by step, with the model's numbers.

    Args:
        kind: ``"encoder"``, ``"decoder"`` or ``"cross"``.
        scores: (K,) step 1, q·k/√d_k for every key; -inf where the mask hides the key.
        weights: (K,) step 2, the softmax of the scores.
        values: (K, Dh) the value vectors of the keys.
        output: (Dh,) step 3, the weighted sum of the values.
        model_weights: (K,) the weights the model itself reported for this query.
        queries, keys: the kind's query tokens (Q) and key tokens (K).
    """

    attention: RunAttention
    kind: str
    layer: int
    head: int
    token: int
    head_dim: int
    scores: np.ndarray
    weights: np.ndarray
    values: np.ndarray
    output: np.ndarray
    model_weights: np.ndarray
    queries: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return KIND_TITLES[self.kind]

    @property
    def query(self) -> str:
        return self.queries[self.token]

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


@dataclass
class AttentionCall:
    """What one ``MultiHeadAttention.forward`` call received (row 0 of the batch).

    Args:
        x: (1, Q, D) the queries' input (after the pre-norm, if any).
        memory: (1, K, D) the encoder output for cross-attention, else None (keys = ``x``).
        mask: bool, True = may attend, broadcastable to (1, H, Q, K), or None.
        is_causal: whether the causal mask was added on top of ``mask``.
    """

    x: Tensor
    memory: Tensor | None
    mask: Tensor | None
    is_causal: bool


def attention_modules(model: nn.Module, kind: str) -> list[MultiHeadAttention]:
    """The ``MultiHeadAttention`` of each layer of ``kind`` in ``model``, in order."""
    layer_class, attribute, _ = KIND_MODULES[kind]
    return [getattr(m, attribute) for m in model.modules() if isinstance(m, layer_class)]


def _capture_calls(module: MultiHeadAttention) -> tuple[list[AttentionCall], Any]:
    """A forward pre-hook on ``module`` recording the calls that ask for the weights.

    Only those: a predictor may decode with caches first (one new position per call), then
    run the whole input once with ``need_weights`` to report the weights.
    """
    seen: list[AttentionCall] = []
    signature = inspect.signature(module.forward)

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        call = bound.arguments
        if not call["need_weights"]:
            return
        memory, mask = call["memory"], call["mask"]
        seen.append(
            AttentionCall(
                x=call["x"][:1].detach(),
                memory=None if memory is None else memory[:1].detach(),
                mask=None if mask is None else mask[:1].detach(),
                is_causal=bool(call["is_causal"]),
            )
        )

    return seen, module.register_forward_pre_hook(hook, with_kwargs=True)


@torch.no_grad()
def three_steps(
    attn: MultiHeadAttention, call: AttentionCall, head: int, token: int
) -> tuple[np.ndarray, ...]:
    """Scores, weights, values and output of query ``token`` of ``head`` in ``call``.

    The projections are ``attn``'s packed ``in_proj`` = [W_q; W_k; W_v]: W_q applies to the
    queries' input ``x``; W_k and W_v to the keys' input, ``x`` itself for self-attention and
    the encoder output ``memory`` for cross-attention.

    Returns:
        numpy arrays: scores (K,), weights (K,), values (K, Dh), output (Dh,)
    """
    D, H = attn.d_model, attn.n_heads
    W, b = attn.in_proj.weight, attn.in_proj.bias
    keys_input = call.x if call.memory is None else call.memory  # (1, K, D)
    q = F.linear(call.x[0, token], W[:D], b[:D])  # (D,)
    k = F.linear(keys_input[0], W[D : 2 * D], b[D : 2 * D])  # (K, D)
    v = F.linear(keys_input[0], W[2 * D :], b[2 * D :])  # (K, D)
    q = q.view(H, D // H)[head]  # (Dh,)
    k, v = (t.view(-1, H, D // H)[:, head] for t in (k, v))  # (K, Dh) each
    Q, K = call.x.size(1), k.size(0)
    allowed = torch.ones(K, dtype=torch.bool, device=k.device)  # (K,)
    if call.mask is not None:
        rows = call.mask[0].expand(H, Q, K)[head]  # (Q, K)
        allowed &= rows[token]
    if call.is_causal:
        allowed &= causal_mask(Q, K, device=k.device)[0, 0, token]  # keys 0..token only
    # Step 1: the query against every key, scaled by √d_k so the softmax stays soft.
    scores = (k @ q / math.sqrt(D // H)).masked_fill(~allowed, float("-inf"))  # (K,)
    # Step 2: softmax turns the scores into a distribution over the keys it may see.
    weights = torch.softmax(scores.float(), dim=-1).masked_fill(~allowed, 0.0)  # (K,)
    # Step 3: the weighted sum of the values.
    output = weights @ v.float()  # (Dh,)
    return tuple(t.float().cpu().numpy() for t in (scores, weights, v, output))


def explain_query(
    predictor: Predictor, text: str, kind: str, layer: int, head: int, token: int
) -> ThreeSteps:
    """Recompute query ``token`` of ``kind`` attention, layer ``layer``, head ``head``, on ``text``.

    Args:
        predictor: any job's loaded run (``qkv.jobs.load_run(run_dir)``).
        kind: ``"encoder"``, ``"decoder"`` or ``"cross"``; the run's model must have it.
    Returns:
        the three steps, beside the weights ``predictor.attention(text)`` reported.
    """
    if kind not in KIND_MODULES:
        raise InputError(f"--kind {kind!r}: choose one of {', '.join(KIND_MODULES)}")
    modules = attention_modules(predictor.model, kind)
    if not modules:
        has = [k for k in KIND_MODULES if attention_modules(predictor.model, k)]
        raise InputError(
            f"a {predictor.job} run has no {KIND_TITLES[kind]} to explain; "
            f"choose --kind {' or '.join(has) or 'of another run'}"
        )
    what = KIND_MODULES[kind][2]
    check_index(layer, len(modules), "--layer", what)
    attn = modules[layer]
    check_index(head, attn.n_heads, "--head", "heads")
    if not text.strip():
        raise InputError("the input is empty; give something to look at")
    seen, handle = _capture_calls(attn)
    try:
        attention = predictor.attention(text)
    finally:
        handle.remove()
    reported = attention.kind(kind)
    tokens = " ".join(reported.queries)
    check_index(token, len(reported.queries), "--token", f"tokens of '{tokens}'")
    if not seen:
        raise InputError(
            f"the {predictor.job} run never showed the input of its {KIND_TITLES[kind]} "
            f"in layer {layer}, so it cannot be recomputed"
        )
    scores, weights, values, output = three_steps(attn, seen[-1], head, token)
    return ThreeSteps(
        attention=attention,
        kind=kind,
        layer=layer,
        head=head,
        token=token,
        head_dim=values.shape[-1],
        scores=scores,
        weights=weights,
        values=values,
        output=output,
        model_weights=reported.weights[layer, head, token],
        queries=reported.queries,
        keys=reported.keys,
    )


def _bar(fraction: float, width: int = 20) -> str:
    """A horizontal bar of ``fraction`` (0..1) of ``width`` characters, in eighths."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    return "█" * full + ("" if rest == 0 else " ▏▎▍▌▋▊▉"[rest])


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


NOTES = {
    "encoder": "(* marks the query token itself)",
    "decoder": "(* marks the query token itself; the causal mask hides the keys after it: "
    "score -inf, weight 0)",
    "cross": "(the query is an output-side token; keys and values come from the source, "
    "through the encoder)",
}


def format_steps(steps: ThreeSteps) -> str:
    """A terminal table of the three steps: one row per key token."""
    a = steps.attention
    scale = math.sqrt(steps.head_dim)
    width = max(min(max(len(t) for t in steps.keys) + 2, 24), len("key token") + 2)
    lines = [
        f"input: {a.input}",
        f"output: {a.output}",
        f"{steps.title}, layer {steps.layer}, head {steps.head}: query token "
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
        mark = "*" if j == steps.token and steps.kind != "cross" else " "
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
        NOTES[steps.kind],
    ]
    return "\n".join(lines)
