"""Pooling one benchmark's seeds from their own results JSONs (benchmarks/pool.py), and the
README's translation mean ± sd read back against the committed JSONs."""

import json
import re
import statistics
from pathlib import Path

import pytest
from benchmarks.harness import mean_sd
from benchmarks.pool import pool, table

ROOT = Path(__file__).resolve().parents[1]


def report(seed: int, greedy: float, beam: float, benchmark="translation_multi30k") -> dict:
    return {
        "benchmark": benchmark,
        "test2016_bleu": {"qkv": {"greedy": mean_sd([greedy]), "beam": mean_sd([beam])}},
        "runs": [{"seed": seed, "qkv": {"greedy": greedy}}],
    }


def test_pooling_gives_the_mean_and_sample_sd_of_every_seed():
    pooled = pool([report(3, 39.0, 41.2), report(1, 39.42, 40.94), report(2, 39.85, 40.73)])
    greedy = pooled["figures"]["test2016_bleu"]["qkv"]["greedy"]
    assert pooled["seeds"] == [1, 2, 3]
    assert greedy["values"] == [39.42, 39.85, 39.0]  # in the order of the seeds
    assert greedy["mean"] == round(statistics.fmean([39.42, 39.85, 39.0]), 2)
    assert greedy["sd"] == round(statistics.stdev([39.42, 39.85, 39.0]), 2)
    assert "qkv beam: 40.96 ± 0.24 (40.94, 40.73, 41.20)" in table(pooled)


def test_a_seed_in_two_files_or_two_benchmarks_are_refused():
    with pytest.raises(SystemExit, match="seed 1"):
        pool([report(1, 39.0, 40.0), report(1, 39.5, 40.5)])
    with pytest.raises(SystemExit, match="different benchmarks"):
        pool([report(1, 39.0, 40.0), report(2, 94.0, 94.0, benchmark="tagging_ud_ewt")])


ZEN4 = {"processor": "AMD EPYC", "cpu_generation": "AuthenticAMD family 25 model 17 stepping 1"}
ZEN5 = {"processor": "AMD EPYC", "cpu_generation": "AuthenticAMD family 26 model 2 stepping 1"}


def test_seeds_from_two_machines_of_one_name_are_refused_unless_asked():
    first, second = report(1, 39.0, 40.0), report(2, 40.0, 41.0)
    first["machine"], second["machine"] = (
        {**ZEN4, "load_average": [0.1]},
        {**ZEN4, "load_average": [1.9]},
    )
    assert pool([first, second])["figures"]["test2016_bleu"]["qkv"]["greedy"]["n"] == 2
    second["machine"] = ZEN5
    with pytest.raises(SystemExit, match="different machines.*family 25.*family 26"):
        pool([first, second])
    mixed = pool([first, second], mixed_machines=True)
    assert mixed["figures"]["test2016_bleu"]["qkv"]["greedy"]["values"] == [39.0, 40.0]
    assert len(mixed["machines"]) == 2


def test_a_seed_whose_machine_cannot_be_told_apart_is_refused():
    first, second = report(1, 39.0, 40.0), report(2, 40.0, 41.0)
    first["machine"], second["machine"] = {"processor": "AMD EPYC"}, ZEN5  # older: no generation
    with pytest.raises(SystemExit, match="cpu_generation \\?"):
        pool([first, second])


def test_a_multi_seed_file_pools_with_single_seed_files():
    three = report(1, 0.0, 0.0)
    three["test2016_bleu"]["qkv"]["greedy"] = mean_sd([39.0, 39.5])
    three["test2016_bleu"]["qkv"]["beam"] = mean_sd([40.0, 40.5])
    three["runs"] = [{"seed": 1}, {"seed": 2}]
    pooled = pool([three, report(3, 40.0, 41.0)])
    assert pooled["figures"]["test2016_bleu"]["qkv"]["greedy"]["values"] == [39.0, 39.5, 40.0]


def test_the_readme_translation_means_are_the_committed_seeds_pooled():
    files = sorted((ROOT / "benchmarks" / "results").glob("translation_multi30k*.json"))
    pooled = pool([json.loads(f.read_text()) for f in files])["figures"]["test2016_bleu"]
    readme = (ROOT / "README.md").read_text()
    rows = {
        side: re.search(rf"^\| \**{side}\**, mean ± sd \| \| (.*) \|$", readme, re.MULTILINE)
        for side in ("qkv", "peer")
    }
    for side, row in rows.items():
        assert row, f"the README has no {side} mean ± sd row"
        cells = [cell.strip(" *") for cell in row.group(1).split("|")]
        expected = [
            f"{pooled[side][m]['mean']:.2f} ± {pooled[side][m]['sd']:.2f}"
            for m in ("greedy", "beam")
        ]
        assert cells == expected, f"{side}: the README says {cells}, the JSONs give {expected}"


def test_the_readme_tagging_row_is_the_committed_seeds_pooled():
    files = sorted((ROOT / "benchmarks" / "results").glob("tagging_ud_ewt*.json"))
    summary = pool([json.loads(f.read_text()) for f in files])["figures"]["summary"]
    readme = (ROOT / "README.md").read_text()
    rows = [
        line for line in readme.splitlines() if line.startswith("| part-of-speech tagging | UD")
    ]
    assert len(rows) == 1, "the README has no tagging row in its quality table"
    row = rows[0]
    for side in ("qkv", "peer"):
        for figure in ("accuracy", "unseen_word_accuracy"):
            pooled = summary[side][figure]
            assert f"{pooled['mean']:.2f} ± {pooled['sd']:.2f}%" in row, (side, figure)
