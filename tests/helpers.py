"""Small generated data and runs shared by the tests."""

from __future__ import annotations

from pathlib import Path

from qkv.config import ModelConfig
from qkv.synthetic import make_splits, write_parallel
from qkv.training import TrainConfig

TINY_MODEL = dict(
    d_model=32,
    n_heads=2,
    d_ff=64,
    n_encoder_layers=1,
    n_decoder_layers=1,
    dropout=0.1,
    share_embeddings=True,
    tie_output=True,
)


def tiny_pairs(n_train: int = 200, n_valid: int = 20, seed: int = 0):
    return make_splits(n_train, n_valid, 20, seed=seed)


def write_splits(folder: Path, n_train: int = 200, n_valid: int = 20) -> dict[str, Path]:
    """train.src/.tgt, valid.src/.tgt, test.src/.tgt in ``folder``; returns their paths."""
    paths = {}
    for name, pairs in tiny_pairs(n_train, n_valid).items():
        src, tgt = folder / f"{name}.src", folder / f"{name}.tgt"
        write_parallel(pairs, src, tgt)
        paths[f"{name}_src"], paths[f"{name}_tgt"] = src, tgt
    return paths


def tiny_model_config(**overrides) -> ModelConfig:
    return ModelConfig.preset("tiny", **{**TINY_MODEL, **overrides})


def tiny_train_config(out: Path, **overrides) -> TrainConfig:
    values = dict(
        out=str(out),
        max_steps=6,
        eval_every=3,
        log_every=1,
        warmup_steps=2,
        lr=3e-3,
        progress=False,
        precision="fp32",
    )
    return TrainConfig(**{**values, **overrides})


def tiny_translation_settings(**overrides):
    """Settings of a translation run on data given from Python (``run_job(..., data=)``)."""
    from qkv.jobs.translation import TranslationSettings

    return TranslationSettings(**{"vocab_size": 200, "max_len": 40, "max_tokens": 400, **overrides})


def train_tiny_translation(
    out: Path, data=None, settings=None, resume: bool = False, **train_overrides
):
    """Train a tiny translator on ``tiny_pairs`` (or ``data``) through ``run_job``."""
    from qkv.jobs.run import run_job
    from qkv.jobs.translation import JOB

    if data is None:
        splits = tiny_pairs()
        data = {"train": splits["train"], "valid": splits["valid"]}
    return run_job(
        JOB,
        settings or tiny_translation_settings(),
        tiny_model_config(),
        tiny_train_config(out, **train_overrides),
        data=data,
        resume=resume,
    )


def train_translation_args(paths: dict[str, Path], out: Path, *options: object) -> list[str]:
    """`qkv train translation` on the files of ``write_splits``, then ``options``."""
    prefix = str(paths["train_src"])[: -len(".src")]
    valid = str(paths["valid_src"])[: -len(".src")]
    return [
        "train",
        "translation",
        "--train",
        prefix,
        "--valid",
        valid,
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--out",
        str(out),
        "--no-progress",
        "--precision",
        "fp32",
        *map(str, options),
    ]


def write_conllu(path: Path, n: int = 40, seed: int = 0) -> Path:
    """A small CoNLL-U file of toy sentences: DET ADJ? NOUN VERB DET NOUN PUNCT."""
    import random

    rng = random.Random(seed)
    words = {
        "DET": ["the", "a"],
        "ADJ": ["big", "red", "old"],
        "NOUN": ["dog", "cat", "tree", "car"],
        "VERB": ["sees", "likes"],
        "PUNCT": ["."],
    }
    blocks = []
    for i in range(n):
        tags = ["DET", *(["ADJ"] if rng.random() < 0.5 else []), "NOUN", "VERB", "DET", "NOUN"]
        tags.append("PUNCT")
        rows = [
            f"{k}\t{rng.choice(words[t])}\t_\t{t}\t_\t_\t_\t_\t_\t_" for k, t in enumerate(tags, 1)
        ]
        blocks.append(f"# sent_id = {i}\n" + "\n".join(rows) + "\n")
    path.write_text("\n".join(blocks), encoding="utf-8")
    return path


def write_labeled(path: Path, n: int = 40, seed: int = 0) -> Path:
    """label<TAB>text lines whose label follows from a word of the text."""
    import random

    rng = random.Random(seed)
    good, bad = ["fine", "great", "lovely"], ["dull", "poor", "awful"]
    lines = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        word = rng.choice(good if label == "pos" else bad)
        lines.append(f"{label}\ta {word} film with a {rng.choice(['plot', 'cast'])}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def assert_starts_from_pretrained(job, settings, run: Path, pretrained: Path, encoder_of) -> None:
    """``job``'s model of ``run`` holds, before fine-tuning, the encoder ``pretrained`` learned.

    ``encoder_of(model)`` is the job's ``EncoderModel`` inside its model.
    """
    import json

    import torch

    from qkv.checkpoint import load_weights, read_run_config
    from qkv.jobs.pretraining import pretraining_model

    sizes = json.loads((run / "config.json").read_text())["model"]
    prepared = job.load_prepared(settings, run)
    model = job.build_model(ModelConfig.from_dict(sizes), settings, prepared)
    assert job.before_fit(model, settings, prepared, None, None) == {"pretraining": None}
    task = read_run_config(pretrained / "pretrain")["task"]
    language_model = pretraining_model(task, model.config)
    load_weights(language_model, pretrained / "pretrain" / "model.safetensors")
    for name, value in language_model.encoder.state_dict().items():
        torch.testing.assert_close(encoder_of(model).state_dict()[name], value)
