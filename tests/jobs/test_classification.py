"""Sentence classification: readers, pooling, masking, training, the Classifier, its commands."""

import hashlib
import io
import json
import random
import shutil

import pytest
import torch

from qkv.cli import main
from qkv.config import ModelConfig
from qkv.errors import InputError
from qkv.jobs.classification import (
    JOB,
    Classifier,
    ClassifierSettings,
    LabeledTexts,
    MaskedLanguageModel,
    SequenceClassifier,
    read_labeled,
)
from qkv.jobs.classification.model import POOLINGS, pool
from qkv.jobs.pretraining import mask_tokens, read_texts

from ..helpers import assert_starts_from_pretrained

POSITIVE = "good great superb lovely brilliant charming".split()
NEGATIVE = "bad awful dull boring terrible clumsy".split()
FILLER = "the film plot cast story was is a very quite and this it of".split()
TINY = dict(d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1, dropout=0.0)
TINY_OPTIONS = (
    "--preset tiny --d-model 32 --n-heads 2 --d-ff 64 --n-encoder-layers 1 --vocab-size 60 "
    "--max-steps 4 --eval-every 2 --precision fp32 --no-progress"
).split()


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


def train(data, out, *options, valid=None):
    """``qkv train classifier`` of a tiny model on the toy data; returns the exit code."""
    paths = ["--train", str(data["train"]), "--valid", str(valid or data["valid"])]
    return main(["train", "classifier", *paths, "--out", str(out), *TINY_OPTIONS, *options])


def files_of(folder):
    """Every file under ``folder`` with a hash of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("classification")
    return {
        "folder": folder,
        "train": write(folder / "train.tsv", toy_sentiment(400, 1), "tsv", "label\ttext"),
        "valid": write(folder / "valid.tsv", toy_sentiment(60, 2), "tsv", "label\ttext"),
    }


@pytest.fixture(scope="module")
def mean_run(data):
    """A run long enough to learn the toy language (mean pooling, no pretraining)."""
    out = data["folder"] / "mean_run"
    torch.manual_seed(0)
    learn = "--max-steps 40 --eval-every 20 --warmup-steps 5 --lr 3e-3 --max-tokens 600"
    assert train(data, out, "--vocab-size", "120", *learn.split()) == 0
    return out


@pytest.fixture(scope="module")
def cls_run(data):
    """A short run with [CLS] pooling, word dropout and masked-LM pretraining."""
    out = data["folder"] / "cls_run"
    options = "--pooling cls --word-dropout 0.1 --pretrain-steps 4 --max-tokens 600"
    assert train(data, out, *options.split(), "--unlabeled", str(data["valid"])) == 0
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


def test_mean_and_max_pooling_ignore_padding_and_cls_takes_position_0():
    states = torch.randn(2, 4, 3)
    states[0, 2:] = 100.0  # padding that would win the maximum if it were read
    real = torch.tensor([[True, True, False, False], [True, True, True, True]])
    pooled = pool(states, real, "mean")
    torch.testing.assert_close(pooled[0], states[0, :2].mean(0))
    torch.testing.assert_close(pooled[1], states[1].mean(0))
    pooled = pool(states, real, "max")
    torch.testing.assert_close(pooled[0], states[0, :2].amax(0))
    torch.testing.assert_close(pooled[1], states[1].amax(0))
    torch.testing.assert_close(pool(states, real, "cls"), states[:, 0])


def test_padding_does_not_change_a_texts_logits():
    config = ModelConfig.preset("tiny", **TINY)
    for pooling in POOLINGS:
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


def test_training_learns_the_toy_language(mean_run):
    summary = json.loads((mean_run / "summary.json").read_text())
    assert summary["best_val_accuracy"] > 80 and summary["pretraining"] is None
    assert (mean_run / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((mean_run / "config.json").read_text())
    assert config["job"] == "classifier" and config["model"]["n_decoder_layers"] == 0
    assert config["settings"]["label_smoothing"] == 0.0
    scores = Classifier.load(mean_run).evaluate(LabeledTexts.from_pairs(toy_sentiment(80, 3)))
    assert scores["accuracy"] > 80 and scores["texts"] == 80


def test_predict_gives_a_label_and_its_probability(mean_run):
    classifier = Classifier.load(mean_run)
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
    lines = classifier.predict_lines(["a great film", "", "  "])
    assert lines[1:] == ["", ""] and lines[0].startswith("pos\t")


def test_attention_for_mean_and_cls_pooling(mean_run, cls_run):
    for run, first in ((mean_run, "▁a"), (cls_run, "[CLS]")):
        classifier = Classifier.load(run)
        attention = classifier.attention("a great film")
        assert [k.name for k in attention.kinds] == ["encoder"]
        kind = attention.kind("encoder")
        S = len(kind.queries)
        assert kind.queries == kind.keys and kind.queries[0] == first
        assert "".join(kind.queries).endswith("film")
        assert kind.weights.shape == (1, 2, S, S)
        torch.testing.assert_close(torch.from_numpy(kind.weights).sum(-1), torch.ones(1, 2, S))
        label, probability = classifier.predict(["a great film"])[0]
        assert attention.output == f"{label} (probability {probability:.2f})"


def test_cli_training_with_cls_pooling_and_pretraining(cls_run):
    config = json.loads((cls_run / "config.json").read_text())
    assert config["job"] == "classifier" and config["settings"]["pooling"] == "cls"
    assert (cls_run / "pretrain" / "model.safetensors").is_file()
    summary = json.loads((cls_run / "summary.json").read_text())
    assert summary["pretraining"]["task"] == "masked_lm" and summary["pretraining"]["steps"] == 4
    assert json.loads((cls_run / "labels.json").read_text())["labels"] == ["neg", "pos"]


def test_a_second_run_starts_from_a_pretrained_one(cls_run, data, tmp_path):
    out = tmp_path / "run"
    assert train(data, out, "--pretrained", str(cls_run), "--pooling", "cls") == 0
    assert (out / "tokenizer.json").read_text() == (cls_run / "tokenizer.json").read_text()
    sizes = json.loads((out / "config.json").read_text())["model"]
    pretrained = json.loads((cls_run / "pretrain" / "config.json").read_text())["model"]
    assert sizes["src_vocab_size"] == pretrained["src_vocab_size"]
    # before fine-tuning, the classifier's encoder is the pretrained one
    settings = ClassifierSettings(pretrained=str(cls_run), pooling="cls")
    assert_starts_from_pretrained(JOB, settings, out, cls_run, lambda m: m.encoder)


def test_resume_continues_a_run(data, tmp_path):
    out = tmp_path / "run"
    assert train(data, out) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    code = main(["train", "classifier", "--out", str(out), "--resume", "--max-steps", "6",
                 "--eval-every", "2", "--no-progress", "--precision", "fp32"])  # fmt: skip
    assert code == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 6


def test_train_help_shows_only_the_encoder(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "classifier", "--help"])
    shown = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "--n-decoder-layers" not in shown and "--n-encoder-layers" in shown
    for flag in ("--pretrain-steps", "--unlabeled", "--label-smoothing", "--max-tokens"):
        assert flag in shown


def test_classify_prints_label_tab_probability_and_keeps_empty_lines(mean_run, monkeypatch, capsys):
    stdin = io.TextIOWrapper(io.BytesIO(b"a great film\n\nso dull and awful\n"))
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["classify", "--model", str(mean_run), "--no-progress"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    for line, label in ((lines[0], "pos"), (lines[2], "neg")):
        name, probability = line.split("\t")
        assert name == label and 0.5 <= float(probability) <= 1.0


def test_classify_writes_one_line_per_input_line(mean_run, tmp_path):
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    texts = ["awful", "", "   ", "a great film", "", "so dull"]
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    code = main(["classify", "--model", str(mean_run), "--input", str(source),
                 "--output", str(target), "--no-progress"])  # fmt: skip
    assert code == 0
    lines = target.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines[:-1]) == len(texts)
    for text, line in zip(texts, lines, strict=False):
        assert (line == "") == (not text.strip())


def test_evaluate_leaves_the_run_alone_and_draws_into_out(mean_run, tmp_path, capsys):
    before = files_of(mean_run)
    test = write(tmp_path / "test.txt", toy_sentiment(50, 4), "sst2")
    pictures = tmp_path / "pictures"
    code = main(["evaluate", "--model", str(mean_run), "--data", str(test), "--json",
                 "--out", str(pictures)])  # fmt: skip
    assert code == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["texts"] == 50 and 0 <= scores["macro_f1"] <= 100
    assert scores["accuracy"] > 80 and scores["data"] == str(test)
    assert (pictures / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["evaluate", "--model", str(mean_run), "--json"]) == 0  # the validation file
    assert json.loads(capsys.readouterr().out)["texts"] == 60
    assert files_of(mean_run) == before


def test_evaluate_without_the_validation_file_asks_for_data(mean_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(mean_run, run)
    config = json.loads((run / "config.json").read_text())
    config["settings"]["valid"] = str(tmp_path / "gone.tsv")
    (run / "config.json").write_text(json.dumps(config))
    assert main(["evaluate", "--model", str(run)]) == 2
    err = capsys.readouterr().err
    assert "gone.tsv" in err and "--data" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pos\tgreat film\nmeh\tso so\n", "test.tsv:2: label 'meh' was never seen in training"),
        ("pos\tgreat film\nneg so dull\n", "test.tsv:2: expected label<TAB>text"),
    ],
)
def test_evaluate_bad_data_is_one_error_line(mean_run, tmp_path, capsys, text, message):
    path = tmp_path / "test.tsv"
    path.write_text(text, encoding="utf-8")
    assert main(["evaluate", "--model", str(mean_run), "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv: error: ") and message in err and err.count("\n") == 1


def test_train_refuses_a_validation_label_not_in_training(data, tmp_path, capsys):
    valid = write(tmp_path / "valid.txt", [("pos", "good"), ("maybe", "so so")], "sst2")
    assert train(data, tmp_path / "run", valid=valid) == 2
    err = capsys.readouterr().err
    assert "valid.txt:2: label 'maybe'" in err and err.count("\n") == 1
    assert not (tmp_path / "run" / "tokenizer.json").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--mask-prob", "1.5"], "--mask-prob 1.5 must be in (0, 1)"),
        (["--word-dropout", "-0.1"], "--word-dropout -0.1 must be in [0, 1)"),
        (["--pretrain-steps", "-1"], "--pretrain-steps -1 must be 0 or more"),
        (["--pretrain-steps", "2", "--pretrained", "x"], "not both"),
        (["--label-smoothing", "1"], "--label-smoothing 1.0"),
        (["--pretrain-share", "1"], "--pretrain-share 1.0 must be in [0, 1)"),
        (
            ["--pretrain-time", "5", "--max-time", "2"],
            "--pretrain-time 5 leaves nothing of --max-time 2 for fine-tuning",
        ),
    ],
)
def test_bad_settings_are_one_error_line(data, tmp_path, capsys, options, message):
    assert train(data, tmp_path / "run", *options) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_load_refuses_another_kind_of_run(tmp_path):
    (tmp_path / "config.json").write_text('{"job": "translation"}')
    with pytest.raises(InputError, match="not a 'classifier' run"):
        Classifier.load(tmp_path)


def test_a_run_without_pretraining_cannot_seed_another(mean_run, data, tmp_path, capsys):
    assert train(data, tmp_path / "run", "--pretrained", str(mean_run)) == 2
    err = capsys.readouterr().err
    assert "holds no pretrained encoder" in err and err.count("\n") == 1


# ---------------------------------------------------------------- the recipe's defaults


@pytest.mark.parametrize(
    ("settings", "max_time", "budget", "pretrains"),
    [
        ({}, 100.0, 75.0, True),  # three quarters of --max-time
        ({}, None, None, False),  # no time budget: no share of it
        ({"pretrain_share": 0.0}, 100.0, 0.0, False),
        ({"pretrain_time": 10.0}, 100.0, 10.0, True),
        ({"pretrain_steps": 5}, 100.0, None, True),  # steps, not time, end the pretraining
        ({"pretrained": "earlier-run"}, 100.0, 75.0, False),  # takes that run's encoder
    ],
)
def test_pretraining_takes_its_share_of_the_time_budget(settings, max_time, budget, pretrains):
    options = ClassifierSettings(**settings)
    assert options.pretrain_budget(max_time) == budget
    assert options.pretrains_within(max_time) == pretrains


def test_max_time_covers_pretraining_and_fine_tuning(data, tmp_path):
    out = tmp_path / "run"
    assert train(data, out, "--max-time", "4", "--max-steps", "1000000") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pretraining"]["task"] == "masked_lm"
    assert summary["pretraining"]["stopped_by"] == "max_time"
    # fine-tuning keeps to what pretraining left, and config.json says so for a resume
    saved = json.loads((out / "config.json").read_text())["train"]["max_time"]
    assert round(saved, 1) == summary["fine_tuning_max_time"]
    # (at least a second, should the last pretraining step end past its share)
    left = max(1.0, 4 - summary["pretraining"]["wall_seconds"] + 0.1)  # + rounding
    assert 1.0 <= summary["fine_tuning_max_time"] <= left


def test_texts_are_lower_cased_in_training_and_prediction(mean_run, data):
    classifier = Classifier.load(mean_run)
    assert classifier.settings.lowercase
    texts = ["the film was GOOD", "A DULL plot"]
    assert classifier.predict(texts) == classifier.predict([t.lower() for t in texts])
    upper = data["folder"] / "upper.tsv"
    write(upper, [(label, text.upper()) for label, text in toy_sentiment(60, 2)], "tsv")
    assert (
        classifier.evaluate_data(str(upper), None)["accuracy"]
        == (classifier.evaluate_data(str(data["valid"]), None)["accuracy"])
    )


def test_unlabeled_conllu_gives_the_raw_sentences(tmp_path):
    conllu = tmp_path / "treebank.conllu"
    conllu.write_text(
        "# sent_id = 1\n# text = Hello, world!\n1\tHello\t_\n2\t,\t_\n\n"
        "# sent_id = 2\n# text = Bye.\n1\tBye\t_\n"
    )
    assert read_texts(conllu) == ["Hello, world!", "Bye."]
    plain = tmp_path / "texts.txt"
    plain.write_text("# text = kept as it is\n\nsecond\n")
    assert read_texts(plain) == ["# text = kept as it is", "second"]
