"""Peer decoders for the decoding comparison: Hugging Face MarianMT and CTranslate2.

Each gives, per beam size, a function that decodes the same sources forced to exactly ``n``
new tokens and returns how many tokens it produced.

Legend: B batch, S source length.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from qkv.data import EOS_ID, PAD_ID, SubwordTokenizer
from qkv.model import Transformer

Decoder = Callable[[int], Callable[[int], int]]  # beam size -> (round -> tokens produced)


def marian(vocab_size: int, src: torch.Tensor, n: int) -> Decoder:
    """A random Hugging Face MarianMT of qkv's post-norm ``small`` sizes, decoding ``src`` (B, S).

    Raises:
        ImportError: transformers is not installed (``pip install qkv[bench]``).
    """
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=vocab_size,
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        activation_function="relu",
        max_position_embeddings=512,
        scale_embedding=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=1,
        forced_eos_token_id=None,
    )
    torch.manual_seed(1)
    model = MarianMTModel(config).eval()
    mask = src.ne(PAD_ID).long()  # (B, S)

    def for_beam(beam: int) -> Callable[[int], int]:
        def run(_: int) -> int:
            out = model.generate(
                input_ids=src,
                attention_mask=mask,
                num_beams=beam,
                min_new_tokens=n,
                max_new_tokens=n,
                do_sample=False,
                early_stopping=beam > 1,
                length_penalty=1.0,
                use_cache=True,
            )  # (B, 1 + n): the decoder start, then the new tokens
            return out.size(0) * (out.size(1) - 1)

        return run

    return for_beam


def ctranslate2(
    model: Transformer,
    tokenizer: SubwordTokenizer,
    src_ids: list[list[int]],
    n: int,
    folder: Path,
    threads: int,
) -> dict[str, Decoder]:
    """CTranslate2 in float32 and int8 on qkv's own export of ``model`` into ``folder``.

    ``src_ids`` end in </s>, which the export appends itself, so it is left off here.

    Raises:
        ImportError: ctranslate2, or qkv's exporter, is not available.
    """
    import ctranslate2 as ct2

    from qkv.jobs.translation.export import export_ctranslate2

    export_ctranslate2(model, tokenizer, folder, quantization="float32", force=True)
    tokens = [tokenizer.token_strings(ids[:-1]) for ids in src_ids]
    decoders = {}
    for compute_type in ("float32", "int8"):
        engine = ct2.Translator(
            str(folder),
            device="cpu",
            compute_type=compute_type,
            intra_threads=threads,
            inter_threads=1,
        )

        def for_beam(beam: int, engine=engine) -> Callable[[int], int]:
            def run(_: int) -> int:
                results = engine.translate_batch(
                    tokens,
                    beam_size=beam,
                    length_penalty=1.0,
                    min_decoding_length=n,
                    max_decoding_length=n,
                )
                return sum(len(r.hypotheses[0]) for r in results)

            return run

        decoders[f"ctranslate2_{compute_type}"] = for_beam
    return decoders
