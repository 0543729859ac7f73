"""Replaced-token detection (ELECTRA) as the encoder-only jobs' pretraining objective."""

import json
import random

import pytest
import torch

from qkv.cli import main
from qkv.config import ModelConfig
from qkv.data import FIRST_WORD_ID, PAD_ID
from qkv.jobs.classification import JOB, ClassifierSettings
from qkv.jobs.pretraining import (
    IGNORE,
    ReplacedTokenDetector,
    ReplacedTokenTask,
    mask_tokens,
    sample_words,
)

from ..helpers import assert_starts_from_pretrained

V = 40  # vocabulary, <mask> (V - 1) included
TINY = dict(src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=2, d_ff=64,
            n_encoder_layers=2, dropout=0.0)  # fmt: skip


def texts(n: int, seed: int) -> list[list[int]]:
    """Id sequences of a toy language: each word is followed by the next id, cycling."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        start, length = rng.randrange(FIRST_WORD_ID, V - 1), rng.randint(4, 10)
        words = [FIRST_WORD_ID + (start - FIRST_WORD_ID + i) % (V - 1 - FIRST_WORD_ID)
                 for i in range(length)]  # fmt: skip
        rows.append([1, *words, 2])
    return rows


def test_sampled_words_follow_the_softmax_as_torch_multinomial_draws_them():
    n = 40_000
    logits = torch.tensor([[5.0, 1.0, 0.5, 2.0, -1.0, 0.0, 9.0]]).repeat(n, 1)  # (n, 7)
    ids = sample_words(logits, 2, 6, torch.Generator().manual_seed(0))  # ids 2-5 only
    assert ids.shape == (n,) and ids.min() >= 2 and ids.max() <= 5
    expected = logits[0, 2:6].softmax(-1)
    reference = torch.multinomial(expected, n, True, generator=torch.Generator().manual_seed(1))
    for drawn in (ids - 2, reference):
        torch.testing.assert_close(
            torch.bincount(drawn, minlength=4) / n, expected, atol=0.01, rtol=0
        )
    # an id of probability 0 is never drawn, even at the ends of the range
    logits[:, 2] = logits[:, 5] = float("-inf")
    assert set(sample_words(logits, 2, 6, torch.Generator().manual_seed(2)).tolist()) == {3, 4}


def test_the_generator_is_smaller_and_shares_the_encoders_embedding():
    model = ReplacedTokenDetector(ModelConfig.preset("tiny", **TINY))
    assert len(model.generator.encoder.encoder.layers) == 1 < len(model.encoder.encoder.layers)
    shared = model.encoder.embed.token.weight
    assert model.generator.encoder.embed.token.weight is shared
    assert model.generator.output.weight is shared


def test_only_hidden_positions_are_replaced():
    torch.manual_seed(0)
    model = ReplacedTokenDetector(ModelConfig.preset("tiny", **TINY))
    batch = torch.tensor([[1, *range(5, 25), 2, PAD_ID, PAD_ID]] * 16)  # (B, S)
    inputs, targets = mask_tokens(batch, V - 1, 0.5, torch.Generator().manual_seed(1))
    logits, scores, replaced = model(inputs, targets, torch.Generator().manual_seed(2))
    chosen = targets != IGNORE
    assert logits.shape == (int(chosen.sum()), V) and scores.shape == batch.shape
    assert replaced.any() and not replaced[~chosen].any()
    _, _, again = model(inputs, targets, torch.Generator().manual_seed(2))
    torch.testing.assert_close(again, replaced)  # the same sample from the same generator


def test_sampled_words_are_never_special_ids_or_the_mask():
    torch.manual_seed(0)
    model = ReplacedTokenDetector(ModelConfig.preset("tiny", **TINY))
    with torch.no_grad():  # a generator that prefers the ids it must never give
        model.generator.output.bias.zero_()
        model.generator.output.bias[:FIRST_WORD_ID] = 30.0
        model.generator.output.bias[V - 1] = 30.0
    seen = []
    model.encoder.forward = lambda src: seen.append(src) or torch.zeros(*src.shape, 32)
    batch = torch.tensor([[1, *range(5, 25), 2]] * 8)
    inputs, targets = mask_tokens(batch, V - 1, 0.5, torch.Generator().manual_seed(1))
    model(inputs, targets)
    chosen = targets != IGNORE
    words = seen[0][chosen]
    assert ((words >= FIRST_WORD_ID) & (words < V - 1)).all()


def test_replaced_token_detection_learns_the_toy_language():
    torch.manual_seed(0)
    model = ReplacedTokenDetector(ModelConfig.preset("tiny", **TINY))
    task = ReplacedTokenTask(texts(200, 1), texts(40, 2), mask_id=V - 1, max_tokens=400)
    model.eval()
    with torch.no_grad():
        before = task.validate(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for epoch in range(40):
        for batch in task.train_batches(epoch, seed=0):
            loss, words = task.loss(model, batch)
            assert words == int((batch != PAD_ID).sum())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        after = task.validate(model)
    assert set(after) == set(task.metric_names)
    assert after["loss"] < 0.5 * before["loss"]
    assert after["accuracy"] > before["accuracy"] + 30  # the generator learned the next id
    assert after["detection_accuracy"] > before["detection_accuracy"] + 2


@pytest.fixture(scope="module")
def electra_run(tmp_path_factory):
    from .test_classification import TINY_OPTIONS, toy_sentiment, write

    folder = tmp_path_factory.mktemp("electra")
    data = write(folder / "train.tsv", toy_sentiment(200, 1), "tsv", "label\ttext")
    valid = write(folder / "valid.tsv", toy_sentiment(40, 2), "tsv", "label\ttext")
    out = folder / "run"
    options = ["--pretrain-objective", "electra", "--pretrain-steps", "4", "--max-tokens", "600"]
    paths = ["--train", str(data), "--valid", str(valid), "--out", str(out)]
    assert main(["train", "classifier", *paths, *TINY_OPTIONS, *options]) == 0
    return {"run": out, "train": data, "valid": valid, "folder": folder}


def test_a_classifier_pretrains_with_electra_and_logs_both_accuracies(electra_run):
    run = electra_run["run"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["pretraining"]["task"] == "replaced_token_detection"
    assert summary["pretraining"]["steps"] == 4
    header = (run / "pretrain" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"val_loss", "val_accuracy", "val_detection_accuracy"} <= set(header)
    config = json.loads((run / "config.json").read_text())
    assert config["settings"]["pretrain_objective"] == "electra"


def test_a_second_run_starts_from_the_electra_encoder(electra_run):
    from .test_classification import TINY_OPTIONS

    first, out = electra_run["run"], electra_run["folder"] / "second"
    paths = ["--train", str(electra_run["train"]), "--valid", str(electra_run["valid"])]
    args = ["train", "classifier", *paths, "--out", str(out), *TINY_OPTIONS]
    assert main([*args, "--pretrained", str(first)]) == 0
    settings = ClassifierSettings(pretrained=str(first))
    assert_starts_from_pretrained(JOB, settings, out, first, lambda m: m.encoder)


def test_an_unknown_objective_is_one_clear_error(capsys, tmp_path):
    args = ["train", "classifier", "--train", "x", "--valid", "y", "--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as stop:
        main([*args, "--pretrain-objective", "bert"])
    assert stop.value.code == 2
    assert "--pretrain-objective" in capsys.readouterr().err
