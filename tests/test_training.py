import csv
import dataclasses
import math

import pytest
import torch

from qkv import checkpoint as ckpt
from qkv.errors import InputError
from qkv.model import Transformer
from qkv.training import (
    TrainConfig,
    beats,
    configure_optimizer,
    inverse_sqrt_schedule,
    learning_rate_schedule,
)

from .helpers import tiny_model_config, train_tiny_translation


def test_schedule_warms_up_then_decays_as_inverse_sqrt():
    factor = inverse_sqrt_schedule(100)
    assert factor(50) == pytest.approx(0.5)
    assert factor(100) == pytest.approx(1.0)
    assert factor(400) == pytest.approx(0.5)
    assert factor(1600) == pytest.approx(0.25)


def test_cosine_schedule_warms_up_then_falls_to_zero_at_max_steps():
    factor = learning_rate_schedule(
        TrainConfig(lr_schedule="cosine", warmup_steps=100, max_steps=1100)
    )
    assert factor(50) == pytest.approx(0.5)
    assert factor(100) == pytest.approx(1.0)
    assert factor(600) == pytest.approx(0.5)
    assert factor(1100) == pytest.approx(0.0)
    assert factor(5000) == pytest.approx(0.0)
    steps = [factor(s) for s in range(100, 1101)]
    assert all(a >= b for a, b in zip(steps, steps[1:], strict=False))
    paper = learning_rate_schedule(TrainConfig(warmup_steps=100, max_steps=1100))
    assert paper(400) == pytest.approx(0.5)


def test_cosine_schedule_follows_the_clock_when_time_runs_out_first():
    seconds = [0.0]
    config = TrainConfig(lr_schedule="cosine", warmup_steps=10, max_steps=1010, max_time=100.0)
    factor = learning_rate_schedule(config, lambda: seconds[0])
    assert factor(5) == pytest.approx(0.5)  # warmup goes by steps
    assert factor(510) == pytest.approx(0.5)  # half the steps, no time spent
    seconds[0] = 50.0
    assert factor(20) == pytest.approx(0.5)  # half the time, few steps
    assert factor(760) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.75)))  # steps ahead
    seconds[0] = 100.0
    assert factor(20) == 0.0
    untimed = dataclasses.replace(config, max_time=None)  # no --max-time: the clock is ignored
    assert learning_rate_schedule(untimed, lambda: 1e9)(510) == pytest.approx(0.5)


def test_a_run_bounded_by_time_anneals_to_zero_as_it_ends(tmp_path):
    summary = train(
        tmp_path / "run", max_steps=10**6, max_time=2.0, lr_schedule="cosine", eval_every=10**6
    )
    assert summary["stopped_by"] == "max_time" and summary["steps"] > 20
    rates = [float(r["lr"]) for r in read_metrics(tmp_path / "run") if r["train_loss"]]
    assert rates[-1] == 0.0
    after_warmup = rates[2:]
    assert max(after_warmup) > 0.5 * 3e-3
    assert all(a >= b for a, b in zip(after_warmup, after_warmup[1:], strict=False))


def test_every_parameter_in_exactly_one_optimizer_group():
    model = Transformer(tiny_model_config())
    optimizer = configure_optimizer(model, TrainConfig(weight_decay=0.01))
    grouped = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert sorted(grouped) == sorted({id(p) for p in model.parameters()})
    decayed = {id(p) for p in optimizer.param_groups[0]["params"]}
    assert id(model.encoder.layers[0].self_attn_sublayer.norm.weight) not in decayed
    assert id(model.encoder.layers[0].feed_forward.linear1.weight) in decayed


def test_bad_training_settings_name_themselves():
    with pytest.raises(InputError, match="accumulate=0"):
        TrainConfig(accumulate=0)
    with pytest.raises(InputError, match="precision='fp8'"):
        TrainConfig(precision="fp8")
    with pytest.raises(InputError, match="lr_schedule='linear'"):
        TrainConfig(lr_schedule="linear")


def train(out, **overrides):
    return train_tiny_translation(out, **overrides)


def read_metrics(run_dir):
    with open(run_dir / ckpt.METRICS, newline="") as f:
        return list(csv.DictReader(f))


def test_run_folder_holds_everything(tmp_path):
    summary = train(tmp_path / "run")
    run = tmp_path / "run"
    for name in (
        "config.json",
        "model.safetensors",
        "last.safetensors",
        "state.pt",
        "metrics.csv",
        "tokenizer.json",
        "summary.json",
    ):
        assert (run / name).is_file(), name
    assert summary["steps"] == 6 and summary["stopped_by"] == "max_steps"
    rows = read_metrics(run)
    assert [int(r["step"]) for r in rows if r["train_loss"]] == [1, 2, 3, 4, 5, 6]
    assert sum(1 for r in rows if r["val_bleu"]) == 2
    assert all(math.isfinite(float(r["train_loss"])) for r in rows if r["train_loss"])
    assert not list(run.glob(".*.tmp"))  # no temporary files left behind


def test_resume_continues_bit_for_bit(tmp_path):
    def run(out, max_steps, resume=False):
        torch.manual_seed(123)
        return train_tiny_translation(
            out, max_steps=max_steps, eval_every=3, accumulate=2, resume=resume
        )

    run(tmp_path / "straight", 9)
    run(tmp_path / "resumed", 6)
    run(tmp_path / "resumed", 9, resume=True)
    straight = Transformer(config_from(tmp_path / "straight"))
    resumed = Transformer(config_from(tmp_path / "resumed"))
    ckpt.load_weights(straight, tmp_path / "straight" / ckpt.LAST_WEIGHTS)
    ckpt.load_weights(resumed, tmp_path / "resumed" / ckpt.LAST_WEIGHTS)
    for (name, a), (_, b) in zip(
        straight.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    losses = lambda run: [r["train_loss"] for r in read_metrics(tmp_path / run)]  # noqa: E731
    assert losses("straight") == losses("resumed")


def config_from(run_dir):
    from qkv.config import ModelConfig

    return ModelConfig.from_dict(ckpt.read_run_config(run_dir)["model"])


def test_early_stopping_and_time_limit(tmp_path):
    summary = train(
        tmp_path / "patient", max_steps=200, eval_every=1, lr=1e-9, warmup_steps=0, patience=2
    )
    assert summary["stopped_by"] == "early_stopping"
    assert summary["steps"] < 200
    summary = train(tmp_path / "timed", max_steps=10_000, max_time=1.0)
    assert summary["stopped_by"] == "max_time" and summary["steps"] < 10_000


def test_best_checkpoint_and_averaging(tmp_path):
    summary = train(tmp_path / "avg", max_steps=9, eval_every=3, average_last=3)
    run = tmp_path / "avg"
    assert len(list((run / "checkpoints").glob("*.safetensors"))) == 3
    assert isinstance(summary["averaged_checkpoints"], bool)
    assert summary["best_val_bleu"] is not None


def test_atomic_write_keeps_the_old_file_on_a_crash(tmp_path):
    target = tmp_path / "file.json"
    ckpt.write_json(target, {"a": 1})

    def crash(tmp):
        tmp.write_text("half")
        raise RuntimeError("power cut")

    with pytest.raises(RuntimeError):
        ckpt.atomic_write(target, crash)
    assert target.read_text() == '{\n  "a": 1\n}\n'
    assert list(tmp_path.iterdir()) == [target]


def test_weights_round_trip_through_safetensors_with_tied_matrices(tmp_path):
    model = Transformer(tiny_model_config())
    ckpt.save_weights(model, tmp_path / "w.safetensors")
    other = Transformer(tiny_model_config())
    ckpt.load_weights(other, tmp_path / "w.safetensors")
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    assert other.output.proj.weight is other.tgt_embed.token.weight
    with pytest.raises(InputError, match="no weights here"):
        ckpt.load_weights(other, tmp_path / "missing.safetensors")


def test_too_little_data_for_one_step_is_an_error_not_a_hang(tmp_path):
    from .helpers import tiny_translation_settings

    settings = tiny_translation_settings(max_tokens=1_000_000)  # all pairs in one batch
    with pytest.raises(InputError, match="fills 1 batches, fewer than 2"):
        train_tiny_translation(tmp_path / "run", settings=settings, accumulate=2)


def test_fused_optimizer_agrees_with_the_reference_loop():
    torch.manual_seed(0)
    fused_model = Transformer(tiny_model_config()).eval()  # eval: no dropout to differ
    plain_model = Transformer(tiny_model_config()).eval()
    plain_model.load_state_dict(fused_model.state_dict())
    # eps 1e-6: the key biases get only rounding noise as gradients (softmax ignores them),
    # which Adam's tiny default eps would blow up into differences of summation order.
    config = TrainConfig(weight_decay=0.01, lr=1e-2, adam_eps=1e-6)
    fused = configure_optimizer(fused_model, config)
    assert fused.defaults["fused"]
    plain = torch.optim.AdamW(
        [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in
         configure_optimizer(plain_model, TrainConfig(weight_decay=0.01)).param_groups],
        lr=1e-2, betas=(0.9, 0.98), eps=1e-6, foreach=False,
    )  # fmt: skip
    src, tgt = torch.randint(1, 64, (2, 6)), torch.randint(1, 64, (2, 5))
    for _ in range(3):
        for model, optimizer in ((fused_model, fused), (plain_model, plain)):
            model(src, tgt).float().logsumexp(-1).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    for a, b in zip(fused_model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # steps move weights ~1e-2


def test_compile_wraps_the_training_module_and_trains_the_same(tmp_path, monkeypatch):
    """--compile goes through torch.compile; the eager backend keeps the test fast."""
    compiled = []
    real_compile = torch.compile

    def eager_compile(module, **kwargs):
        compiled.append(kwargs)
        return real_compile(module, backend="eager", **kwargs)

    monkeypatch.setattr(torch, "compile", eager_compile)
    torch.manual_seed(7)
    with_compile = train(tmp_path / "compiled", max_steps=3, compile=True)
    torch.manual_seed(7)
    without = train(tmp_path / "plain", max_steps=3)
    assert compiled == [{"dynamic": True}]
    assert with_compile["steps"] == without["steps"] == 3
    losses = [
        [float(r["train_loss"]) for r in read_metrics(tmp_path / run) if r["train_loss"]]
        for run in ("compiled", "plain")
    ]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_a_tie_of_the_metric_goes_to_the_lower_loss():
    assert beats({"accuracy": 90.0, "loss": 0.5}, "accuracy", (None, None))
    assert beats({"accuracy": 91.0, "loss": 0.9}, "accuracy", (90.0, 0.5))
    assert beats({"accuracy": 90.0, "loss": 0.4}, "accuracy", (90.0, 0.5))
    assert not beats({"accuracy": 90.0, "loss": 0.5}, "accuracy", (90.0, 0.5))
    assert not beats({"accuracy": 89.0, "loss": 0.1}, "accuracy", (90.0, 0.5))
    assert not beats({"accuracy": 90.0}, "accuracy", (90.0, 0.5))  # no loss: no tie-break
    assert not beats({"accuracy": 90.0, "loss": 0.1}, "accuracy", (90.0, None))


def test_the_kept_weights_are_the_best_validated_with_ties_to_the_lower_loss(tmp_path):
    run = tmp_path / "ties"
    train(run, max_steps=8, eval_every=2, average_last=10)
    rows = [r for r in read_metrics(run) if r["val_bleu"] and not r["note"]]
    best = max(rows, key=lambda r: (float(r["val_bleu"]), -float(r["val_loss"])))
    assert sum(r["val_bleu"] == best["val_bleu"] for r in rows) > 1  # a tie to break
    model = Transformer(config_from(run))
    expected = Transformer(config_from(run))
    ckpt.load_weights(model, run / ckpt.WEIGHTS)
    ckpt.load_weights(expected, run / "checkpoints" / f"step_{best['step']}.safetensors")
    for (name, a), (_, b) in zip(
        model.state_dict().items(), expected.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_the_validations_after_the_loop_are_marked_and_only_the_average_leaves_the_curve(
    tmp_path,
):
    from qkv.viz.curves import read_metrics as curve_series

    run = tmp_path / "marked"
    train(run, max_steps=5, eval_every=2, average_last=3)  # stops off a validation step
    after = [(r["step"], r["note"]) for r in read_metrics(run) if r["note"]]
    assert after == [("5", "final"), ("5", "averaged")]
    steps = [step for step, _ in curve_series(run / ckpt.METRICS)["val_loss"]]
    assert steps == [2.0, 4.0, 5.0]  # the last step's own weights end the curve
