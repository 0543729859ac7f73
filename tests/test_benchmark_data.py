"""No test text before testing: each benchmark's test texts reach no other stage's texts.

A benchmark module's ``pools(data)`` returns the texts each stage of its runs sees
(``tokenizer``, ``pretraining``, ``train``, ``selection``, ``test`` ...). A test text may appear
elsewhere only when the training file itself holds the same text (a natural duplicate, such
as a one-word sentence). The one other exception is the dataset's own dev file, the selection
pool: treebanks repeat short lines (``hi .``, ``great service``, a signature) in dev and test,
so it may share a few test texts, never more than ``SELECTION_DUPLICATES`` of them.
"""

import importlib
import inspect

import pytest
from benchmarks import harness

BENCHMARKS = ("vit_digits", "tagging_ud_ewt", "classification_sst2", "translation_multi30k")

# UD English-EWT's dev and test files share 14 short lines of 1,971 distinct test texts that
# its train file lacks; selecting on the test set would share all of them.
SELECTION_DUPLICATES = 0.02

needs_data = pytest.mark.skipif(
    not harness.DATA.is_dir(), reason=f"{harness.DATA} (the benchmarks' data) is absent"
)


def normal(text: str) -> str:
    """Texts compared case- and spacing-blind, so a re-cased or re-spaced copy still counts."""
    return " ".join(text.lower().split())


def leaks(pools: dict[str, list[str]]) -> dict[str, list[str]]:
    """Per pool, the test texts it holds that the training pool does not."""
    test = {normal(t) for t in pools["test"]}
    allowed = {normal(t) for t in pools.get("train", [])}
    found = {}
    for name, texts in pools.items():
        if name != "test":
            held = sorted(({normal(t) for t in texts} & test) - allowed)
            if held:
                found[name] = held
    return found


def pools_of(name: str) -> dict[str, list[str]]:
    """The module's ``pools`` on its own default data folder, or on ``harness.DATA``."""
    module = importlib.import_module(f"benchmarks.{name}")
    pools = getattr(module, "pools", None)
    if pools is None:
        pytest.skip(f"benchmarks/{name}.py defines no pools(data) to check")
    parameters = inspect.signature(pools).parameters.values()
    if all(p.default is not inspect.Parameter.empty for p in parameters):
        return pools()
    return pools(harness.DATA)


def test_leaks_finds_a_test_text_outside_training_and_allows_a_duplicate_in_it():
    pools = {
        "train": ["a fine film .", "yes ."],
        "pretraining": ["a fine film .", "A  Dull   Film .", "yes ."],
        "selection": ["yes ."],
        "test": ["a dull film .", "yes ."],
    }
    assert leaks(pools) == {"pretraining": ["a dull film ."]}
    assert leaks({**pools, "pretraining": pools["train"]}) == {}


@needs_data
@pytest.mark.parametrize("name", BENCHMARKS)
def test_no_test_text_reaches_another_pool(name):
    pools = pools_of(name)
    assert pools["test"], f"{name}: an empty test pool checks nothing"
    found = leaks(pools)
    shared = found.pop("selection", [])
    assert len(shared) <= SELECTION_DUPLICATES * len(set(pools["test"])), shared[:10]
    assert not found, {pool: texts[:3] for pool, texts in found.items()}


def test_selecting_on_the_test_set_is_more_than_natural_duplicates():
    test = [f"sentence {i} ." for i in range(100)]
    found = leaks({"train": [], "selection": test, "test": test})
    assert len(found["selection"]) > SELECTION_DUPLICATES * len(test)


def sst2_sentences(split: str) -> set[str]:
    from qkv.jobs.classification import read_labeled

    return {normal(t) for t in read_labeled(harness.DATA / "sst2" / f"stsa.binary.{split}").texts}


@needs_data
def test_sst2_dev_and_test_sentences_reach_neither_tokenizer_nor_pretraining():
    pools = pools_of("classification_sst2")
    train = sst2_sentences("train")
    for split in ("dev", "test"):
        held_out = sst2_sentences(split) - train
        for stage in ("tokenizer", "pretraining"):
            reached = held_out & {normal(t) for t in pools[stage]}
            assert not reached, f"{len(reached)} SST-2 {split} sentences reach the {stage}"


@needs_data
def test_the_check_catches_unlabeled_text_taken_from_sst2_dev_and_test():
    """The earlier recipe pretrained on dev and test sentences with their labels dropped."""
    pools = pools_of("classification_sst2")
    held_out = sorted(sst2_sentences("dev") | sst2_sentences("test"))
    leaky = {**pools, "pretraining": pools["pretraining"] + held_out}
    assert set(leaks(leaky)) == {"pretraining"}


@needs_data
def test_sst2_pools_are_what_the_classifier_job_reads_from_the_benchmark_options():
    from benchmarks.classification_sst2 import data_options

    from qkv.jobs.classification import JOB, ClassifierSettings

    options = data_options(harness.DATA)
    flags = list(zip(options[::2], options[1::2], strict=True))
    settings = ClassifierSettings(
        train=dict(flags)["--train"],
        valid=dict(flags)["--valid"],
        unlabeled=[value for flag, value in flags if flag == "--unlabeled"],
    )
    data = JOB.read_data(settings)
    pools = pools_of("classification_sst2")
    assert [*data["train"].texts, *data["unlabeled"]] == pools["pretraining"]
    assert data["valid"].texts == pools["selection"]
