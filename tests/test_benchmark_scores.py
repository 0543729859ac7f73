"""The tagging benchmark's scores: accuracy by how often the training file holds each word,
and the commonest confusions (the figures the README gives for the tagger's errors)."""

from collections import Counter

from benchmarks.tagging_ud_ewt import RARE, accuracy, confusions

from qkv.jobs.tagging import TaggedSentence


def sentence(pairs: str) -> TaggedSentence:
    words, tags = zip(*(p.split("/") for p in pairs.split()), strict=True)
    return TaggedSentence(list(words), list(tags), [])


def test_accuracy_splits_words_by_their_training_count():
    counts = Counter({"the": RARE, "dog": RARE - 1})  # frequent, rare; "barks" unseen
    gold = [sentence("the/DET dog/NOUN barks/VERB"), sentence("the/DET dog/NOUN")]
    predicted = [["DET", "NOUN", "NOUN"], ["DET", "VERB"]]
    scores = accuracy(predicted, gold, counts)
    assert scores["accuracy"] == 60.0  # 3 of 5
    assert (scores["rare_words"], scores["rare_word_accuracy"]) == (2, 50.0)
    assert (scores["unseen_words"], scores["unseen_word_accuracy"]) == (1, 0.0)


def test_confusions_rank_errors_by_count_with_their_words():
    gold = [sentence("a/DET run/VERB run/VERB big/ADJ")]
    predicted = [["DET", "NOUN", "NOUN", "NOUN"]]
    assert confusions(predicted, gold, top=1) == [("VERB", "NOUN", 2, ["run", "run"])]
    assert [c[:3] for c in confusions(predicted, gold)] == [
        ("VERB", "NOUN", 2),
        ("ADJ", "NOUN", 1),
    ]
