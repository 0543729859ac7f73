"""Decoding: encode the source once, then greedy or beam search over the KV-cached decoder.

Batched, yet each sentence decodes to the same ids alone or in any batch: source padding is
masked, a sentence's length limit depends on its own length only, and a finished sentence is
fed tokens whose results are thrown away.

Legend: B batch, S source length, T target length, V vocabulary size, K beam size, D model width.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.attention import padding_mask
from qkv.model import Transformer


def prefill(model: Transformer, src: Tensor, pad_id: int | None = None) -> tuple[Tensor, Tensor]:
    """Encode the source once for all decoding steps.

    Args:
        src: (B, S) source ids, right-padded.
        pad_id: the padding id; ``model.config.pad_id`` when None.
    Returns:
        (memory (B, S, D), src_mask (B, 1, 1, S) bool, True = real token)
    """
    src_mask = model.src_mask(src) if pad_id is None else padding_mask(src, pad_id)
    return model.encode(src, src_mask), src_mask


def decode_step(
    model: Transformer, tokens: Tensor, memory: Tensor, src_mask: Tensor, normalize: bool = True
) -> Tensor:
    """One cached decoder step: the newest tokens (B, 1) -> fp32 log-probs (B, V) of the next.

    Needs ``model.setup_cache`` first; earlier positions come from the cache.
    ``normalize=False`` returns the logits: their argmax is the log-probs' (greedy search).
    """
    logits = model.decode(tokens, memory, src_mask)[:, -1].float()  # (B, V)
    return F.log_softmax(logits, dim=-1) if normalize else logits


def max_lengths(
    model: Transformer, src: Tensor, max_len_ratio: float, max_len_add: int, pad_id: int
) -> Tensor:
    """The most output tokens of each sentence: int(len * ratio) + add, within the model's reach.

    Returns:
        (B,) long; counts the eos, and the source length counts only that sentence's tokens.
    """
    src_len = src.ne(pad_id).sum(dim=1).double()  # float64 so that it rounds as Python's int()
    limits = (src_len * max_len_ratio).floor().long() + max_len_add
    # bos and the output then fit in the max_len positions the model is built for.
    return limits.clamp(min=0, max=model.config.max_len - 1)


def _forbid(log_probs: Tensor, ids: tuple[int, ...]) -> Tensor:
    """log_probs (or logits) (N, V) with the ``ids`` columns at -inf: never chosen.

    In place: the log-probs of a step are fresh, so no (N, V) copy is needed.
    """
    index = torch.tensor(ids, device=log_probs.device)
    return log_probs.index_fill_(1, index, float("-inf"))


def _trim(tokens: Tensor, lengths: Tensor) -> list[list[int]]:
    """(B, T) ids and (B,) lengths -> the first ``length`` ids of each row."""
    return [row[:n].tolist() for row, n in zip(tokens, lengths.tolist(), strict=True)]


@torch.inference_mode()
def greedy_search(
    model: Transformer,
    src: Tensor,
    max_len_ratio: float = 1.5,
    max_len_add: int = 10,
    bos_id: int = 1,
    eos_id: int = 2,
    pad_id: int = 0,
    min_len: int = 0,
) -> list[list[int]]:
    """Pick the most probable next token until eos or the sentence's length limit.

    Args:
        src: (B, S) source ids, right-padded with ``pad_id``.
        min_len: eos is never chosen before this many tokens (a benchmark forces exactly N
            new tokens with ``max_len_ratio=0, max_len_add=N, min_len=N``).
    Returns:
        per sentence, the output ids without bos and eos (at most ``max_lengths`` of them).
    """
    B = src.size(0)
    limits = max_lengths(model, src, max_len_ratio, max_len_add, pad_id)  # (B,)
    steps = int(limits.max()) if B else 0
    lengths = limits.clone()
    out = src.new_full((B, steps), pad_id)  # (B, T)
    if steps == 0:
        return _trim(out, lengths)
    memory, src_mask = prefill(model, src, pad_id)
    tokens = src.new_full((B, 1), bos_id)
    finished = limits.eq(0)
    model.setup_cache(B, steps)
    try:
        for t in range(steps):
            forbidden = (bos_id, pad_id, eos_id) if t < min_len else (bos_id, pad_id)
            logits = decode_step(model, tokens, memory, src_mask, normalize=False)
            next_tokens = _forbid(logits, forbidden).argmax(dim=-1)  # (B,)
            ended = next_tokens.eq(eos_id) & ~finished
            lengths = torch.where(ended, t, lengths)
            next_tokens = next_tokens.masked_fill(finished, pad_id)
            out[:, t] = next_tokens
            finished = finished | ended | (t + 1 >= limits)
            if bool(finished.all()):
                break
            tokens = next_tokens[:, None]  # (B, 1)
    finally:
        model.remove_cache()
    return _trim(out, lengths)


class _Finished(NamedTuple):
    """The best finished hypothesis of each sentence, and how many have finished."""

    score: Tensor  # (B,) normalised score of the best
    tokens: Tensor  # (B, T) its ids, eos included
    length: Tensor  # (B,) its length without eos
    count: Tensor  # (B,) finished hypotheses so far; the sentence is done at K


def _finish(
    finished: _Finished,
    cand_scores: Tensor,
    cand_history: Tensor,
    t: int,
    at_limit: Tensor,
    eos_id: int,
    length_penalty: float,
) -> _Finished:
    """Take the finishing candidates of step ``t`` into ``finished``.

    Only the top K candidates may finish (they end in eos, or every one does at the sentence's
    length limit), best first, until the sentence has K. Those of -inf score extend beams that
    do not exist yet (first steps, tiny vocabularies) and never finish. All have t + 1 tokens,
    so the best of them is the first taken.

    Args:
        cand_scores: (B, 2K) summed log-probs, best first.
        cand_history: (B, 2K, T) the candidates' ids, the new one at ``t``.
        at_limit: (B,) bool, the sentence reaches its length limit at this step.
    """
    K = cand_scores.size(1) // 2
    new_tokens = cand_history[:, :, t]  # (B, 2K)
    finishing = (new_tokens.eq(eos_id) | at_limit[:, None]) & cand_scores.isfinite()
    finishing[:, K:] = False
    taken = finishing & (finishing.cumsum(dim=1) <= K - finished.count[:, None])
    first = taken.long().argmax(dim=1)  # (B,) index of the first taken candidate
    rows = torch.arange(first.size(0), device=first.device)
    score = cand_scores[rows, first] / (t + 1) ** length_penalty
    better = taken.any(dim=1) & (score > finished.score)
    length = t + 1 - new_tokens[rows, first].eq(eos_id).long()
    return _Finished(
        score=torch.where(better, score, finished.score),
        tokens=torch.where(better[:, None], cand_history[rows, first], finished.tokens),
        length=torch.where(better, length, finished.length),
        count=finished.count + taken.sum(dim=1),
    )


def _extend(
    scores: Tensor, history: Tensor, log_probs: Tensor, t: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The best 2K one-token extensions of each sentence's K beams, best first.

    Args:
        scores: (B, K) summed log-probs of the beams.
        history: (B, K, T) their ids so far.
        log_probs: (B, K, V) of their next token.
    Returns:
        (scores (B, 2K), the beam each extends (B, 2K), ids (B, 2K, T) with the new one at ``t``)
    """
    B, K, V = log_probs.shape
    cand_scores, flat = (scores[:, :, None] + log_probs).view(B, K * V).topk(2 * K)
    beam = flat // V  # (B, 2K)
    cand_history = history.gather(1, beam[:, :, None].expand(-1, -1, history.size(2))).clone()
    cand_history[:, :, t] = flat % V
    return cand_scores, beam, cand_history


def _first_alive(cand_tokens: Tensor, eos_id: int, beam_size: int) -> Tensor:
    """(B, 2K) candidate ids -> (B, K) positions of the best K that do not end in eos.

    Each beam has one eos candidate, so at least K of the 2K candidates are not eos.
    """
    rank = torch.arange(cand_tokens.size(1), device=cand_tokens.device)  # (2K,)
    order = rank + cand_tokens.eq(eos_id).long() * cand_tokens.size(1)  # eos ones go last
    return order.argsort(dim=1)[:, :beam_size]


@torch.inference_mode()
def beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    max_len_ratio: float = 1.5,
    max_len_add: int = 10,
    bos_id: int = 1,
    eos_id: int = 2,
    pad_id: int = 0,
    min_len: int = 0,
) -> list[list[int]]:
    """Batched beam search: K beams per sentence, B * K rows in the KV cache.

    Beams are ranked by their summed log-probs; at each step the best 2K extensions are
    scored, those among the top K that end in eos finish, and the best K others go on. A
    sentence is done with K finished hypotheses (or at its length limit, where the top K all
    finish), and returns the one with the best ``score / len ** length_penalty``, len counting
    eos. ``length_penalty=0`` ranks by the summed log-probs; ``beam_size=1`` is greedy search.

    Args:
        src: (B, S) source ids, right-padded with ``pad_id``.
        min_len: eos is never chosen before this many tokens (as in ``greedy_search``).
    Returns:
        per sentence, the best hypothesis's ids without bos and eos.
    """
    B, K = src.size(0), beam_size
    limits = max_lengths(model, src, max_len_ratio, max_len_add, pad_id)  # (B,)
    steps = int(limits.max()) if B else 0
    finished = _Finished(
        torch.full((B,), float("-inf"), device=src.device),
        src.new_full((B, steps), pad_id),
        torch.zeros_like(limits),
        torch.where(limits.eq(0), K, 0),  # nothing to decode: done from the start
    )
    if steps == 0:
        return _trim(finished.tokens, finished.length)
    memory, src_mask = prefill(model, src, pad_id)
    memory, src_mask = memory.repeat_interleave(K, 0), src_mask.repeat_interleave(K, 0)
    scores = torch.full((B, K), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # one live beam to start, so the first step has K different tokens
    history = src.new_full((B, K, steps), pad_id)  # (B, K, T)
    tokens = src.new_full((B * K, 1), bos_id)
    offsets = torch.arange(B, device=src.device)[:, None] * K  # (B, 1) first row of each sentence
    model.setup_cache(B * K, steps)
    try:
        for t in range(steps):
            forbidden = (bos_id, pad_id, eos_id) if t < min_len else (bos_id, pad_id)
            log_probs = _forbid(decode_step(model, tokens, memory, src_mask), forbidden)
            cand_scores, beam, cand_history = _extend(scores, history, log_probs.view(B, K, -1), t)
            finished = _finish(
                finished, cand_scores, cand_history, t, t + 1 >= limits, eos_id, length_penalty
            )
            if bool(finished.count.ge(K).all()):
                break
            alive = _first_alive(cand_history[:, :, t], eos_id, K)  # (B, K)
            scores = cand_scores.gather(1, alive)
            history = cand_history.gather(1, alive[:, :, None].expand(-1, -1, steps))
            # Beams only trade places within their sentence: the source side stays put.
            model.reorder_cache((beam.gather(1, alive) + offsets).view(B * K), same_source=True)
            tokens = history[:, :, t].reshape(B * K, 1)
    finally:
        model.remove_cache()
    return _trim(finished.tokens, finished.length)


def translate_ids(
    model: Transformer, src: Tensor, beam_size: int = 1, **kwargs: Any
) -> list[list[int]]:
    """Decode ``src`` (B, S) in eval mode: greedy for ``beam_size=1``, else beam search.

    ``kwargs`` go to ``greedy_search`` or ``beam_search`` (greedy ignores ``length_penalty``).
    The model's training flag is restored afterwards.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size} must be at least 1")
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            if beam_size == 1:
                kwargs.pop("length_penalty", None)
                return greedy_search(model, src, **kwargs)
            return beam_search(model, src, beam_size=beam_size, **kwargs)
    finally:
        model.train(was_training)
