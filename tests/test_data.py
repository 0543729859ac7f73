import json
import random

import pytest
import torch
from torch.testing import assert_close

from qkv.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    SubwordDropout,
    SubwordTokenizer,
    hide_words,
    pad_batch,
    read_lines,
    token_batches,
)
from qkv.errors import InputError

CORPUS = [
    "Die Katze schläft auf dem Sofa, oder nicht?",
    "Über 42 Brücken musst du gehn.",
    "Grüße aus Köln: 3,5 Äpfel kosten 1.99 Euro!",
    "The cat sleeps on the sofa; doesn't it?",
    "Hello, world! In 1999 we counted 12345 stars.",
    'She said: "Fünf Öfen (und 7 Türen) sind genug."',
]


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


# ---------------------------------------------------------------- readers


def test_read_lines_keeps_line_count_and_strips_endings(tmp_path):
    path = write(tmp_path, "a.txt", "\ufeffeins\r\n\nzwei\u2028drei\nvier")
    assert read_lines(path) == ["eins", "", "zwei\u2028drei", "vier"]
    assert read_lines(write(tmp_path, "b.txt", "x\n\n")) == ["x", ""]


def test_read_lines_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"^.*nope\.txt: no such file"):
        read_lines(tmp_path / "nope.txt")


def test_read_lines_directory(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        read_lines(tmp_path)


def test_read_lines_empty_file(tmp_path):
    path = write(tmp_path, "empty.txt", b"")
    with pytest.raises(InputError, match=r"empty\.txt: the file is empty"):
        read_lines(path)


def test_read_lines_invalid_utf8_names_its_line(tmp_path):
    path = write(tmp_path, "bad.txt", "grün\nauch gut\n".encode() + b"schlecht \xfc\nok\n")
    with pytest.raises(InputError) as info:
        read_lines(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: byte 10 of the line (0xfc) is not valid UTF-8")
    assert "UTF-8" in message


# ---------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return SubwordTokenizer.train(CORPUS * 10, vocab_size=200, min_frequency=2)


def test_special_tokens_have_fixed_ids(tokenizer):
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert tokenizer.token_strings([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert 4 < tokenizer.vocab_size <= 200


@pytest.mark.parametrize(
    "text", [*CORPUS, "Öfen, Türen und 1999 Äpfel: genug!", "she counted 42 cats (oder nicht?)"]
)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text)
    assert UNK_ID not in ids
    assert BOS_ID not in ids and EOS_ID not in ids
    assert tokenizer.decode(ids) == text
    assert "".join(tokenizer.token_strings(ids)).replace("▁", " ").strip() == text


def test_decode_skips_special_ids_and_takes_tensors(tokenizer):
    ids = tokenizer.encode("Die Katze")
    assert tokenizer.decode(torch.tensor([BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID])) == "Die Katze"


def test_encode_batch_matches_encode(tokenizer):
    assert tokenizer.encode_batch(CORPUS) == [tokenizer.encode(text) for text in CORPUS]


def test_unseen_character_becomes_unk(tokenizer):
    assert UNK_ID in tokenizer.encode("Ω")


def shuffled_texts(n: int, seed: int) -> list[str]:
    """Sentences of the corpus's words in new orders, with unseen characters, runs of spaces
    and a ligature that NFKC normalizes."""
    draw = random.Random(seed)
    words = " ".join(CORPUS).split() + ["Ω", "ﬁnden", "Katzenß", "x"]
    return [
        (" " * draw.randint(1, 2)).join(draw.choices(words, k=draw.randint(0, 12)))
        for _ in range(n)
    ]


def test_subword_dropout_at_zero_splits_as_the_tokenizer(tokenizer):
    texts = [*CORPUS, *shuffled_texts(300, 0)]
    assert SubwordDropout(tokenizer, texts).encode(0.0, seed=1) == tokenizer.encode_batch(texts)


def test_subword_dropout_splits_the_same_text_into_more_pieces(tokenizer):
    texts = shuffled_texts(200, 1)
    split = SubwordDropout(tokenizer, texts)
    plain = tokenizer.encode_batch(texts)
    first, again, other = split.encode(0.3, 7), split.encode(0.3, 7), split.encode(0.3, 8)
    assert first == again and first != other  # the seed decides the split
    # the same text, only cut finer
    assert [tokenizer.decode(ids) for ids in first] == [tokenizer.decode(ids) for ids in plain]
    assert sum(map(len, first)) > 1.1 * sum(map(len, plain))
    # with every merge left out, each word is its characters
    chars = split.encode(0.999999, 3)
    letters = [[c for w in tokenizer.words(t) for c in w] for t in texts]
    assert chars == [[split.vocab.get(c, UNK_ID) for c in cs] for cs in letters]


def test_save_load_equal(tokenizer, tmp_path):
    path = tmp_path / "tok" / "tokenizer.json"
    tokenizer.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]
    loaded = SubwordTokenizer.load(path)
    assert loaded.vocab_size == tokenizer.vocab_size
    every_id = range(tokenizer.vocab_size)
    assert loaded.token_strings(every_id) == tokenizer.token_strings(every_id)
    assert loaded.encode_batch(CORPUS) == tokenizer.encode_batch(CORPUS)


def test_load_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"tok\.json: no such tokenizer file"):
        SubwordTokenizer.load(tmp_path / "tok.json")


@pytest.mark.parametrize("content", [b"not json at all", b'{"vocab": [1, 2]}', b"\xff\xfe"])
def test_load_not_a_tokenizer(tmp_path, content):
    path = write(tmp_path, "tok.json", content)
    with pytest.raises(InputError, match=r"tok\.json: is not a qkv tokenizer"):
        SubwordTokenizer.load(path)


def test_load_tokenizer_with_other_special_ids(tokenizer, tmp_path):
    path = tmp_path / "tok.json"
    tokenizer.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    vocab["<pad>"], vocab["<s>"] = vocab["<s>"], vocab["<pad>"]
    for added in data["added_tokens"]:
        added["id"] = {0: 1, 1: 0}.get(added["id"], added["id"])
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(InputError, match="is not a qkv tokenizer"):
        SubwordTokenizer.load(path)


def test_train_rejects_tiny_vocabulary():
    with pytest.raises(InputError, match="vocab_size=4"):
        SubwordTokenizer.train(CORPUS, vocab_size=4)


# ---------------------------------------------------------------- batching


@pytest.fixture
def lengths():
    rng = random.Random(0)
    return [rng.randint(1, 60) for _ in range(500)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_token_batches_budget_and_every_index_once(lengths, shuffle):
    batches = token_batches(lengths, max_tokens=256, shuffle=shuffle, seed=1)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 256


def test_token_batches_too_long_example_alone():
    batches = token_batches([3, 50, 3, 3], max_tokens=10, shuffle=False, seed=0)
    assert [1] in batches
    assert sorted(i for batch in batches for i in batch) == [0, 1, 2, 3]


def test_token_batches_deterministic_per_seed_and_epoch(lengths):
    def make(seed, epoch):
        return token_batches(lengths, max_tokens=256, shuffle=True, seed=seed, epoch=epoch)

    assert make(1, 3) == make(1, 3)
    assert make(1, 3) != make(1, 4)
    assert make(1, 3) != make(2, 3)
    state = random.getstate()
    make(1, 0)
    assert random.getstate() == state


def test_token_batches_group_similar_lengths(lengths):
    batches = token_batches(lengths, max_tokens=256, shuffle=True, seed=0)
    spans = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in batches)
    # Packed from a length-sorted list: batches never interleave lengths.
    for (_, high), (low, _) in zip(spans, spans[1:], strict=False):
        assert high <= low
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded - sum(lengths) < 0.1 * sum(lengths)
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest != sorted(longest)  # the order of batches is shuffled too


def test_token_batches_not_shuffled_is_sorted(lengths):
    batches = token_batches(lengths, max_tokens=256, shuffle=False, seed=0)
    flat = [lengths[i] for batch in batches for i in batch]
    assert flat == sorted(lengths)


def test_token_batches_rejects_zero_budget():
    with pytest.raises(InputError, match="max_tokens=0"):
        token_batches([1, 2], max_tokens=0, shuffle=False, seed=0)


def test_pad_batch():
    expected = torch.tensor([[5, 6, 7], [8, 0, 0], [0, 0, 0]])
    assert_close(pad_batch([[5, 6, 7], [8], []]), expected)
    assert pad_batch([[5, 6, 7], [8], []]).dtype == torch.long
    assert_close(pad_batch([[5], [6, 7]], pad_id=9), torch.tensor([[5, 9], [6, 7]]))


def test_hide_words_turns_a_share_of_subwords_and_nothing_else_into_unk():
    torch.manual_seed(0)
    words = torch.randint(4, 100, (40, 50))  # (B, T) subword ids
    ids = torch.cat([torch.full((40, 1), BOS_ID), words, torch.full((40, 1), EOS_ID),
                     torch.full((40, 3), PAD_ID)], dim=1)  # fmt: skip
    assert hide_words(ids, 0.0) is ids
    hidden = hide_words(ids, 0.3)
    changed = hidden != ids
    assert (hidden[changed] == UNK_ID).all()
    assert not changed[:, 0].any() and not changed[:, 51:].any()  # <s>, </s>, padding stay
    assert 0.26 < changed[:, 1:51].float().mean().item() < 0.34  # 2,000 draws at 0.3
