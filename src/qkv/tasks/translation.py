"""Machine translation: train on parallel text, translate, evaluate with sacreBLEU and chrF.

Legend: B batch, S source length, T target length, V vocabulary size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sacrebleu
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv import checkpoint as ckpt
from qkv.config import ModelConfig
from qkv.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SubwordTokenizer,
    TranslationBatch,
    clean_pairs,
    make_translation_batch,
    pad_batch,
    token_batches,
)
from qkv.decoding import translate_ids
from qkv.distributed import main_process_first
from qkv.errors import InputError
from qkv.model import Transformer
from qkv.training import TrainConfig, Trainer

TOKENIZER = "tokenizer.json"


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """sacreBLEU (cased, detokenized, 13a), chrF and the share of exact matches."""
    exact = sum(h == r for h, r in zip(hypotheses, references, strict=True))
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
        "exact_match": 100.0 * exact / max(len(references), 1),
    }


@dataclasses.dataclass
class DecodeOptions:
    """How ``Translator`` searches: beam 1 is greedy."""

    beam_size: int = 4
    length_penalty: float = 1.0
    max_len_ratio: float = 1.5
    max_len_add: int = 10
    max_tokens: int = 4096  # source tokens per decoding batch


class Translator:
    """A trained translation run: ``Translator.load(run_dir).translate(["..."])``."""

    def __init__(
        self, model: Transformer, tokenizer: SubwordTokenizer, options: DecodeOptions | None = None
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.options = options or DecodeOptions()

    @classmethod
    def load(
        cls, run_dir: str | Path, device: str | torch.device = "cpu", **options: Any
    ) -> Translator:
        run_dir = Path(run_dir)
        config = ckpt.read_run_config(run_dir)
        if config.get("task") != "translation":
            raise InputError(f"{run_dir}: a {config.get('task')!r} run, not a translation run")
        model = Transformer(ModelConfig.from_dict(config["model"]))
        ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
        tokenizer = SubwordTokenizer.load(run_dir / TOKENIZER)
        return cls(model.to(device), tokenizer, DecodeOptions(**options))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode_sources(self, sentences: Sequence[str]) -> list[list[int]]:
        """Subword ids with </s>, cut to what the model's positions can hold."""
        limit = self.model.config.max_len - 1
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

    def attention_maps(self, sentence: str) -> dict[str, Any]:
        """Translate ``sentence`` and collect every layer's and head's attention on the way.

        Returns:
            ``{"src_tokens": [S], "tgt_tokens": [T] (<s> then the output subwords),
            "encoder": (L, H, S, S), "decoder": (L, H, T, T), "cross": (L, H, T, S),
            "output": the translation}``
        """
        src_ids = self.encode_sources([sentence])
        out_ids = self.translate_ids(src_ids)[0]
        src = torch.tensor(src_ids, device=self.device)  # (1, S)
        tgt = torch.tensor([[BOS_ID, *out_ids]], device=self.device)  # (1, T)
        maps = self.model.attention_maps(src, tgt)
        return {
            "src_tokens": self.tokenizer.token_strings(src_ids[0]),
            "tgt_tokens": self.tokenizer.token_strings(tgt[0].tolist()),
            **{kind: maps[kind][:, 0].float().cpu() for kind in ("encoder", "decoder", "cross")},
            "output": self.tokenizer.decode(out_ids),
        }

    def evaluate(self, sources: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        if len(sources) != len(references):
            raise InputError(f"{len(sources)} sources but {len(references)} references")
        return corpus_scores(self.translate(sources), list(references))


class TranslationTask:
    """Batches, loss and validation of translation for the ``Trainer``."""

    name = "translation"
    metric = "bleu"
    metric_names = ("loss", "bleu", "chrf", "exact_match")

    def __init__(
        self,
        tokenizer: SubwordTokenizer,
        train_pairs: list[tuple[str, str]],
        valid_pairs: list[tuple[str, str]],
        config: TrainConfig,
        valid_decode: DecodeOptions | None = None,
    ) -> None:
        self.tokenizer, self.config = tokenizer, config
        self.train_src = tokenizer.encode_batch([s for s, _ in train_pairs])
        self.train_tgt = tokenizer.encode_batch([t for _, t in train_pairs])
        # +1 for </s> on either side: the longer side sets the padded width of a batch.
        self.lengths = [
            max(len(s), len(t)) + 1 for s, t in zip(self.train_src, self.train_tgt, strict=True)
        ]
        self.valid_pairs = valid_pairs
        self.valid_decode = valid_decode or DecodeOptions(beam_size=1)

    def train_batches(self, epoch: int, seed: int) -> list[TranslationBatch]:
        batches = token_batches(
            self.lengths, self.config.max_tokens, shuffle=True, seed=seed, epoch=epoch
        )
        return [
            make_translation_batch([self.train_src[i] for i in b], [self.train_tgt[i] for i in b])
            for b in batches
        ]

    def loss(self, model: nn.Module, batch: TranslationBatch) -> tuple[Tensor, int]:
        """Label-smoothed cross-entropy per target token, padding ignored."""
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(),
            batch.tgt_out.flatten(),
            ignore_index=PAD_ID,
            label_smoothing=self.config.label_smoothing,
            reduction="sum",
        )
        return loss / batch.n_tokens, batch.n_tokens

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Teacher-forced loss (no smoothing) and the scores of decoding the validation set."""
        translator = Translator(model, self.tokenizer, self.valid_decode)
        src = translator.encode_sources([s for s, _ in self.valid_pairs])
        tgt = self.tokenizer.encode_batch([t for _, t in self.valid_pairs])
        total, tokens = 0.0, 0
        for b in token_batches([len(s) for s in src], self.config.max_tokens, False, 0):
            batch = make_translation_batch([src[i][:-1] for i in b], [tgt[i] for i in b])
            batch = batch.to(translator.device)
            logits = model(batch.src, batch.tgt_in)
            total += F.cross_entropy(
                logits.flatten(0, 1).float(),
                batch.tgt_out.flatten(),
                ignore_index=PAD_ID,
                reduction="sum",
            ).item()
            tokens += batch.n_tokens
        hypotheses = [translator.tokenizer.decode(ids) for ids in translator.translate_ids(src)]
        scores = corpus_scores(hypotheses, [t for _, t in self.valid_pairs])
        return {"loss": total / max(tokens, 1), **scores}


def prepare_pairs(
    pairs: list[tuple[str, str]], tokenizer: SubwordTokenizer, max_len: int, what: str
) -> list[tuple[str, str]]:
    """Drop empty pairs and pairs longer than ``max_len`` subwords, saying how many."""
    kept, counts = clean_pairs(pairs, max_len, lambda text: len(tokenizer.encode(text)))
    if counts["empty"] or counts["too_long"]:
        print(
            f"{what}: skipped {counts['empty']} pairs with an empty side and "
            f"{counts['too_long']} over --max-len {max_len}; {counts['kept']} kept"
        )
    if not kept:
        raise InputError(f"{what}: no sentence pairs left to use")
    return kept


def train_translation(
    train_pairs: list[tuple[str, str]],
    valid_pairs: list[tuple[str, str]],
    model_config: ModelConfig,
    train_config: TrainConfig,
    vocab_size: int,
    max_len: int = 128,
    resume: bool = False,
) -> dict[str, Any]:
    """Train a subword tokenizer and a Transformer into ``train_config.out``; return the summary.

    The tokenizer is one joint vocabulary of source and target, so embeddings can be shared.
    """
    run_dir = Path(train_config.out)
    if resume:
        tokenizer = SubwordTokenizer.load(run_dir / TOKENIZER)
        model_config = ModelConfig.from_dict(ckpt.read_run_config(run_dir)["model"])
    else:

        def train_tokenizer() -> SubwordTokenizer:
            texts = [s for s, _ in train_pairs] + [t for _, t in train_pairs]
            tokenizer = SubwordTokenizer.train(texts, vocab_size)
            tokenizer.save(run_dir / TOKENIZER)
            return tokenizer

        tokenizer = main_process_first(
            train_tokenizer, then=lambda: SubwordTokenizer.load(run_dir / TOKENIZER)
        )
        model_config = dataclasses.replace(
            model_config,
            src_vocab_size=tokenizer.vocab_size,
            tgt_vocab_size=tokenizer.vocab_size,
            pad_id=PAD_ID,
            max_len=max(model_config.max_len, 2 * max_len + 16),
        )
    train_pairs = prepare_pairs(train_pairs, tokenizer, max_len, "training data")
    valid_pairs = prepare_pairs(valid_pairs, tokenizer, max_len, "validation data")
    task = TranslationTask(tokenizer, train_pairs, valid_pairs, train_config)
    torch.manual_seed(train_config.seed)  # --seed decides the initial weights too
    model = Transformer(model_config)
    trainer = Trainer(
        task,
        model,
        train_config,
        {
            "task": "translation",
            "model": model_config.to_dict(),
            "data": {"vocab_size": tokenizer.vocab_size, "max_len": max_len},
        },
        resume=resume,
    )
    summary = trainer.fit()
    if trainer.is_main:
        ckpt.write_json(run_dir / "summary.json", summary)
    return summary
