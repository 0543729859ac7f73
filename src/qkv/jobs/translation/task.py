"""Translation for the ``Trainer``: teacher-forced batches, label-smoothed loss, validation BLEU.

Legend: B batch, S source length, T target length, V vocabulary size.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data import PAD_ID, SubwordDropout, SubwordTokenizer, hide_words, token_batches
from qkv.distributed import is_main_process
from qkv.errors import InputError
from qkv.jobs.translation.data import TranslationBatch, clean_pairs, make_translation_batch
from qkv.jobs.translation.predict import DecodeOptions, Translator, corpus_scores
from qkv.loss import smoothed_cross_entropy


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
        max_tokens: int,
        label_smoothing: float,
        valid_decode: DecodeOptions | None = None,
        bpe_dropout: float = 0.0,
        word_dropout: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.word_dropout = word_dropout
        self.max_tokens, self.label_smoothing = max_tokens, label_smoothing
        self.train_src = tokenizer.encode_batch([s for s, _ in train_pairs])
        self.train_tgt = tokenizer.encode_batch([t for _, t in train_pairs])
        self.bpe_dropout = bpe_dropout
        if bpe_dropout:
            # sources then targets: one split per distinct word and epoch covers both sides
            self.resplit = SubwordDropout(
                tokenizer, [s for s, _ in train_pairs] + [t for _, t in train_pairs]
            )
        self.valid_pairs = valid_pairs
        self.valid_decode = valid_decode or DecodeOptions(beam_size=1)

    def train_ids(self, epoch: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
        """Source and target ids of the training pairs for ``epoch``: split anew each epoch
        with BPE-dropout, else the tokenizer's one split."""
        if not self.bpe_dropout:
            return self.train_src, self.train_tgt
        ids = self.resplit.encode(self.bpe_dropout, seed * 100003 + epoch)
        return ids[: len(self.train_src)], ids[len(self.train_src) :]

    def train_batches(self, epoch: int, seed: int) -> list[TranslationBatch]:
        src, tgt = self.train_ids(epoch, seed)
        # +1 for </s> on either side: the longer side sets the padded width of a batch.
        lengths = [max(len(s), len(t)) + 1 for s, t in zip(src, tgt, strict=True)]
        batches = token_batches(lengths, self.max_tokens, shuffle=True, seed=seed, epoch=epoch)
        return [make_translation_batch([src[i] for i in b], [tgt[i] for i in b]) for b in batches]

    def loss(self, model: nn.Module, batch: TranslationBatch) -> tuple[Tensor, int]:
        """Label-smoothed cross-entropy per target token; padding is never scored. Source
        subwords become <unk> at ``word_dropout``.

        Only the N real target positions go through the output layer and the loss, so the
        largest matrix product of the step does no work on padding.
        """
        real = batch.tgt_out != PAD_ID  # (B, T)
        src = hide_words(batch.src, self.word_dropout)  # (B, S)
        logits = model(src, batch.tgt_in, select=real)  # (N, V)
        loss = smoothed_cross_entropy(logits, batch.tgt_out[real], self.label_smoothing)
        return loss / batch.n_tokens, batch.n_tokens

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Teacher-forced loss (no smoothing) and the scores of decoding the validation set."""
        translator = Translator(model, self.tokenizer, self.valid_decode)
        src = translator.encode_sources([s for s, _ in self.valid_pairs])
        tgt = self.tokenizer.encode_batch([t for _, t in self.valid_pairs])
        total, tokens = 0.0, 0
        for b in token_batches([len(s) for s in src], self.max_tokens, False, 0):
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
    if (counts["empty"] or counts["too_long"]) and is_main_process():
        print(
            f"{what}: skipped {counts['empty']} pairs with an empty side and "
            f"{counts['too_long']} over --max-len {max_len}; {counts['kept']} kept"
        )
    if not kept:
        raise InputError(f"{what}: no sentence pairs left to use")
    return kept
