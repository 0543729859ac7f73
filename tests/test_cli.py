"""The command line as a user meets it: help, training, translating, evaluating, bad input."""

import json
import subprocess
import sys

import pytest

from qkv.cli import main

from .helpers import train_translation_args, write_splits


def qkv(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "qkv", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["train"],
        ["train", "translation"],
        ["translate"],
        ["evaluate"],
        ["demo"],
        ["attention"],
        ["explain"],
        ["plot"],
        ["train", "tagger"],
        ["train", "classifier"],
        ["train", "vit"],
        ["tag"],
        ["classify"],
        ["classify-image"],
    ],
)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "usage: qkv" in text
    if command == ["train", "translation"]:
        for option in (
            "--train-src",
            "--max-tokens",
            "--precision",
            "--resume",
            "--warmup-steps",
            "--label-smoothing",
            "--accumulate",
            "--max-time",
        ):
            assert option in text


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    paths = write_splits(folder, n_train=200)
    out = folder / "run"
    done = qkv(
        *train_translation_args(
            paths,
            out,
            "--preset",
            "tiny",
            "--vocab-size",
            200,
            "--max-steps",
            8,
            "--eval-every",
            4,
            "--log-every",
            2,
            "--max-tokens",
            500,
        )
    )
    assert done.returncode == 0, done.stderr
    return out, paths, done


def test_train_writes_a_run_folder(trained):
    out, _, done = trained
    assert "best validation BLEU" in done.stdout
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert (out / "metrics.csv").read_text().count("\n") >= 5


def test_translate_reads_stdin_line_by_line(trained):
    out, paths, _ = trained
    text = "the dog sees a cat\n\nmy queen swims\n"
    done = qkv("translate", "--model", out, "--beam", 2, stdin=text)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""


def test_evaluate_prints_json(trained):
    out, paths, _ = trained
    done = qkv(
        "evaluate",
        "--model",
        out,
        "--src",
        paths["test_src"],
        "--ref",
        paths["test_tgt"],
        "--beam",
        1,
        "--json",
    )
    assert done.returncode == 0, done.stderr
    scores = json.loads(done.stdout)
    assert {"bleu", "chrf"} <= set(scores) and scores["sentences"] == 20


def test_resume_from_the_command_line(trained, tmp_path):
    out, paths, _ = trained
    done = qkv(
        *train_translation_args(
            paths, out, "--max-steps", 10, "--eval-every", 4, "--max-tokens", 500, "--resume"
        )
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "summary.json").read_text())["steps"] == 10


def bad_input_cases(tmp_path):
    good_src, good_tgt = tmp_path / "a.src", tmp_path / "a.tgt"
    good_src.write_text("one\ntwo\nthree\n")
    good_tgt.write_text("eins\nzwei\n")
    utf = tmp_path / "bad.tgt"
    utf.write_bytes(b"eins\nzwei\ndr\xfcei\n")
    empty = tmp_path / "empty.tgt"
    empty.write_text("")
    return {
        "line counts": ([good_src, good_tgt], "3"),
        "invalid utf-8": ([good_src, utf], "bad.tgt:3"),
        "empty file": ([good_src, empty], "empty.tgt"),
        "missing file": ([good_src, tmp_path / "nope.tgt"], "nope.tgt"),
    }


@pytest.mark.parametrize("case", ["line counts", "invalid utf-8", "empty file", "missing file"])
def test_bad_input_is_one_clear_line(tmp_path, case):
    (src, tgt), words = bad_input_cases(tmp_path)[case]
    done = qkv(
        "train",
        "translation",
        "--train-src",
        src,
        "--train-tgt",
        tgt,
        "--valid-src",
        src,
        "--valid-tgt",
        tgt,
        "--out",
        tmp_path / "run",
        "--no-progress",
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkv: error: ")
    assert words in lines[0]


def test_not_a_run_folder_is_one_clear_line(tmp_path):
    done = qkv("translate", "--model", tmp_path / "nothing", stdin="hello\n")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "no such run folder" in done.stderr
