"""The options every benchmark shares: which seeds run, and how their figures are summed up."""

import argparse

from benchmarks import harness


def parsed(*argv: str, seeds: int = 3) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    harness.common_arguments(parser, budget_seconds=60.0, seeds=seeds)
    return parser.parse_args(list(argv))


def test_seeds_run_from_one_by_default_and_from_first_seed_when_given():
    assert list(harness.seeds(parsed())) == [1, 2, 3]
    assert list(harness.seeds(parsed("--seeds", "1", seeds=1))) == [1]
    # a long benchmark's second seed in an invocation of its own
    assert list(harness.seeds(parsed("--first-seed", "2", "--seeds", "1", seeds=1))) == [2]
    assert list(harness.seeds(parsed("--first-seed", "4"))) == [4, 5, 6]


def test_train_options_split_as_a_shell_would_and_default_to_none():
    assert parsed().train_options == []
    options = parsed("--train-options", "--max-tokens 1600 --label-smoothing '0.1'")
    assert options.train_options == ["--max-tokens", "1600", "--label-smoothing", "0.1"]


def test_mean_sd_is_the_sample_standard_deviation():
    figure = harness.mean_sd([79.08, 80.07, 78.91])
    assert figure["mean"] == 79.35 and figure["sd"] == 0.63 and figure["n"] == 3
    assert harness.mean_sd([40.0])["sd"] == 0.0
