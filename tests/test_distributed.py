"""Every job under torchrun: two CPU processes (gloo), DistributedDataParallel or FSDP."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from .helpers import train_translation_args, write_conllu, write_labeled, write_splits

pytestmark = pytest.mark.skipif(
    sys.platform == "win32", reason="torchrun's gloo backend needs a POSIX host"
)
TINY_ENCODER = ["--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
                "--n-encoder-layers", "1"]  # fmt: skip


def torchrun(*args, processes: int = 2, **env: str) -> subprocess.CompletedProcess:
    launcher = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if launcher is None:
        pytest.skip("torchrun is not installed beside this Python")
    command = [launcher, "--nproc_per_node", str(processes), "-m", "qkv", *map(str, args)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def job_args(job: str, folder: Path) -> list[object]:
    """`qkv train JOB` on small generated data, a few steps."""
    loop = ["--max-steps", 4, "--eval-every", 2, "--no-progress", "--precision", "fp32"]
    if job == "translation":
        paths = write_splits(folder, n_train=200)
        return train_translation_args(
            paths, folder / "run", "--preset", "tiny", "--vocab-size", 200, "--max-steps", 4,
            "--eval-every", 2, "--max-tokens", 400,
        )  # fmt: skip
    if job == "tagger":
        train, valid = write_conllu(folder / "t.conllu"), write_conllu(folder / "v.conllu", 10, 1)
        data = ["--train", train, "--valid", valid, "--vocab-size", 60, "--char-dim", 8]
        data += ["--max-tokens", 100]
    elif job == "classifier":
        train, valid = write_labeled(folder / "t.tsv"), write_labeled(folder / "v.tsv", 10, 1)
        data = ["--train", train, "--valid", valid, "--vocab-size", 60, "--max-tokens", 100]
    else:
        data = ["--d-model", 16, "--n-heads", 2, "--d-ff", 32, "--n-encoder-layers", 1]
        return ["train", "vit", *data, "--out", folder / "run", *loop]
    return ["train", job, *data, *TINY_ENCODER, "--out", folder / "run", *loop]


@pytest.mark.parametrize("job", ["translation", "tagger", "classifier", "vit"])
def test_every_job_trains_on_two_processes(job, tmp_path):
    done = torchrun(*job_args(job, tmp_path))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4
    assert (tmp_path / "run" / "model.safetensors").is_file()
    assert done.stdout.count("run folder") == 1  # only rank 0 speaks


def train_losses(run: Path) -> list[float]:
    with open(run / "metrics.csv", newline="") as f:
        return [float(r["train_loss"]) for r in csv.DictReader(f) if r["train_loss"]]


def translation(tmp_path: Path, name: str, *options: object) -> list[object]:
    paths = write_splits(tmp_path, n_train=200)
    return train_translation_args(
        paths, tmp_path / name, "--preset", "tiny", "--vocab-size", 200, "--max-steps", 6,
        "--eval-every", 3, "--log-every", 1, "--max-tokens", 300, "--dropout", 0, *options,
    )  # fmt: skip


def one_process(*args: object, returncode: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "qkv", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == returncode, done.stderr[-3000:]
    return done


def test_two_processes_equal_one_accumulating_the_same_batches(tmp_path):
    """DDP averages the two ranks' gradients: the same step as one process over both batches."""
    torchrun(*translation(tmp_path, "ddp"))
    one_process(*translation(tmp_path, "accumulated", "--accumulate", 2))
    one_process(*translation(tmp_path, "alone"))  # rank 0's batches only: must differ
    two, one, alone = (
        load_file(tmp_path / run / "last.safetensors") for run in ("ddp", "accumulated", "alone")
    )
    assert two.keys() == one.keys()
    for name in two:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5)
    assert any(not torch.allclose(two[n], alone[n], rtol=1e-4, atol=1e-5) for n in two)


def test_fsdp_follows_the_same_loss_curve_as_ddp(tmp_path):
    torchrun(*translation(tmp_path, "ddp"))
    torchrun(*translation(tmp_path, "fsdp", "--strategy", "fsdp"))
    ddp, fsdp = train_losses(tmp_path / "ddp"), train_losses(tmp_path / "fsdp")
    assert len(ddp) == 6
    assert fsdp == pytest.approx(ddp, rel=1e-4)
    config = json.loads((tmp_path / "fsdp" / "config.json").read_text())
    assert config["train"]["strategy"] == "fsdp"
    summary = json.loads((tmp_path / "fsdp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 6


def test_two_processes_stop_and_anneal_on_one_clock(tmp_path):
    """With --max-time every rank reads rank 0's clock, so all stop after the same step
    (a rank that stopped alone would leave the other waiting in its gradient all-reduce)."""
    timed = ["--max-steps", 10**6, "--max-time", 3, "--lr-schedule", "cosine", "--warmup-steps", 2]
    torchrun(*translation(tmp_path, "timed", *timed, "--eval-every", 10**6))
    summary = json.loads((tmp_path / "timed" / "summary.json").read_text())
    assert summary["stopped_by"] == "max_time" and summary["world_size"] == 2
    with open(tmp_path / "timed" / "metrics.csv", newline="") as f:
        rates = [float(r["lr"]) for r in csv.DictReader(f) if r["train_loss"]]
    assert len(rates) == summary["steps"] > 3 and rates[-1] == 0.0


def test_auto_precision_under_torchrun_is_rank_0s_measurement(tmp_path):
    """Under torchrun rank 0 times ``--precision auto`` and broadcasts its answer: both ranks
    reach the broadcast (no hang), the run records rank 0's own measurement, and the cache
    holds one timing of the model's layers. That no other rank times is shown with a given
    rank in tests/test_precision.py (a second timing would write the same cache key)."""
    cache = tmp_path / "cache"
    args = translation(tmp_path, "auto", "--max-steps", 2)
    args[args.index("--precision") + 1] = "auto"
    torchrun(*args, QKV_CACHE=str(cache))
    summary = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2
    assert summary["precision"] in ("bf16", "fp32")
    if "no bf16 support" in summary["precision_reason"]:
        assert not (cache / "precision.json").exists()
    else:
        assert "rank 0's choice" not in summary["precision_reason"]
        timings = json.loads((cache / "precision.json").read_text())
        assert len(timings) == 1 and "|linear " in next(iter(timings))


def test_processes_option_launches_the_same_run_as_torchrun(tmp_path):
    torchrun(*translation(tmp_path, "torchrun"))
    done = one_process(*translation(tmp_path, "launched", "--processes", 2, "--threads", 1))
    assert done.stdout.count("run folder") == 1
    summary = json.loads((tmp_path / "launched" / "summary.json").read_text())
    assert summary["world_size"] == 2
    ours, theirs = (load_file(tmp_path / r / "last.safetensors") for r in ("launched", "torchrun"))
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-5)


def test_processes_option_reports_a_bad_input_once(tmp_path):
    args = translation(tmp_path, "bad", "--processes", 2)
    args[args.index("--train") + 1] = tmp_path / "missing"
    done = one_process(*args, returncode=2)
    assert done.stderr.count("qkv: error:") == 1, done.stderr
    assert "missing" in done.stderr and "Traceback" not in done.stderr
