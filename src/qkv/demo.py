"""``qkv demo``: a translator trained in minutes on a generated language pair, then put to use."""

from __future__ import annotations

import time
from pathlib import Path

from qkv import checkpoint as ckpt
from qkv.config import ModelConfig
from qkv.jobs.run import run_job
from qkv.jobs.translation import JOB, TranslationSettings, Translator, corpus_scores
from qkv.synthetic import make_splits
from qkv.training import TrainConfig

# Sized to reach >= 95% exact match on held-out sentences within ~2.5 minutes on 2 CPU cores.
# No dropout and no label smoothing: the generated language is unambiguous and fresh data is
# plentiful, so there is nothing to regularise against.
DEMO_MODEL = dict(
    d_model=128,
    n_heads=4,
    d_ff=512,
    n_encoder_layers=2,
    n_decoder_layers=2,
    dropout=0.0,
    norm_first=True,
    share_embeddings=True,
    tie_output=True,
)
# fp32: at this width bf16 autocast costs more in casts than it saves in matmuls on a CPU.
DEMO_TRAIN = dict(
    max_steps=4000,
    lr=3e-3,
    warmup_steps=200,
    precision="fp32",
    eval_every=250,
    log_every=25,
)
DEMO_DATA = dict(vocab_size=1000, max_len=64, max_tokens=3000, label_smoothing=0.0)
DEMO_SPLITS = dict(n_train=30000, n_valid=300, n_test=1000)


def run_demo(
    out: Path, max_time: float = 150.0, seed: int = 1, progress: bool = True, force: bool = True
) -> dict:
    """Generate the data, train, score the held-out test set, print examples, write summary.json."""
    splits = make_splits(seed=seed, **DEMO_SPLITS)
    print(
        f"generated {len(splits['train'])} training pairs of a language pair whose word order "
        f"and inflection differ; training for up to {max_time:.0f} s"
    )
    config = ModelConfig.preset("tiny", **DEMO_MODEL)
    train = TrainConfig(out=str(out), max_time=max_time, seed=seed, progress=progress, **DEMO_TRAIN)
    started = time.monotonic()
    summary = run_job(
        JOB,
        TranslationSettings(**DEMO_DATA),
        config,
        train,
        force=force,
        data={"train": splits["train"], "valid": splits["valid"]},
    )
    translator = Translator.load(out, beam_size=1)
    test_src = [s for s, _ in splits["test"]]
    test_ref = [t for _, t in splits["test"]]
    hypotheses = translator.translate(test_src)
    scores = corpus_scores(hypotheses, test_ref)
    print("\nheld-out sentences:")
    for src, hyp, ref in list(zip(test_src, hypotheses, test_ref, strict=True))[:5]:
        mark = "ok" if hyp == ref else "differs from " + ref
        print(f"  {src}\n    -> {hyp}   [{mark}]")
    summary.update({f"test_{k}": round(v, 2) for k, v in scores.items()})
    summary.update(test_sentences=len(test_src), wall_seconds=round(time.monotonic() - started, 1))
    pictures = write_demo_pictures(out, test_src[0])
    summary["attention_pictures"] = [str(p) for p in pictures]
    ckpt.write_json(out / "summary.json", summary)
    print(
        f"\nexact match {scores['exact_match']:.1f}%, BLEU {scores['bleu']:.1f} on "
        f"{len(test_src)} held-out sentences; run folder {out} (summary.json)"
    )
    print(f"attention of {test_src[0]!r}, layer by layer (open the .html in a browser):")
    for path in pictures:
        print(f"  {path}")
    return summary


def write_demo_pictures(run_dir: Path, sentence: str) -> list[Path]:
    """Draw the trained translator's attention on ``sentence`` into ``run_dir``/attention.

    Returns:
        the PNG heatmaps (one per kind and layer) and the interactive page, attention.html.
    """
    from qkv.viz.attention import run_attention
    from qkv.viz.heatmaps import attention_pictures
    from qkv.viz.page import write_attention_page

    folder = Path(run_dir) / "attention"
    attention = run_attention(run_dir, sentence)
    paths = attention_pictures(attention, folder)
    return [*paths, write_attention_page(attention, folder / "attention.html")]
