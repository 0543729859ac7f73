"""The command line as a user meets it: help, training, translating, evaluating, bad input."""

import argparse
import dataclasses
import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

from qkv.cli import main
from qkv.cli.options import add_dataclass_options
from qkv.jobs import JOBS, get_job
from qkv.training import TrainConfig

from ..helpers import train_translation_args, write_splits


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
            "--train",
            "--source-lang",
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


@pytest.mark.parametrize("name", list(JOBS))
def test_train_help_states_the_jobs_own_model_defaults(name, capsys):
    job = get_job(name)
    with pytest.raises(SystemExit):
        main(["train", name, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name, value in job.model_defaults.items():
        if name in job.model_options and name != "norm_first":
            option = re.escape("--" + name.replace("_", "-"))
            assert re.search(rf"{option} \S+ (?:(?! --).)*\(default: {value}\)", text), name
    if job.model_defaults.get("norm_first"):
        assert "x + Sublayer(LayerNorm(x)) (default)" in text
    # a field no preset sets shows its own default; one the presets set says so
    assert re.search(r"--dropout-impl \S+ (?:(?! --).)*\(default: auto\)", text)
    if "d_model" not in job.model_defaults:
        assert re.search(r"--d-model N (?:(?! --).)*\(default: the preset's\)", text)


@pytest.mark.parametrize("name", list(JOBS))
def test_train_help_states_every_settings_and_training_default(name):
    """Scalars and lists alike: "(default: ...)" comes from the field, never the help text."""
    job = get_job(name)
    parser = argparse.ArgumentParser()
    shown = add_dataclass_options(parser, job.Settings) + add_dataclass_options(
        parser, TrainConfig, job.train_defaults
    )
    defaults = dataclasses.asdict(job.Settings()) | dataclasses.asdict(TrainConfig())
    defaults |= job.train_defaults
    actions = {a.dest: a for a in parser._actions if a.dest in shown}
    lists = 0
    for dest, action in actions.items():
        value = defaults[dest]
        if isinstance(value, bool):
            expected = "yes" if value else "no"
        elif isinstance(value, list):
            expected = " ".join(str(v) for v in value) or "none"
            lists += 1
        else:
            expected = "none" if value is None else str(value)
        assert action.help.endswith(f"(default: {expected})"), dest
        assert action.help.count("default:") == 1, dest  # no second copy in the text
    if name == "tagger":
        assert lists == 3  # --unlabeled, --char-widths, --aux-tags


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
        "--data",
        str(paths["test_src"])[: -len(".src")],
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
    """(source text, target text or None for a missing file, words the error must name)."""
    return {
        "line counts": (b"one\ntwo\nthree\n", b"eins\nzwei\n", "3"),
        "invalid utf-8": (b"one\ntwo\nthree\n", b"eins\nzwei\ndr\xfcei\n", "data.tgt:3"),
        "empty file": (b"one\ntwo\nthree\n", b"", "data.tgt"),
        "missing file": (b"one\ntwo\nthree\n", None, "data.tgt"),
    }


@pytest.mark.parametrize("case", ["line counts", "invalid utf-8", "empty file", "missing file"])
def test_bad_input_is_one_clear_line(tmp_path, case):
    src, tgt, words = bad_input_cases(tmp_path)[case]
    (tmp_path / "data.src").write_bytes(src)
    if tgt is not None:
        (tmp_path / "data.tgt").write_bytes(tgt)
    prefix = tmp_path / "data"
    done = qkv(
        "train",
        "translation",
        "--train",
        prefix,
        "--valid",
        prefix,
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
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


# ---------------------------------------------------------------- one command line for all jobs


MODEL_COMMANDS = [
    ["train", "translation"],
    ["train", "tagger"],
    ["train", "classifier"],
    ["train", "vit"],
    ["translate"],
    ["tag"],
    ["classify"],
    ["classify-image"],
    ["evaluate"],
    ["attention"],
    ["explain"],
]


def help_text(command, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_every_command_that_runs_a_model_takes_device_and_threads(command, capsys):
    text = help_text(command, capsys)
    assert "--device" in text and "--threads" in text


@pytest.mark.parametrize("command", ["translate", "tag", "classify", "classify-image"])
def test_every_prediction_command_reads_input_and_writes_output(command, capsys):
    text = help_text([command], capsys)
    assert "--input" in text and "--output" in text and "--buffer-size" in text


@pytest.mark.parametrize("job", ["translation", "tagger", "classifier", "vit"])
def test_every_job_names_its_data_the_same_way(job, capsys):
    text = help_text(["train", job], capsys)
    for option in ("--train", "--valid", "--label-smoothing", "--out", "--config", "--force"):
        assert option in text
    assert "--batch-tokens" not in text and "--train-src" not in text


def test_no_job_offers_an_option_it_ignores(capsys):
    vit = help_text(["train", "vit"], capsys)
    for option in ("--max-tokens", "--positional", "--n-decoder-layers", "--vocab-size"):
        assert option not in vit
    assert "--batch-size" in vit
    for job in ("tagger", "classifier"):
        text = help_text(["train", job], capsys)
        assert "--n-decoder-layers" not in text and "--max-tokens" in text
    assert "--beam" not in help_text(["evaluate"], capsys)
    assert "--max-tokens" in help_text(["translate"], capsys)


def test_version_and_python_m_qkv():
    done = qkv("--version")
    assert done.returncode == 0 and done.stdout.startswith("qkv ")


def test_option_errors_are_one_line_without_usage(tmp_path):
    done = qkv("train", "translation", "--out", tmp_path / "r", "--max-steps", "many")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-steps" in lines[0] and "usage" not in done.stderr


def test_evaluate_refuses_another_jobs_options(trained):
    out, paths, _ = trained
    done = qkv("evaluate", "--model", out, "--format", "conllu")
    assert done.returncode == 2 and "--format" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------- prediction streams


def test_translate_answers_every_line_of_a_file(trained, tmp_path):
    out, _, _ = trained
    source = tmp_path / "in.txt"
    source.write_bytes("\ufeffthe dog sees a cat\r\n\r\nmy queen swims\nthe cat\n".encode())
    target = tmp_path / "out.txt"
    done = qkv(
        "translate", "--model", out, "--input", source, "--output", target, "--buffer-size", 2
    )
    assert done.returncode == 0, done.stderr
    lines = target.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[1] == "" and lines[4] == ""
    alone = qkv("translate", "--model", out, "my queen swims")
    assert alone.stdout.split("\n")[0] == lines[2]


def test_translate_answers_a_line_before_the_next_arrives(trained):
    out, _, _ = trained
    process = subprocess.Popen(
        [sys.executable, "-m", "qkv", "translate", "--model", str(out), "--buffer-size", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        process.stdin.write("the dog sees a cat\n")
        process.stdin.flush()
        first = process.stdout.readline()  # blocks until qkv answers; stdin is still open
        assert first.endswith("\n")
        process.stdin.write("my queen swims\n")
        process.stdin.close()
        assert len(process.stdout.read().split("\n")) == 2
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()


def test_invalid_bytes_stop_with_one_line_after_the_good_lines(trained):
    out, _, _ = trained
    done = subprocess.run(
        [sys.executable, "-m", "qkv", "translate", "--model", str(out)],
        input=b"the dog sees a cat\nmy queen\n\xff\xfe\nthe cat\n",
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stdout.decode().count("\n") == 2  # the two lines before the bad one
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "stdin, line 3" in lines[0] and "UTF-8" in lines[0]


@pytest.mark.parametrize(
    "device, words", [("bogus", "not a device"), ("cuda", "no CUDA GPU"), ("cuda:7", "CUDA")]
)
def test_bad_device_is_one_line(trained, device, words):
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU, so --device cuda is not an error here")
    out, _, _ = trained
    done = qkv("translate", "--model", out, "--device", device, stdin="the dog\n")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0]


# ---------------------------------------------------------------- run folders are safe


def snapshot(folder):
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")}


def test_training_over_a_run_needs_resume_or_force(trained, tmp_path):
    out, paths, _ = trained
    before = snapshot(out)
    done = qkv(*train_translation_args(paths, out, "--preset", "tiny", "--max-steps", 2))
    assert done.returncode == 2 and "already holds a run" in done.stderr
    assert snapshot(out) == before
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "stale.txt").write_text("from the old run")
    done = qkv(
        *train_translation_args(
            paths, copy, "--preset", "tiny", "--vocab-size", 200, "--max-steps", 2, "--force"
        )
    )
    assert done.returncode == 0, done.stderr
    assert not (copy / "stale.txt").exists()
    assert json.loads((copy / "summary.json").read_text())["steps"] == 2


def test_resume_of_an_empty_folder_says_there_is_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    done = qkv("train", "translation", "--out", tmp_path / "empty", "--resume")
    assert done.returncode == 2 and "nothing to resume" in done.stderr


def test_evaluate_never_writes_into_the_run(trained):
    out, paths, _ = trained
    before = snapshot(out)
    done = qkv("evaluate", "--model", out, "--data", str(paths["test_src"])[:-4], "--beam", 1)
    assert done.returncode == 0, done.stderr
    assert snapshot(out) == before


def test_config_reads_a_saved_run_back_with_overrides(trained, tmp_path):
    out, _, _ = trained
    again = tmp_path / "again"
    done = qkv(
        "train", "translation", "--config", out / "config.json", "--out", again,
        "--max-steps", 2, "--lr", 0.002, "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    saved, new = (json.loads((d / "config.json").read_text()) for d in (out, again))
    assert new["settings"] == saved["settings"]
    assert new["model"] == saved["model"]
    assert new["train"]["max_steps"] == 2 and new["train"]["lr"] == 0.002
    assert new["train"]["eval_every"] == saved["train"]["eval_every"]


def test_resume_keeps_the_runs_loop_settings_unless_typed_again(tmp_path):
    from qkv.cli import build_parser
    from qkv.cli.train import configs_from

    run = tmp_path / "run"
    run.mkdir()
    saved_loop = {"lr_schedule": "cosine", "max_steps": 700, "lr": 0.004, "warmup_steps": 10}
    (run / "config.json").write_text(json.dumps({"job": "vit", "train": saved_loop}))

    def loop(*typed):
        args = build_parser().parse_args(["train", "vit", "--out", str(run), *typed])
        return configs_from(args)[2]

    resumed = loop("--resume")
    assert (resumed.lr_schedule, resumed.max_steps, resumed.lr) == ("cosine", 700, 0.004)
    assert loop("--resume", "--max-steps", "900").max_steps == 900
    assert loop().max_steps != 700  # a fresh run starts from the job's defaults
    (run / "config.json").write_text(json.dumps({"job": "vit", "train": {"max_steps": 700}}))
    assert loop("--resume").lr_schedule == "inverse_sqrt"  # saved before the option existed
