"""The same trainer under torchrun: two CPU processes, DistributedDataParallel over gloo."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import train_translation_args, write_splits


@pytest.mark.skipif(sys.platform == "win32", reason="torchrun's gloo backend needs a POSIX host")
def test_translation_trains_on_two_processes(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    paths = write_splits(tmp_path, n_train=200)
    out = tmp_path / "run"
    done = subprocess.run(
        [
            torchrun,
            "--nproc_per_node",
            "2",
            "-m",
            "qkv",
            *train_translation_args(
                paths,
                out,
                "--preset",
                "tiny",
                "--vocab-size",
                200,
                "--max-steps",
                4,
                "--eval-every",
                2,
                "--max-tokens",
                400,
            ),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4
    assert done.stdout.count("best validation BLEU") == 1  # only rank 0 speaks
    assert (out / "model.safetensors").is_file()
