import pytest
import torch

from qkv.data import UNK_ID, SubwordTokenizer
from qkv.errors import InputError
from qkv.jobs.translation import TranslationTask, Translator, corpus_scores

from ..helpers import tiny_pairs, train_tiny_translation


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("translation") / "run"
    splits = tiny_pairs(n_train=300)
    torch.manual_seed(0)
    data = {"train": splits["train"], "valid": splits["valid"]}
    train_tiny_translation(out, data=data, max_steps=30, eval_every=15)
    return out


def test_translate_one_by_one_equals_one_batch(run_dir):
    sentences = [s for s, _ in tiny_pairs()["test"]][:8]
    for beam in (1, 3):
        translator = Translator.load(run_dir, beam_size=beam)
        together = translator.translate(sentences)
        alone = [translator.translate([s])[0] for s in sentences]
        assert together == alone
        assert all(isinstance(t, str) for t in together)


def test_empty_lines_stay_empty(run_dir):
    translator = Translator.load(run_dir, beam_size=2)
    out = translator.translate(["the dog sees a cat", "", "   ", "my queen swims"])
    assert len(out) == 4 and out[1] == "" and out[2] == ""


def test_evaluate_scores(run_dir):
    pairs = tiny_pairs()["test"]
    translator = Translator.load(run_dir, beam_size=1)
    scores = translator.evaluate([s for s, _ in pairs], [t for _, t in pairs])
    assert set(scores) == {"bleu", "chrf", "exact_match"}
    assert 0 <= scores["bleu"] <= 100
    with pytest.raises(InputError, match="references"):
        translator.evaluate(["a"], [])


def test_corpus_scores_of_perfect_output():
    refs = ["the cat sat on the mat", "a dog ran home today"]
    scores = corpus_scores(refs, refs)
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["exact_match"] == 100.0
    assert corpus_scores(["x y z", "q"], refs)["exact_match"] == 0.0


def test_load_refuses_what_is_not_a_translation_run(tmp_path):
    with pytest.raises(InputError, match="no such run folder"):
        Translator.load(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a qkv run folder"):
        Translator.load(tmp_path / "empty")


def test_empty_and_overlong_pairs_are_skipped_and_counted(tmp_path, capsys):
    splits = tiny_pairs(n_train=100)
    train = splits["train"] + [("", "x"), ("y", "  "), (" ".join(["dog"] * 80), "z")]
    data = {"train": train, "valid": splits["valid"]}
    summary = train_tiny_translation(tmp_path / "run", data=data, max_steps=1)
    assert summary["steps"] == 1
    out = capsys.readouterr().out
    assert "skipped 2 pairs with an empty side and 1 over --max-len 40; 100 kept" in out


def test_word_dropout_hides_source_subwords_from_the_training_model_only():
    pairs = tiny_pairs(n_train=60)["train"]
    tokenizer = SubwordTokenizer.train([side for pair in pairs for side in pair], 200)
    seen = []

    def model(src, tgt_in, select):
        seen.append((src, tgt_in))
        return torch.zeros(int(select.sum()), tokenizer.vocab_size, requires_grad=True)

    for chance in (0.0, 0.5):
        task = TranslationTask(tokenizer, pairs, pairs[:4], 4000, 0.1, word_dropout=chance)
        batch = task.train_batches(0, seed=1)[0]
        torch.manual_seed(0)
        task.loss(model, batch)
        src, tgt_in = seen[-1]
        assert torch.equal(tgt_in, batch.tgt_in)  # the decoder's input is never hidden
        changed = src != batch.src
        if chance == 0:
            assert not changed.any()
        else:
            assert (src[changed] == UNK_ID).all() and changed.any()
            assert changed.sum() < 0.7 * (batch.src > UNK_ID).sum()


def test_validation_sees_every_source_subword_whatever_the_word_dropout():
    from qkv import Transformer

    from ..helpers import tiny_model_config

    pairs = tiny_pairs(n_train=60)["train"]
    tokenizer = SubwordTokenizer.train([side for pair in pairs for side in pair], 200)
    v = tokenizer.vocab_size
    model = Transformer(tiny_model_config(src_vocab_size=v, tgt_vocab_size=v)).eval()
    scores = []
    for chance in (0.0, 0.9):
        task = TranslationTask(tokenizer, pairs, pairs[:6], 4000, 0.1, word_dropout=chance)
        torch.manual_seed(0)
        scores.append(task.validate(model))
    assert scores[0] == scores[1] and scores[0]["loss"] > 0
