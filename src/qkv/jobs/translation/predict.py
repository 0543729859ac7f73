"""A trained translator: decode with greedy or beam search, score with sacreBLEU and chrF.

Legend: B batch, S source length, T target length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from qkv.config import option
from qkv.data import BOS_ID, EOS_ID, PAD_ID, SubwordTokenizer, pad_batch, token_batches
from qkv.decoding import translate_ids
from qkv.errors import InputError
from qkv.jobs.base import Predictor
from qkv.model import Transformer
from qkv.viz.attention import AttentionKind, RunAttention


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """sacreBLEU (cased, detokenized, 13a), chrF and the share of exact matches."""
    exact = sum(h == r for h, r in zip(hypotheses, references, strict=True))
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
        "exact_match": 100.0 * exact / max(len(references), 1),
    }


ENGINES = ("qkv", "ctranslate2")
COMPUTE_TYPES = ("default", "int8", "float32", "int8_float32")


@dataclass
class DecodeOptions:
    """How ``Translator`` searches: beam 1 is greedy. The options of ``qkv translate``."""

    beam_size: int = option(4, "beam size; 1 is greedy", flag="--beam")
    length_penalty: float = option(
        1.0, "exponent alpha of the length normalisation score/len^alpha"
    )
    max_len_ratio: float = option(1.5, "longest output = ratio x source length + 10")
    max_len_add: int = option(10, cli=False)
    max_tokens: int = option(4096, "source tokens per decoding batch, padding included")
    engine: str = option(
        "qkv",
        "the decoder: qkv's own (PyTorch), or CTranslate2 (the run's `qkv export`, or one "
        "made at load time; needs `pip install qkv[ctranslate2]`)",
        choices=ENGINES,
    )
    compute_type: str = option(
        "default",
        "CTranslate2's weight and compute type (default: as exported)",
        choices=COMPUTE_TYPES,
    )

    def __post_init__(self) -> None:
        if self.engine not in ENGINES or self.compute_type not in COMPUTE_TYPES:
            raise InputError(
                f"--engine {self.engine} --compute-type {self.compute_type}: choose an engine "
                f"of {', '.join(ENGINES)} and a compute type of {', '.join(COMPUTE_TYPES)}"
            )
        if self.compute_type != "default" and self.engine != "ctranslate2":
            raise InputError(
                f"--compute-type {self.compute_type} applies to --engine ctranslate2 only"
            )
        if self.beam_size < 1:
            raise InputError(f"--beam {self.beam_size}: the beam size must be at least 1")
        if self.max_tokens < 1 or self.max_len_ratio <= 0:
            raise InputError(
                f"--max-tokens {self.max_tokens} and --max-len-ratio {self.max_len_ratio} "
                "must be positive"
            )


class Translator(Predictor):
    """A trained translation run: ``Translator.load(run_dir).translate(["..."])``."""

    job = "translation"

    def __init__(
        self,
        model: Transformer,
        tokenizer: SubwordTokenizer,
        options: DecodeOptions | None = None,
        settings: Any = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.options = options or DecodeOptions()
        self.settings = settings

    @property
    def max_positions(self) -> int:
        """The longest sequence the model's positional encoding holds."""
        return self.model.config.max_len

    def encode_sources(self, sentences: Sequence[str]) -> list[list[int]]:
        """Subword ids with </s>, cut to what the model's positions can hold."""
        limit = self.max_positions - 1
        return [ids[:limit] + [EOS_ID] for ids in self.tokenizer.encode_batch(list(sentences))]

    def translate_ids(self, sources: list[list[int]]) -> list[list[int]]:
        """Output ids per source, in input order, decoded in length-sorted batches.

        Batches never change a sentence's output: decoding masks padding and limits each
        sentence's length by its own source length.
        """
        o = self.options
        lengths = [len(s) for s in sources]
        results: list[list[int]] = [[] for _ in sources]
        for batch in token_batches(lengths, o.max_tokens, shuffle=False, seed=0):
            src = pad_batch([sources[i] for i in batch], PAD_ID).to(self.device)
            outputs = translate_ids(
                self.model,
                src,
                beam_size=o.beam_size,
                length_penalty=o.length_penalty,
                max_len_ratio=o.max_len_ratio,
                max_len_add=o.max_len_add,
            )
            for i, ids in zip(batch, outputs, strict=True):
                results[i] = ids
        return results

    def translate(self, sentences: Sequence[str]) -> list[str]:
        """Detokenized translations, one per sentence; an empty sentence gives ''."""
        todo = [i for i, s in enumerate(sentences) if s.strip()]
        outputs = [""] * len(sentences)
        ids = self.translate_ids(self.encode_sources([sentences[i] for i in todo]))
        for i, out in zip(todo, ids, strict=True):
            outputs[i] = self.tokenizer.decode(out)
        return outputs

    @torch.no_grad()
    def attention(self, text: str) -> RunAttention:
        """Translate ``text`` and collect every layer's and head's attention on the way.

        The kinds: encoder self-attention over the source subwords, decoder masked
        self-attention over ``<s>`` and the output subwords, and encoder-decoder attention.
        """
        src_ids = self.encode_sources([text])
        out_ids = self.translate_ids(src_ids)[0]
        src = torch.tensor(src_ids, device=self.device)  # (1, S)
        tgt = torch.tensor([[BOS_ID, *out_ids]], device=self.device)  # (1, T)
        maps = self.model.attention_maps(src, tgt)
        source = self.tokenizer.token_strings(src_ids[0])
        target = self.tokenizer.token_strings(tgt[0].tolist())
        weights = {k: maps[k][:, 0].float().cpu().numpy() for k in ("encoder", "decoder", "cross")}
        kinds = [
            AttentionKind("encoder", weights["encoder"], source, source),  # (L, H, S, S)
            AttentionKind("decoder", weights["decoder"], target, target),  # (L, H, T, T)
            AttentionKind("cross", weights["cross"], target, source),  # (L, H, T, S)
        ]
        return RunAttention(self.job, text, self.tokenizer.decode(out_ids), kinds)

    def predict_lines(self, lines: list[str], first_number: int = 1) -> list[str]:
        return self.translate(lines)

    def evaluate_data(self, data: str | None, out: Path | None) -> dict[str, Any]:
        """BLEU, chrF and exact matches on ``data`` (default: the run's validation data)."""
        from qkv.jobs.translation.data import read_pairs

        settings = self.settings
        path = data or settings.valid
        pairs = read_pairs(path, settings.source_lang, settings.target_lang, "--data")
        scores = self.evaluate([s for s, _ in pairs], [t for _, t in pairs])
        return {
            "data": str(path),
            **scores,
            "sentences": len(pairs),
            "beam": self.options.beam_size,
            "length_penalty": self.options.length_penalty,
        }

    def evaluate(self, sources: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        if len(sources) != len(references):
            raise InputError(f"{len(sources)} sources but {len(references)} references")
        return corpus_scores(self.translate(sources), list(references))
