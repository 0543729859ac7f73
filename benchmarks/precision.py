"""Does ``--precision auto``'s probe pick the faster precision? Per job, on its real batches.

    .venv/bin/python benchmarks/precision.py [--data DIR] [--rounds N] [--steps N] [--result PATH]

For each job's default model and training batches: the probe's figure (the model's linear
layers, forward and backward, fp32 against bf16 autocast with its casts; what ``auto``
decides by) and whole training steps (forward, backward, optimizer) in fp32 and in bf16
autocast, in interleaved rounds. The probe is right for a job when it is above
``MIN_LAYER_SPEEDUP`` exactly where a bf16 step is faster.

Writes benchmarks/results/precision.json (or --result PATH) with the machine and command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

# Run as a script, only benchmarks/ is on the path; the root makes `benchmarks` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import classification_sst2, harness, tagging_ud_ewt, translation_multi30k
from benchmarks.measure import interleaved, machine, ratios, summary

RESULT = harness.RESULTS / "precision.json"
JOBS = ("translation", "tagger", "classifier", "vit")


def job_data(name: str, data: Path) -> dict[str, Any]:
    """The data options of ``name``, where its quality benchmark reads them under ``data``
    (the shared data folder; the ViT's digits need none)."""
    multi30k = data / translation_multi30k.DATA.name
    treebank = data / tagging_ud_ewt.DATA.name
    return {
        "translation": {
            "train": str(multi30k / "train"),
            "valid": str(multi30k / "val"),
            "source_lang": "de",
            "target_lang": "en",
        },
        "tagger": {
            "train": str(treebank / tagging_ud_ewt.TRAIN),
            "valid": str(treebank / tagging_ud_ewt.DEV),
        },
        "classifier": {
            "train": str(classification_sst2.split_file(data, "train")),
            "valid": str(classification_sst2.split_file(data, "dev")),
        },
        "vit": {},
    }[name]


def job_section(name: str, data: Path, rounds: int, steps: int) -> dict[str, Any]:
    """The probe's figure and fp32 / bf16 training steps of job ``name``'s default model."""
    from qkv.config import ModelConfig
    from qkv.jobs import get_job
    from qkv.precision import faster_precision, linear_shapes, measure_layer_speedup
    from qkv.training import TrainConfig, configure_optimizer

    job = get_job(name)
    settings = job.resolve(job.Settings(**job_data(name, data)))
    inputs = job.read_data(settings)
    with tempfile.TemporaryDirectory() as tmp:
        prepared = job.prepare(settings, inputs, Path(tmp))
    model_defaults = ModelConfig.preset(job.preset, **job.model_defaults)
    config = job.model_config(model_defaults, settings, prepared)
    torch.manual_seed(1)
    model = job.build_model(config, settings, prepared).train()
    task = job.build_task(settings, prepared, inputs)
    batches = task.train_batches(0, 1)
    optimizer = configure_optimizer(model, TrainConfig(**job.train_defaults))

    def runner(dtype: torch.dtype | None):
        def run(r: int) -> int:
            for i in range(steps):
                batch = batches[(r * steps + i) % len(batches)]
                cast = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
                with cast:
                    loss, _ = task.loss(model, batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            return steps

        return run

    runners = {"fp32": runner(None), "bf16": runner(torch.bfloat16)}
    for run in runners.values():
        run(0)  # warm-up: oneDNN compiles its kernels for these shapes
    rates = interleaved(runners, rounds)  # steps per second
    shapes = linear_shapes(model)
    probe = measure_layer_speedup(torch.device("cpu"), shapes)
    step_speedup = ratios(rates["bf16"], rates["fp32"])
    return {
        "linear_shapes": [list(s) for s in shapes],
        "probe_bf16_speedup": round(probe, 3),
        "auto_chooses": faster_precision(probe),
        "ms_per_step": {k: summary([1000 / r for r in v]) for k, v in rates.items()},
        "step_bf16_speedup": step_speedup,
        "faster_step": "bf16" if step_speedup["median"] > 1 else "fp32",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=harness.DATA, help="the shared data folder")
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=JOBS)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="training steps per round")
    parser.add_argument("--result", type=Path, default=RESULT)
    args = parser.parse_args()
    from qkv.precision import MIN_LAYER_SPEEDUP

    jobs = {}
    for name in args.jobs:
        jobs[name] = job_section(name, args.data, args.rounds, args.steps)
        print(name, json.dumps(jobs[name]), flush=True)
    result = {
        "benchmark": "precision",
        "command": "python " + shlex.join(["benchmarks/precision.py", *sys.argv[1:]]),
        "machine": machine(repeats=3),
        "min_layer_speedup": MIN_LAYER_SPEEDUP,
        "unit": "training steps of each job's default model on its own batches",
        "jobs": jobs,
        "probe_right": all(j["auto_chooses"] == j["faster_step"] for j in jobs.values()),
    }
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.result}")


if __name__ == "__main__":
    main()
