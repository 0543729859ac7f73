"""Sentence classification: readers, pooling, training, the Classifier, and its commands."""

import io
import json
import random

import pytest
import torch

from qkv.cli import main
from qkv.config import ModelConfig
from qkv.errors import InputError
from qkv.labeled_text import LabeledTexts, read_labeled
from qkv.tasks.classification import (
    Classifier,
    ClassifierOptions,
    MaskedLanguageModel,
    SequenceClassifier,
    mask_tokens,
    pool,
    train_classifier,
)

from .helpers import tiny_train_config

POSITIVE = "good great superb lovely brilliant charming".split()
NEGATIVE = "bad awful dull boring terrible clumsy".split()
FILLER = "the film plot cast story was is a very quite and this it of".split()
TINY = dict(d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1, dropout=0.0)


def toy_sentiment(n: int, seed: int) -> list[tuple[str, str]]:
    """(label, text): the label is which word list the text's one or two opinion words are from."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = rng.choices(FILLER, k=rng.randint(3, 7))
        words += rng.choices(POSITIVE if label == "pos" else NEGATIVE, k=rng.randint(1, 2))
        rng.shuffle(words)
        pairs.append((label, " ".join(words)))
    return pairs


def write(path, pairs, fmt, header=None):
    sep = {"tsv": "\t", "csv": ",", "sst2": " "}[fmt]
    lines = ([header] if header else []) + [f"{label}{sep}{text}" for label, text in pairs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("classification")
    return {
        "folder": folder,
        "train": write(folder / "train.tsv", toy_sentiment(400, 1), "tsv", "label\ttext"),
        "valid": write(folder / "valid.tsv", toy_sentiment(60, 2), "tsv", "label\ttext"),
    }


def train_config(out, **overrides):
    values = dict(max_steps=40, eval_every=20, max_tokens=600, warmup_steps=5, lr=3e-3)
    return tiny_train_config(out, **{**values, **overrides})


@pytest.fixture(scope="module")
def python_run(data):
    out = data["folder"] / "python_run"
    torch.manual_seed(0)
    summary = train_classifier(
        read_labeled(data["train"]),
        read_labeled(data["valid"]),
        ModelConfig.preset("tiny", **TINY),
        train_config(out),
        ClassifierOptions(pooling="mean", vocab_size=120),
    )
    return out, summary


@pytest.fixture(scope="module")
def cli_run(data):
    out = data["folder"] / "cli_run"
    code = main(
        ["train", "classifier", "--train", str(data["train"]), "--valid", str(data["valid"]),
         "--out", str(out), "--pooling", "cls", "--preset", "tiny", "--d-model", "32",
         "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1", "--vocab-size", "120",
         "--max-steps", "40", "--eval-every", "20", "--warmup-steps", "5", "--lr", "3e-3",
         "--max-tokens", "600", "--precision", "fp32", "--no-progress", "--word-dropout",
         "0.1", "--pretrain-steps", "4", "--unlabeled", str(data["valid"])]
    )  # fmt: skip
    assert code == 0
    return out


# ---------------------------------------------------------------- reading


@pytest.mark.parametrize(
    ("name", "fmt", "header"),
    [
        ("a.tsv", "tsv", "label\ttext"),
        ("a.tsv", "tsv", None),
        ("a.csv", "csv", "label,sentence"),
        ("a.txt", "csv", None),
        ("a.txt", "sst2", None),
        ("a.txt", "tsv", "Label\tText"),
    ],
)
def test_formats_are_detected_and_read(tmp_path, name, fmt, header):
    pairs = [("1", "a fine film"), ("0", "dull , flat"), ("1", "moving")]
    if fmt == "csv":  # the comma inside the text is kept as text
        pairs[1] = ("0", '"dull, flat"')
    data = read_labeled(write(tmp_path / name, pairs, fmt, header))
    assert data.labels == ["1", "0", "1"]
    assert data.texts[0] == "a fine film" and data.texts[2] == "moving"
    assert data.texts[1] == ("dull, flat" if fmt == "csv" else "dull , flat")
    assert data.lines == ([2, 3, 4] if header else [1, 2, 3])


def test_header_with_the_text_first_swaps_the_columns(tmp_path):
    path = tmp_path / "glue.tsv"
    path.write_text("sentence\tlabel\na fine film\t1\n\nso dull\t0\n", encoding="utf-8")
    data = read_labeled(path)
    assert (data.labels, data.texts, data.lines) == (["1", "0"], ["a fine film", "so dull"], [2, 4])


def test_forced_format_reads_sst2_lines(tmp_path):
    path = write(tmp_path / "x.tsv", [("1", "a b c")], "sst2")
    assert read_labeled(path, "sst2").texts == ["a b c"]


@pytest.mark.parametrize(
    ("text", "fmt", "line"),
    [
        ("pos\tgood\nno tab here\n", "tsv", 2),
        ("1 good\n0\n", "sst2", 2),
        ("label\ttext\npos\t\n", "tsv", 2),
        ('pos,good\nneg,"bad\n', "csv", 2),
    ],
)
def test_a_bad_line_names_file_and_line(tmp_path, text, fmt, line):
    path = tmp_path / "bad.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=f"bad.txt:{line}: ") as error:
        read_labeled(path, fmt)
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------- model pieces


def test_mean_pooling_ignores_padding_and_cls_takes_position_0():
    states = torch.randn(2, 4, 3)
    real = torch.tensor([[True, True, False, False], [True, True, True, True]])
    pooled = pool(states, real, "mean")
    torch.testing.assert_close(pooled[0], states[0, :2].mean(0))
    torch.testing.assert_close(pooled[1], states[1].mean(0))
    torch.testing.assert_close(pool(states, real, "cls"), states[:, 0])


def test_padding_does_not_change_a_texts_logits():
    config = ModelConfig.preset("tiny", **TINY)
    for pooling in ("mean", "cls"):
        model = SequenceClassifier(config, 3, pooling).eval()
        ids = torch.tensor([[1, 7, 8, 9]])
        padded = torch.tensor([[1, 7, 8, 9, 0, 0], [1, 5, 0, 0, 0, 0]])
        torch.testing.assert_close(model(ids)[0], model(padded)[0], atol=1e-5, rtol=1e-5)


def test_mask_tokens_spares_special_ids_and_marks_targets():
    src = torch.tensor([[1, 5, 6, 7, 8, 2, 0, 0]] * 64)
    inputs, targets = mask_tokens(src, mask_id=20, prob=0.5, generator=torch.Generator())
    chosen = targets != -100
    assert chosen.any() and not chosen[:, [0, 5, 6, 7]].any()
    torch.testing.assert_close(targets[chosen], src[chosen])
    torch.testing.assert_close(inputs[~chosen], src[~chosen])
    assert (inputs[chosen] == 20).float().mean() > 0.6


def test_language_model_output_is_tied_to_the_embedding():
    model = MaskedLanguageModel(ModelConfig.preset("tiny", **TINY))
    assert model.output.weight is model.encoder.embed.token.weight
    assert model(torch.tensor([[4, 5, 6]])).shape == (1, 3, 64)


# ---------------------------------------------------------------- training and use


def test_python_training_learns_the_toy_language(python_run, data):
    out, summary = python_run
    assert summary["best_val_accuracy"] > 80
    assert (out / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    classifier = Classifier.load(out)
    held_out = LabeledTexts.from_pairs(toy_sentiment(80, 3))
    scores = classifier.evaluate(held_out)
    assert scores["accuracy"] > 80 and scores["texts"] == 80


def test_predict_gives_a_label_and_its_probability(python_run):
    classifier = Classifier.load(python_run[0])
    texts = ["a great and lovely film", "the plot was dull and awful", "x"]
    predictions = classifier.predict(texts)
    probabilities = classifier.probabilities(texts)
    torch.testing.assert_close(probabilities.sum(-1), torch.ones(3))
    for (label, p), row in zip(predictions, probabilities, strict=True):
        assert label in ("neg", "pos") and p == pytest.approx(row.max().item())
    assert [p[0] for p in predictions[:2]] == ["pos", "neg"]
    one_by_one = [classifier.predict([t])[0] for t in texts]
    assert [p[0] for p in one_by_one] == [p[0] for p in predictions]
    assert classifier.predict([]) == []


def test_attention_maps_for_mean_and_cls_pooling(python_run, cli_run):
    for run, first in ((python_run[0], "▁a"), (cli_run, "[CLS]")):
        classifier = Classifier.load(run)
        maps = classifier.attention_maps("a great film")
        tokens = maps["tokens"]
        S = len(tokens)
        assert tokens[0] == first and "".join(tokens).endswith("film")
        assert maps["encoder"].shape == (1, 2, S, S)
        torch.testing.assert_close(maps["encoder"].sum(-1), torch.ones(1, 2, S))
        label, probability = maps["output"]
        assert (label, probability) == pytest.approx(classifier.predict(["a great film"])[0])


def test_cli_training_with_cls_pooling_and_pretraining(cli_run):
    config = json.loads((cli_run / "config.json").read_text())
    assert config["task"] == "classifier" and config["data"]["options"]["pooling"] == "cls"
    assert (cli_run / "pretrain" / "model.safetensors").is_file()
    assert (cli_run / "confusion.png").is_file()
    assert json.loads((cli_run / "labels.json").read_text())["labels"] == ["neg", "pos"]


def test_a_second_run_starts_from_a_pretrained_one(cli_run, data, tmp_path):
    summary = train_classifier(
        read_labeled(data["train"]),
        read_labeled(data["valid"]),
        ModelConfig.preset("tiny", **TINY),
        train_config(tmp_path / "run", max_steps=2, eval_every=2),
        ClassifierOptions(pooling="cls"),
        pretrained=cli_run,
    )
    assert summary["steps"] == 2
    assert (tmp_path / "run" / "tokenizer.json").read_text() == (
        cli_run / "tokenizer.json"
    ).read_text()


def test_classify_prints_label_tab_probability_and_keeps_empty_lines(
    python_run, monkeypatch, capsys
):
    monkeypatch.setattr("sys.stdin", io.StringIO("a great film\n\nso dull and awful\n"))
    assert main(["classify", "--model", str(python_run[0])]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    for line, label in ((lines[0], "pos"), (lines[2], "neg")):
        name, probability = line.split("\t")
        assert name == label and 0.5 <= float(probability) <= 1.0


def test_classify_reads_input_file(python_run, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_text("awful\n\n", encoding="utf-8")
    assert main(["classify", "--model", str(python_run[0]), "--input", str(path)]) == 0
    assert capsys.readouterr().out.split("\n")[1:] == ["", ""]


def test_evaluate_prints_json_and_draws_the_confusion(python_run, tmp_path, capsys):
    out = python_run[0]
    (out / "confusion.png").unlink()
    test = write(tmp_path / "test.txt", toy_sentiment(50, 4), "sst2")
    assert main(["evaluate", "--model", str(out), "--data", str(test), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["texts"] == 50 and 0 <= scores["macro_f1"] <= 100
    assert scores["accuracy"] > 80
    assert (out / "confusion.png").is_file()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pos\tgreat film\nmeh\tso so\n", "test.tsv:2: label 'meh' was never seen in training"),
        ("pos\tgreat film\nneg so dull\n", "test.tsv:2: expected label<TAB>text"),
    ],
)
def test_evaluate_bad_data_is_one_error_line(python_run, tmp_path, capsys, text, message):
    path = tmp_path / "test.tsv"
    path.write_text(text, encoding="utf-8")
    assert main(["evaluate", "--model", str(python_run[0]), "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv: error: ") and message in err and err.count("\n") == 1


def test_train_refuses_a_validation_label_not_in_training(data, tmp_path, capsys):
    valid = write(tmp_path / "valid.txt", [("pos", "good"), ("maybe", "so so")], "sst2")
    code = main(["train", "classifier", "--train", str(data["train"]), "--valid", str(valid),
                 "--out", str(tmp_path / "run"), "--preset", "tiny", "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "valid.txt:2: label 'maybe'" in err and err.count("\n") == 1


def test_load_refuses_another_kind_of_run(tmp_path):
    (tmp_path / "config.json").write_text('{"task": "translation"}')
    with pytest.raises(InputError, match="not a classifier run"):
        Classifier.load(tmp_path)


def test_a_run_without_pretraining_cannot_seed_another(python_run, data, tmp_path, capsys):
    code = main(["train", "classifier", "--train", str(data["train"]), "--valid",
                 str(data["valid"]), "--out", str(tmp_path / "run"), "--pretrained",
                 str(python_run[0]), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "holds no pretrained encoder" in err and err.count("\n") == 1
