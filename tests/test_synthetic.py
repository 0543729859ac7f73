"""Tests for qkv/synthetic.py: determinism, held-out splits, reordering and inflection."""

from __future__ import annotations

import random
from collections import Counter
from itertools import pairwise

import pytest

from qkv import synthetic
from qkv.synthetic import SyntheticLanguage, make_pairs, make_splits, write_parallel


@pytest.fixture(scope="module")
def language() -> SyntheticLanguage:
    return SyntheticLanguage(seed=0)


@pytest.fixture(scope="module")
def analyzed(language: SyntheticLanguage) -> list[tuple[list[str], list[synthetic.Word], list]]:
    """Sampled pairs with the target side analysed through the lexicon."""
    rng = random.Random(123)
    out = []
    for _ in range(2000):
        source, target, links = language.aligned_pair(rng)
        out.append((source.split(), [language.analyze(w) for w in target.split()], links))
    return out


def test_same_seed_same_pairs():
    assert make_pairs(200, seed=3, language_seed=5) == make_pairs(200, seed=3, language_seed=5)
    assert make_splits(50, 10, 10, seed=2) == make_splits(50, 10, 10, seed=2)


def test_other_seed_other_pairs():
    base = make_pairs(200, seed=0, language_seed=0)
    assert make_pairs(200, seed=1, language_seed=0) != base
    other_language = make_pairs(200, seed=0, language_seed=1)
    # The language seed changes the invented words, not the sampled source sentences.
    assert [s for s, _ in other_language] == [s for s, _ in base]
    assert all(t1 != t2 for (_, t1), (_, t2) in zip(other_language, base, strict=True))


def test_splits_are_disjoint_and_sized():
    splits = make_splits(3000, 300, 300, seed=7)
    assert {k: len(v) for k, v in splits.items()} == {"train": 3000, "valid": 300, "test": 300}
    sources = {k: {s for s, _ in v} for k, v in splits.items()}
    assert all(len(sources[k]) == len(splits[k]) for k in splits)
    assert not sources["train"] & sources["valid"]
    assert not sources["train"] & sources["test"]
    assert not sources["valid"] & sources["test"]


def test_few_duplicate_sentences():
    sources = [s for s, _ in make_pairs(20000, seed=0)]
    assert len(set(sources)) >= 0.99 * len(sources)


def test_word_for_word_alignment(language, analyzed):
    for source, target, links in analyzed:
        assert len(source) == len(target)
        assert sorted(i for i, _ in links) == list(range(len(source)))
        assert sorted(j for _, j in links) == list(range(len(target)))
        for i, j in links:
            word = target[j]
            if word.category == "noun":
                number = word.features[0]
                assert source[i] == language.noun(word.lemma, number, "subj")[0]
            elif word.category == "verb":
                assert source[i] == language.verb(word.lemma, *word.features)[0]
            elif word.category == "det":
                assert source[i] in (*synthetic.DETERMINERS[word.lemma], "an")
            else:
                assert source[i] == word.lemma


def test_target_is_verb_final_with_object_before_verb(analyzed):
    with_object = 0
    for _, target, _ in analyzed:
        assert target[-1].category == "verb"
        cases = [w.features[1] for w in target if w.category == "noun"]
        assert cases[0] == "subj" and cases.count("subj") == 1
        if "obj" in cases:
            with_object += 1
            assert cases[-1] == "obj"
    assert with_object > 0.5 * len(analyzed)


def test_adjectives_follow_nouns_in_target_and_precede_them_in_source(language, analyzed):
    adjectives = set(synthetic.ADJECTIVES)
    nouns = {f for n in synthetic.NOUNS for f in (n, synthetic.plural(n))}
    n_adjectives = 0
    for source, target, _ in analyzed:
        for k, word in enumerate(target):
            if word.category == "adj":
                n_adjectives += 1
                assert target[k - 1].category in ("noun", "adj")
        for k, word in enumerate(source):
            if word in adjectives:
                assert source[k + 1] in adjectives or source[k + 1] in nouns
    assert n_adjectives > 0


def test_prepositional_phrase_becomes_postposition_after_subject(analyzed):
    n_moved = 0
    for _, target, links in analyzed:
        if not any(w.category == "postp" for w in target):
            continue
        n_moved += 1
        k = next(k for k, w in enumerate(target) if w.category == "postp")
        # The postposition closes its noun phrase (noun adj* det), which follows the subject's.
        assert target[k - 1].category == "det"
        nouns_before = [w.features[1] for w in target[:k] if w.category == "noun"]
        assert nouns_before == ["subj", "obl"]
        # In the source the preposition comes after the verb; in the target, before it.
        source_of = dict((j, i) for i, j in links)
        assert source_of[k] > source_of[len(target) - 1]
    assert n_moved > 0.2 * len(analyzed)


def test_alignment_is_not_monotonic(analyzed):
    crossing = sum(any(a[0] > b[0] for a, b in pairwise(links)) for _, _, links in analyzed)
    assert crossing == len(analyzed)


def test_number_and_case_inflection(language, analyzed):
    for noun in synthetic.NOUNS:
        forms = {language.noun(noun, n, c)[1] for n in synthetic.NUMBERS for c in synthetic.CASES}
        assert len(forms) == 6
        assert language.noun(noun, "sg", "subj")[0] != language.noun(noun, "pl", "subj")[0]
    for verb in language.transitive + language.intransitive:
        forms = {language.verb(verb, t, n)[1] for t in synthetic.TENSES for n in synthetic.NUMBERS}
        assert len(forms) == 4
        assert language.verb(verb, "present", "sg")[0] != language.verb(verb, "past", "sg")[0]
    # The verb agrees with the subject's number in every sentence, past tense included.
    for _, target, _ in analyzed:
        subject = next(w for w in target if w.category == "noun")
        assert target[-1].features[1] == subject.features[0]


def test_same_lemma_same_stem(language):
    for noun in synthetic.NOUNS:
        forms = [language.noun(noun, n, "obj")[1] for n in synthetic.NUMBERS]
        stem = language.stem["noun", noun]
        assert all(f.startswith(stem) for f in forms)
        assert {language.analyze(f).lemma for f in forms} == {noun}


def test_vocabulary_sizes(language):
    counts = Counter(category for category, _ in language.stem)
    assert 60 <= counts["noun"] <= 100
    assert 30 <= counts["verb"] <= 50
    assert 20 <= counts["adj"] <= 30
    assert 150 <= len(language.stem) <= 250
    assert 250 <= len(language.source_vocabulary()) <= 500
    assert 500 <= len(language.target_vocabulary()) <= 1000
    sampled = make_pairs(5000)
    assert {w for s, _ in sampled for w in s.split()} <= language.source_vocabulary()
    assert {w for _, t in sampled for w in t.split()} <= language.target_vocabulary()


def test_source_words_name_one_lemma(language):
    lemmas: dict[str, set[str]] = {}
    for noun in synthetic.NOUNS:
        for form in (noun, synthetic.plural(noun)):
            lemmas.setdefault(form, set()).add("noun:" + noun)
    for verb in language.transitive + language.intransitive:
        for t in synthetic.TENSES:
            for n in synthetic.NUMBERS:
                lemmas.setdefault(language.verb(verb, t, n)[0], set()).add("verb:" + verb)
    for word in synthetic.ADJECTIVES + synthetic.PREPOSITIONS:
        lemmas.setdefault(word, set()).add(word)
    assert all(len(v) == 1 for v in lemmas.values())


def test_write_parallel(tmp_path):
    pairs = make_pairs(20, seed=4)
    src, tgt = tmp_path / "data" / "train.src", tmp_path / "data" / "train.tgt"
    write_parallel(pairs, src, tgt)
    read = list(
        zip(
            src.read_text(encoding="utf-8").splitlines(),
            tgt.read_text(encoding="utf-8").splitlines(),
            strict=True,
        )
    )
    assert read == pairs


def test_too_many_distinct_sentences_is_an_error(monkeypatch):
    # A grammar this small has a few dozen sentences, far fewer than asked for.
    monkeypatch.setattr(synthetic, "NOUNS", ["dog"])
    monkeypatch.setattr(synthetic, "INTRANSITIVE_VERBS", ["sleep:slept"])
    monkeypatch.setattr(synthetic, "P_TRANSITIVE", 0.0)
    monkeypatch.setattr(synthetic, "P_PREPOSITION", 0.0)
    monkeypatch.setattr(synthetic, "ADJECTIVE_COUNT_WEIGHTS", (1.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="distinct sentences"):
        make_splits(100, 0, 0)
