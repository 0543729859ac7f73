"""A run killed at any moment (SIGKILL) resumes to exactly the run that was never stopped.

The comparison is the final weights (best, last and averaged), the optimizer and scheduler
state, the step counter, the data position and every metrics.csv row except its two clocks
(elapsed_s, tokens_per_s), plus the number of steps the resumed process itself took. The
second half shows that the comparison catches a resume that loses any of those.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qkv import checkpoint as ckpt
from qkv.training import Trainer

from .helpers import train_tiny_translation, train_translation_args, write_splits

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")

MAX_STEPS, EVAL_EVERY = 24, 4
OPTIONS = ("--preset", "tiny", "--d-model", 32, "--n-heads", 2, "--d-ff", 64,
           "--n-encoder-layers", 1, "--n-decoder-layers", 1, "--vocab-size", 200,
           "--max-tokens", 300, "--max-steps", MAX_STEPS, "--eval-every", EVAL_EVERY,
           "--log-every", 1, "--warmup-steps", 2, "--lr", 3e-3, "--average-last", 3,
           "--threads", 1)  # fmt: skip
CLOCKS = {"elapsed_s", "tokens_per_s"}

# Runs qkv's command line, counting the optimizer steps this process takes (printed at the
# end), and with KILL_AT_SAVE=n kills itself while writing the n-th state.pt: after the new
# file is written, before it is renamed over the old one.
RUNNER = """
import os, signal, sys
import qkv.checkpoint as ckpt
from qkv.cli import main
from qkv.training import Trainer

taken, saves, real_replace, real_step = 0, 0, os.replace, Trainer._train_step
def replace(src, dst):
    global saves
    if str(dst).endswith(ckpt.STATE):
        saves += 1
        if saves == int(os.environ.get("KILL_AT_SAVE", "0")):
            os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)
def step(self, batches):
    global taken
    taken += 1
    return real_step(self, batches)
os.replace, Trainer._train_step = replace, step
code = main(sys.argv[1:])
print(f"optimizer steps taken: {taken}")
sys.exit(code)
"""


def command(args: list[str]) -> list[str]:
    return [sys.executable, "-c", RUNNER, *args]


def environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def steps_taken(stdout: str) -> int:
    return int(stdout.rsplit("optimizer steps taken:", 1)[1].split()[0])


def train_rows(run: Path) -> list[dict[str, str]]:
    path = run / ckpt.METRICS
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return rows if text.endswith("\n") else rows[:-1]


def kill_after_step(args: list[str], step: int) -> None:
    """Start training and SIGKILL it as soon as metrics.csv shows ``step`` done."""
    out = Path(args[args.index("--out") + 1])
    process = subprocess.Popen(command(args), env=environment(), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if any(r["train_loss"] and int(r["step"]) >= step for r in train_rows(out)):
                break
            time.sleep(0.005)
        assert process.poll() is None, "the run ended before it could be killed"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(args), env=environment(**env), capture_output=True, text=True, timeout=300
    )


def differences(a: Path, b: Path) -> list[str]:
    """What differs between two finished run folders (empty when they are the same run)."""
    found = []
    for name in (ckpt.WEIGHTS, ckpt.LAST_WEIGHTS):
        x, y = load_file(a / name), load_file(b / name)
        found += [f"{name}:{k}" for k in x if not torch.equal(x[k], y[k])]
    averaged = [sorted(p.name for p in (r / "checkpoints").glob("*")) for r in (a, b)]
    if averaged[0] != averaged[1]:
        found.append(f"averaged checkpoints {averaged[0]} != {averaged[1]}")
    sa, sb = ckpt.load_state(a / ckpt.STATE), ckpt.load_state(b / ckpt.STATE)
    for key in ("step", "epoch", "batch_index", "best", "bad_evals", "tokens_seen"):
        if sa[key] != sb[key]:
            found.append(f"state {key}: {sa[key]} != {sb[key]}")
    if sa["scheduler"] != sb["scheduler"]:
        found.append("scheduler state")
    for i, (x, y) in enumerate(
        zip(sa["optimizer"]["state"].values(), sb["optimizer"]["state"].values(), strict=True)
    ):
        found += [f"optimizer {i}.{k}" for k in x if not torch.equal(x[k], y[k])]
    rows = [
        [{k: v for k, v in r.items() if k not in CLOCKS} for r in train_rows(run)] for run in (a, b)
    ]
    if rows[0] != rows[1]:
        found.append("metrics.csv rows")
    return found


def test_a_run_killed_anywhere_resumes_to_the_uninterrupted_run(tmp_path):
    paths = write_splits(tmp_path, n_train=200)
    straight = train_translation_args(paths, tmp_path / "straight", *OPTIONS)
    done = run(straight)
    assert done.returncode == 0, done.stderr[-2000:]
    assert steps_taken(done.stdout) == MAX_STEPS
    epochs = {int(r["step"]): int(r["epoch"]) for r in train_rows(tmp_path / "straight")}
    assert epochs[6] == epochs[7] == epochs[13] == epochs[14] < epochs[MAX_STEPS]  # mid-epoch

    killed = train_translation_args(paths, tmp_path / "killed", *OPTIONS)
    resume = [*killed, "--resume"]
    kill_after_step(killed, 6)  # between validations (4 and 8), mid-epoch
    kill_after_step(resume, 13)  # resumed from 4, killed again after step 13
    # resumed from 12, killed while state.pt of step 16 is being written
    assert run(resume, KILL_AT_SAVE="1").returncode == -signal.SIGKILL
    saved = ckpt.load_state(tmp_path / "killed" / ckpt.STATE)["step"]
    assert saved == 12  # the interrupted write left the previous checkpoint in place
    before = train_rows(tmp_path / "killed")
    done = run(resume)
    assert done.returncode == 0, done.stderr[-2000:]
    assert steps_taken(done.stdout) == MAX_STEPS - saved
    after = train_rows(tmp_path / "killed")
    kept = [r for r in before if int(r["step"]) <= saved]
    assert after[: len(kept)] == kept  # rows before the checkpoint are kept, clocks included
    assert differences(tmp_path / "straight", tmp_path / "killed") == []


# -- the comparison catches a resume that loses something ----------------------------------


def resume_with(monkeypatch, out: Path, broken) -> int:
    """Train 6 steps, then resume to 12 through a broken ``_resume``; return steps taken."""
    train_tiny_translation(out, max_steps=6, eval_every=3, average_last=2)
    real = Trainer._resume
    monkeypatch.setattr(Trainer, "_resume", lambda self, state: broken(self, state, real))
    taken = []
    step = Trainer._train_step
    monkeypatch.setattr(Trainer, "_train_step", lambda self, b: (taken.append(1), step(self, b))[1])
    train_tiny_translation(out, max_steps=12, eval_every=3, average_last=2, resume=True)
    return len(taken)


def lose_data_position(self, state, real):
    real(self, {**state, "batch_index": 0})


def lose_schedule(self, state, real):
    scheduler = self.scheduler.state_dict()
    real(self, state)
    self.scheduler.load_state_dict(scheduler)


def restart_from_zero(self, state, real):
    self.model.load_state_dict(state["model"])  # the weights, but nothing else


@pytest.mark.parametrize(
    "broken",
    [lose_data_position, lose_schedule, restart_from_zero, None],
    ids=lambda broken: getattr(broken, "__name__", "faithful"),
)
def test_the_comparison_catches_a_resume_that_loses_state(tmp_path, monkeypatch, broken):
    train_tiny_translation(tmp_path / "straight", max_steps=12, eval_every=3, average_last=2)
    taken = resume_with(
        monkeypatch, tmp_path / "resumed", broken or (lambda self, state, real: real(self, state))
    )
    caught = differences(tmp_path / "straight", tmp_path / "resumed") or taken != 12 - 6
    assert bool(caught) == (broken is not None)


def test_metrics_are_appended_and_a_torn_last_line_is_dropped_on_resume(tmp_path):
    path = tmp_path / ckpt.METRICS
    log = ckpt.MetricsLog(path, ("loss", "bleu"))
    for step in (1, 2, 3):
        log.add({"step": step, "train_loss": f"{1 / step:.4f}"})
    first_rows = path.read_bytes()
    log.add({"step": 4, "train_loss": "0.2"})
    assert path.read_bytes().startswith(first_rows)  # appended, not rewritten
    with open(path, "ab") as f:
        f.write(b"5,0,1.0,0.001,0.1")  # a row torn by a crash: no line end
    resumed = ckpt.MetricsLog(path, ("loss", "bleu"))
    resumed.resume(step=5)  # a checkpoint at step 5 (its row torn): the torn part goes
    resumed.add({"step": 5, "train_loss": "0.15"})
    rows = train_rows(tmp_path)
    assert [(r["step"], r["train_loss"]) for r in rows] == [
        ("1", "1.0000"), ("2", "0.5000"), ("3", "0.3333"), ("4", "0.2"), ("5", "0.15"),
    ]  # fmt: skip
    resumed.resume(step=3)  # rows after the checkpoint go too
    assert [r["step"] for r in train_rows(tmp_path)] == ["1", "2", "3"]
