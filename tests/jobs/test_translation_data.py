"""Translation data: parallel readers, TSV, Hugging Face datasets, teacher-forcing batches."""

import sys
import types

import pytest
import torch
from torch.testing import assert_close

from qkv.data import BOS_ID, EOS_ID, PAD_ID
from qkv.errors import InputError
from qkv.jobs.translation.data import (
    clean_pairs,
    make_translation_batch,
    read_hf_dataset,
    read_pairs,
    read_parallel,
    read_tsv,
)

from ..test_data import write


def test_read_parallel_aligned(tmp_path):
    src = write(tmp_path, "train.de", "Hallo\nWelt\n")
    tgt = write(tmp_path, "train.en", "Hello\nworld\n")
    assert read_parallel(src, tgt) == [("Hallo", "Hello"), ("Welt", "world")]


def test_read_parallel_different_line_counts_names_both(tmp_path):
    src = write(tmp_path, "train.de", "a\nb\nc\n")
    tgt = write(tmp_path, "train.en", "a\nb\n")
    with pytest.raises(InputError) as info:
        read_parallel(src, tgt)
    message = str(info.value)
    assert message.startswith(f"{src}: has 3 lines but {tgt} has 2")


def test_read_tsv_keeps_blank_lines_as_empty_pairs(tmp_path):
    path = write(tmp_path, "train.tsv", "Hallo\tHello\n\nWelt\tworld\n")
    assert read_tsv(path) == [("Hallo", "Hello"), ("", ""), ("Welt", "world")]


@pytest.mark.parametrize(("line", "tabs"), [("no tab here", 0), ("a\tb\tc", 2)])
def test_read_tsv_line_without_one_tab_names_its_line(tmp_path, line, tabs):
    path = write(tmp_path, "train.tsv", f"Hallo\tHello\n{line}\n")
    with pytest.raises(
        InputError, match=rf"train\.tsv:2: expected source<TAB>target but found {tabs}"
    ):
        read_tsv(path)


def test_clean_pairs_counts():
    pairs = [("a b", "c"), ("", "x"), ("x", "   "), ("a b c d", "e"), ("f", "g h i j"), ("k", "l")]
    kept, counts = clean_pairs(pairs, max_len=3, count_tokens=lambda s: len(s.split()))
    assert kept == [("a b", "c"), ("k", "l")]
    assert counts == {"empty": 2, "too_long": 2, "kept": 2}


# ---------------------------------------------------------------- Hugging Face datasets


def test_read_hf_dataset_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(InputError, match="pip install datasets"):
        read_hf_dataset(object())


class _StandInDataset:
    """Only what read_hf_dataset uses of ``datasets.Dataset``, for runs without the package."""

    def __init__(self, columns):
        self._columns = columns

    @classmethod
    def from_dict(cls, columns):
        return cls(columns)

    @property
    def column_names(self):
        return list(self._columns)

    def __getitem__(self, column):
        return self._columns[column]


@pytest.fixture(params=["stand-in", "real"])
def datasets_module(request, monkeypatch):
    if request.param == "real":
        return pytest.importorskip("datasets", reason="datasets is an optional dependency")
    module = types.ModuleType("datasets")
    module.Dataset = _StandInDataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    return module


def test_read_hf_dataset_translation_column(datasets_module):
    dataset = datasets_module.Dataset.from_dict(
        {"translation": [{"de": "Hallo", "en": "Hello"}, {"de": "Welt", "en": "world"}]}
    )
    assert read_hf_dataset(dataset, "de", "en") == [("Hallo", "Hello"), ("Welt", "world")]
    assert read_hf_dataset(dataset, "en", "de") == [("Hello", "Hallo"), ("world", "Welt")]
    with pytest.raises(InputError, match="'fr'"):
        read_hf_dataset(dataset, "fr", "en")
    with pytest.raises(InputError, match="no column 'src'"):
        read_hf_dataset(dataset)


def test_read_hf_dataset_two_string_columns(datasets_module):
    dataset = datasets_module.Dataset.from_dict(
        {"source": ["Hallo", None], "target": ["Hello", "world"], "id": [0, 1]}
    )
    pairs = read_hf_dataset(dataset, src_field="source", tgt_field="target")
    assert pairs == [("Hallo", "Hello"), ("", "world")]
    with pytest.raises(InputError, match="expected a string"):
        read_hf_dataset(dataset, src_field="id", tgt_field="target")


def test_read_hf_dataset_rejects_other_objects(datasets_module):
    with pytest.raises(InputError, match="expected a datasets.Dataset but got dict"):
        read_hf_dataset({"train": []})


def test_make_translation_batch_shapes_and_bos_eos():
    batch = make_translation_batch([[10, 11, 12], [13]], [[20, 21], [22, 23, 24, 25]])
    assert_close(batch.src, torch.tensor([[10, 11, 12, EOS_ID], [13, EOS_ID, PAD_ID, PAD_ID]]))
    assert_close(
        batch.tgt_in, torch.tensor([[BOS_ID, 20, 21, PAD_ID, PAD_ID], [BOS_ID, 22, 23, 24, 25]])
    )
    assert_close(
        batch.tgt_out, torch.tensor([[20, 21, EOS_ID, PAD_ID, PAD_ID], [22, 23, 24, 25, EOS_ID]])
    )
    assert batch.n_tokens == 3 + 5
    assert batch.to("cpu").tgt_out.shape == (2, 5)


def test_make_translation_batch_rejects_unpaired_lists():
    with pytest.raises(ValueError, match="2 source sequences but 1 target"):
        make_translation_batch([[1], [2]], [[3]])


def test_read_pairs_prefix_or_tsv(tmp_path):
    write(tmp_path, "train.de", "Hallo\nWelt\n")
    write(tmp_path, "train.en", "Hello\nworld\n")
    tsv = write(tmp_path, "train.tsv", "Hallo\tHello\n")
    assert read_pairs(tmp_path / "train", "de", "en") == [("Hallo", "Hello"), ("Welt", "world")]
    assert read_pairs(tsv, None, None) == [("Hallo", "Hello")]
    with pytest.raises(InputError, match="both --source-lang and --target-lang"):
        read_pairs(tmp_path / "train", "de", None)
    with pytest.raises(InputError, match="--valid .*: no such file; give a source<TAB>target"):
        read_pairs(tmp_path / "train", None, None, "--valid")
    with pytest.raises(InputError, match="--train is missing"):
        read_pairs(None, None, None)


def test_bpe_dropout_resplits_the_training_pairs_each_epoch():
    from qkv.data import SubwordTokenizer
    from qkv.jobs.translation.task import TranslationTask

    from ..test_data import CORPUS, shuffled_texts

    tokenizer = SubwordTokenizer.train(CORPUS * 10, vocab_size=200)
    pairs = list(zip(shuffled_texts(60, 2), shuffled_texts(60, 3), strict=True))
    plain = TranslationTask(tokenizer, pairs, pairs[:2], max_tokens=200, label_smoothing=0.1)
    resplit = TranslationTask(
        tokenizer, pairs, pairs[:2], max_tokens=200, label_smoothing=0.1, bpe_dropout=0.2
    )

    def texts(batches):  # every pair, decoded, in a fixed order
        rows = [
            (tokenizer.decode(s), tokenizer.decode(t))
            for b in batches
            for s, t in zip(b.src.tolist(), b.tgt_out.tolist(), strict=True)
        ]
        return sorted(rows)

    def tokens(batches):
        return sum(int((b.tgt_out != PAD_ID).sum()) for b in batches)

    assert texts(resplit.train_batches(0, 1)) == texts(plain.train_batches(0, 1))
    assert tokens(resplit.train_batches(0, 1)) > tokens(plain.train_batches(0, 1))
    src0, _ = resplit.train_ids(0, 1)
    assert resplit.train_ids(0, 1)[0] == src0 and resplit.train_ids(1, 1)[0] != src0
    assert plain.train_ids(0, 1) == plain.train_ids(1, 1)


def test_bpe_and_word_dropout_option_ranges():
    from qkv.jobs.translation import TranslationSettings

    with pytest.raises(InputError, match="--bpe-dropout 1.0 must be in"):
        TranslationSettings(train="t", valid="v", bpe_dropout=1.0).check()
    with pytest.raises(InputError, match=r"--word-dropout -0.1 must be in \[0, 1\)"):
        TranslationSettings(train="t", valid="v", word_dropout=-0.1).check()
    TranslationSettings(train="t", valid="v", bpe_dropout=0.0, word_dropout=0.5).check()
