"""Part-of-speech tagging: CoNLL-U reading, first-subword labels, training, tagging, evaluating."""

import json
import random
import shutil
from collections import Counter

import pytest
import torch

from qkv.attention import padding_mask
from qkv.cli import main
from qkv.config import ModelConfig
from qkv.data import UNK_ID
from qkv.errors import InputError
from qkv.jobs.run import run_job
from qkv.jobs.tagging import (
    IGNORE,
    JOB,
    MAX_WORD_SUBWORDS,
    CharEncoder,
    TaggedSentence,
    Tagger,
    TaggerModel,
    TaggerSettings,
    WordEncoder,
    align_first_subwords,
    read_conllu,
)
from qkv.jobs.tagging.data import collate, split_words
from qkv.jobs.tagging.model import max_pool_words, max_pool_words_reference
from qkv.jobs.tagging.task import TaggingTask
from qkv.labels import LabelVocab
from qkv.viz.attention import run_attention

from ..helpers import assert_starts_from_pretrained, tiny_train_config

# A toy grammar whose tags follow from the words and their place: (word, UPOS, XPOS).
LEXICON = {
    "DET": (["the", "a", "every", "this"], "DT"),
    "ADJ": (["big", "small", "red", "happy", "old", "quiet"], "JJ"),
    "NOUN": (["dog", "cat", "house", "tree", "bird", "car", "lamp"], "NN"),
    "VERB": (["sees", "likes", "chases", "finds", "paints"], "VBZ"),
    "ADV": (["quickly", "often", "never", "slowly"], "RB"),
    "PRON": (["he", "she", "it"], "PRP"),
    "PUNCT": ([".", "!"], "."),
}
TINY = ["--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
        "--n-encoder-layers", "1", "--char-dim", "16", "--vocab-size", "60",
        "--precision", "fp32", "--no-progress"]  # fmt: skip


def toy_sentence(rng: random.Random) -> list[tuple[str, str, str]]:
    def pick(upos):
        words, xpos = LEXICON[upos]
        return (rng.choice(words), upos, xpos)

    def noun_phrase():
        if rng.random() < 0.3:
            return [pick("PRON")]
        return [pick("DET")] + ([pick("ADJ")] if rng.random() < 0.5 else []) + [pick("NOUN")]

    adverb = [pick("ADV")] if rng.random() < 0.4 else []
    return noun_phrase() + adverb + [pick("VERB")] + noun_phrase() + [pick("PUNCT")]


def write_conllu(path, n: int, seed: int = 0, extras: bool = False):
    """``n`` toy sentences; with ``extras``, a multiword-token range and an empty node too."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(n):
        words = toy_sentence(rng)
        lines = [f"# text = {' '.join(w for w, _, _ in words)}"]
        if extras:
            lines.append(f"1-2\t{words[0][0]}{words[1][0]}\t_\t_\t_\t_\t_\t_\t_\t_")
        for i, (word, upos, xpos) in enumerate(words, start=1):
            lines.append(f"{i}\t{word}\t{word}\t{upos}\t{xpos}\t_\t0\tdep\t_\t_")
            if extras and i == 1:
                lines.append("1.1\tghost\t_\tX\tXX\t_\t_\t_\t_\t_")
        blocks.append("\n".join(lines) + "\n")
    path.write_text("\n".join(blocks) + "\n", encoding="utf-8")
    return path


def train_args(data, out, *options) -> list[str]:
    """`qkv train tagger` on the toy treebank with a tiny model, then ``options``."""
    return ["train", "tagger", "--train", str(data["train"]), "--valid", str(data["valid"]),
            "--out", str(out), *TINY, *options]  # fmt: skip


def listing(folder) -> dict[str, int]:
    """Every file under ``folder`` with its modification time, to see that nothing changed."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tagging")
    return {
        "folder": folder,
        "train": write_conllu(folder / "train.conllu", 300, seed=1),
        "valid": write_conllu(folder / "valid.conllu", 40, seed=2),
        "test": write_conllu(folder / "test.conllu", 40, seed=3),
    }


@pytest.fixture(scope="module")
def cli_run(data):
    out = data["folder"] / "cli_run"
    args = train_args(data, out, "--max-steps", "4", "--eval-every", "2", "--max-tokens", "300")
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def python_run(data):
    out = data["folder"] / "python_run"
    torch.manual_seed(0)
    model = ModelConfig.preset("tiny", d_model=48, n_heads=2, d_ff=96, n_encoder_layers=1,
                               norm_first=True, dropout=0.0)  # fmt: skip
    settings = TaggerSettings(train=str(data["train"]), valid=str(data["valid"]), vocab_size=60,
                              max_tokens=600, char_dim=16, token_dropout=0.0,
                              label_smoothing=0.0)  # fmt: skip
    config = tiny_train_config(out, max_steps=60, eval_every=30, warmup_steps=5, lr=1e-2)
    summary = run_job(JOB, settings, model, config)
    return out, summary


def test_first_subword_carries_the_label():
    ids, word_index, targets = align_first_subwords([[5, 6], [7], [], [8, 9, 10]], [1, 2, 3, 4])
    assert ids == [5, 6, 7, UNK_ID, 8, 9, 10]
    assert word_index == [0, 0, 1, 2, 3, 3, 3]
    assert targets == [1, IGNORE, 2, 3, 4, IGNORE, IGNORE]
    _, _, unlabelled = align_first_subwords([[5, 6], [7]])
    assert unlabelled == [IGNORE] * 3
    long_ids, _, long_targets = align_first_subwords([list(range(10, 40))], [0])
    assert len(long_ids) == MAX_WORD_SUBWORDS and long_targets[0] == 0


def test_long_sentences_are_cut_between_words(data):
    sentences = read_conllu(data["train"])
    encoder = WordEncoder.train([s.words for s in sentences], 60)
    words = [w for s in sentences[:6] for w in s.words]
    labels = list(range(len(words)))
    whole = encoder.examples(words, labels, max_len=1000)
    pieces = encoder.examples(words, labels, max_len=7)
    assert len(whole) == 1 and len(pieces) > 1
    assert all(len(p.ids) <= 7 for p in pieces)
    assert [i for p in pieces for i in p.ids] == whole[0].ids
    assert [t for p in pieces for t in p.targets if t != IGNORE] == labels
    assert encoder.examples([], None, max_len=7) == []


def test_read_conllu_skips_ranges_and_empty_nodes(tmp_path):
    path = write_conllu(tmp_path / "x.conllu", 2, seed=5, extras=True)
    sentences = read_conllu(path)
    assert len(sentences) == 2
    lines = path.read_text().splitlines()
    for s in sentences:
        assert "ghost" not in s.words and "X" not in s.tags
        for word, tag, number in zip(s.words, s.tags, s.lines, strict=True):
            fields = lines[number - 1].split("\t")
            assert (fields[1], fields[3]) == (word, tag)


def test_xpos_reads_column_5(tmp_path):
    path = write_conllu(tmp_path / "x.conllu", 5, seed=6)
    upos, xpos = read_conllu(path), read_conllu(path, tagset="xpos")
    assert [s.words for s in upos] == [s.words for s in xpos]
    names = {u: x for u, (_, x) in LEXICON.items()}
    assert [[names[t] for t in s.tags] for s in upos] == [s.tags for s in xpos]
    with pytest.raises(InputError, match="tagset"):
        read_conllu(path, tagset="deprel")
    with pytest.raises(InputError, match="--valid is missing"):
        read_conllu(None, option="--valid")


def test_aux_columns_are_read_beside_the_tags(tmp_path):
    path = write_conllu(tmp_path / "x.conllu", 5, seed=7, extras=True)
    upos = read_conllu(path)
    both = read_conllu(path, aux=("xpos", "feats", "deprel"))
    xpos = read_conllu(path, tagset="xpos")
    assert [s.tags for s in both] == [s.tags for s in upos] and not upos[0].aux
    assert [s.aux["xpos"] for s in both] == [s.tags for s in xpos]
    for s in both:
        assert s.aux["feats"] == ["_"] * len(s.words) and s.aux["deprel"] == ["dep"] * len(s.words)
    with pytest.raises(InputError, match="'lemma' is not one of"):
        read_conllu(path, aux=("lemma",))


def aux_setup(data, n_sentences=8):
    """Toy sentences with their XPOS as an extra column, a small encoder (words split) and
    the UPOS and XPOS vocabularies."""
    sentences = read_conllu(data["train"], aux=("xpos",))[:n_sentences]
    encoder = WordEncoder.train([s.words for s in sentences], 40)
    upos = LabelVocab.from_data(t for s in sentences for t in s.tags)
    xpos = LabelVocab.from_data(t for s in sentences for t in s.aux["xpos"])
    return sentences, encoder, upos, xpos


def test_aux_targets_sit_where_the_tags_do(data):
    sentences, encoder, upos, xpos = aux_setup(data)
    task = TaggingTask(encoder, upos, sentences, sentences, 64, 10_000, 0.0, {"xpos": xpos}, 1.0)
    batch = collate(task.train)
    target = batch.aux_targets["xpos"]  # (B, S)
    assert target.shape == batch.targets.shape
    assert torch.equal(target.eq(IGNORE), batch.targets.eq(IGNORE))
    assert batch.targets.ne(IGNORE).sum() < batch.src.ne(0).sum()  # some words split
    names = {u: x for u, (_, x) in LEXICON.items()}
    labelled = batch.targets.ne(IGNORE)
    pairs = zip(batch.targets[labelled].tolist(), target[labelled].tolist(), strict=True)
    for u_id, x_id in pairs:
        assert names[upos.names[u_id]] == xpos.names[x_id]
    assert not collate(encode_plain(encoder, upos, sentences)).aux_targets


def encode_plain(encoder, labels, sentences):
    return [
        e for s in sentences for e in encoder.examples(s.words, [labels.id(t) for t in s.tags], 64)
    ]


def test_aux_heads_add_their_weighted_loss_and_leave_the_tags_alone(data):
    sentences, encoder, upos, xpos = aux_setup(data)
    config = ModelConfig.preset("tiny", src_vocab_size=encoder.tokenizer.vocab_size,
                                n_decoder_layers=0, max_len=64)  # fmt: skip
    torch.manual_seed(0)
    model = TaggerModel(config, len(upos), encoder.n_chars, char_dim=8,
                        aux_labels={"xpos": len(xpos)}).eval()  # fmt: skip
    batch = collate(TaggingTask(encoder, upos, sentences, sentences, 64, 10_000, 0.0,
                                {"xpos": xpos}, 0.5).train)  # fmt: skip
    logits, extra = model(batch.src, batch.word_index, batch.chars, aux=True)
    torch.testing.assert_close(logits, model(batch.src, batch.word_index, batch.chars))
    assert extra["xpos"].shape == (*batch.src.shape, len(xpos))

    def cross_entropy(scores, targets):  # mean over labelled words, by hand
        keep = targets.ne(IGNORE)
        log_p = scores[keep].log_softmax(-1)
        return -log_p.gather(1, targets[keep][:, None]).mean()

    for weight in (0.0, 0.5, 2.0):
        task = TaggingTask(encoder, upos, sentences, sentences, 64, 10_000, 0.0,
                           {"xpos": xpos}, weight)  # fmt: skip
        loss, n = task.loss(model, batch)
        expected = cross_entropy(logits, batch.targets) + weight * cross_entropy(
            extra["xpos"], batch.aux_targets["xpos"]
        )
        torch.testing.assert_close(loss, expected)
        assert n == int(batch.targets.ne(IGNORE).sum())
    model.zero_grad()
    loss.backward()
    assert model.aux_heads["xpos"].weight.grad.abs().sum() > 0


def test_cli_training_with_aux_tags_saves_their_labels_and_still_tags(data, tmp_path):
    out = tmp_path / "aux_run"
    args = train_args(data, out, "--max-steps", "4", "--eval-every", "2", "--max-tokens", "300",
                      "--aux-tags", "xpos", "--aux-tags", "deprel")  # fmt: skip
    assert main(args) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["settings"]["aux_tags"] == ["xpos", "deprel"]
    xpos = json.loads((out / "labels-xpos.json").read_text())["labels"]
    assert sorted(xpos) == sorted(x for _, x in LEXICON.values())
    assert json.loads((out / "labels-deprel.json").read_text())["labels"] == ["dep"]
    tagger = Tagger.load(out)
    assert set(tagger.model.aux_heads) == {"xpos", "deprel"}
    tagged = tagger.predict_lines(["the dog sees a cat ."])[0].split()
    assert [t.rsplit("/", 1)[0] for t in tagged] == "the dog sees a cat .".split()
    assert {t.rsplit("/", 1)[1] for t in tagged} <= set(LEXICON)


def test_aux_tags_default_follows_the_tagset_and_none_turns_them_off(data, tmp_path):
    base = TaggerSettings(train=str(data["train"]), valid=str(data["valid"]))
    assert JOB.resolve(base).aux_tags == ["xpos", "deprel"]
    xpos = JOB.resolve(TaggerSettings(tagset="xpos"))
    assert xpos.aux_tags == ["upos", "deprel"]
    assert JOB.resolve(TaggerSettings(aux_tags=["none"])).aux_tags == []
    assert JOB.resolve(TaggerSettings(aux_tags=["feats"])).aux_tags == ["feats"]
    out = tmp_path / "plain"
    assert main(train_args(data, out, "--max-steps", "2", "--aux-tags", "none")) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["settings"]["aux_tags"] == [] and not list(out.glob("labels-*.json"))
    del config["settings"]["aux_tags"]  # as a run saved before --aux-tags existed
    (out / "config.json").write_text(json.dumps(config))
    assert not Tagger.load(out).model.aux_heads
    assert len(Tagger.load(out).predict_lines(["the dog sees a cat ."])[0].split()) == 6


def test_model_adds_character_vectors_through_the_input_embedding(data):
    sentences = read_conllu(data["train"])[:4]
    encoder = WordEncoder.train([s.words for s in sentences], 60)
    config = ModelConfig.preset("tiny", src_vocab_size=encoder.tokenizer.vocab_size,
                                n_decoder_layers=0, max_len=64)  # fmt: skip
    model = TaggerModel(config, 5, encoder.n_chars, char_dim=8).eval()
    batch = collate([e for s in sentences for e in encoder.examples(s.words, None, 64)])
    logits = model(batch.src, batch.word_index, batch.chars)  # (B, S, K)
    embed = model.body.embed  # the reference: the paper's input with the word vectors added
    x = embed.token(batch.src) * embed.scale + model.chars(batch.chars)[batch.word_index]
    h = model.body.encoder(embed.position(x), padding_mask(batch.src, config.pad_id))
    torch.testing.assert_close(logits, model.head(h))
    no_chars = TaggerModel(config, 5, encoder.n_chars, char_dim=0).eval()
    expected = no_chars.head(no_chars.body(batch.src))  # EncoderModel's own forward
    torch.testing.assert_close(no_chars(batch.src, batch.word_index, batch.chars), expected)


def test_character_encoder_of_several_widths_matches_each_word_alone(data):
    words = [w for s in read_conllu(data["train"])[:4] for w in s.words]
    encoder = WordEncoder.train([words], 60)
    batch = collate([e for e in encoder.examples(words, None, 64)])
    chars = CharEncoder(encoder.n_chars, 8, 16, widths=(3, 5, 1)).eval()
    got = chars(batch.chars)  # (U, D), the words padded to the longest
    # The reference: each word alone, unpadded, through each convolution; max over positions.
    for u, row in enumerate(batch.chars):
        x = chars.embed(row[row.ne(0)]).T[None]  # (1, E, C_u)
        pooled = [torch.relu(conv(x)).amax(dim=-1) for conv in (chars.conv, *chars.more_convs)]
        torch.testing.assert_close(got[u], chars.proj(torch.cat(pooled, dim=-1))[0])
    assert [c.kernel_size[0] for c in (chars.conv, *chars.more_convs)] == [3, 5, 1]


def test_word_max_pool_matches_its_reference_forward_and_backward():
    torch.manual_seed(0)
    h = torch.randn(6, 5, 7)  # (U, D, C): words whose every value is below 0 included
    h[0] -= 10
    pad = torch.zeros(6, 1, 7, dtype=torch.bool)
    pad[1:, :, 4:] = True  # shorter words, padded; the padding holds the largest values
    h.masked_fill_(pad, 50.0)
    grads = []
    for pool in (max_pool_words, max_pool_words_reference):
        x = h.clone().requires_grad_()
        out = pool(x, pad)  # (U, D)
        (out * torch.arange(1.0, 6.0)).sum().backward()
        grads.append((out.detach(), x.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])
    assert grads[0][0][0].eq(0).all() and grads[0][1][pad.expand_as(h)].eq(0).all()


def test_cli_char_widths_are_saved_and_a_run_without_them_loads_with_one(data, tmp_path):
    out = tmp_path / "widths"
    args = train_args(data, out, "--max-steps", "2", "--char-widths", "3", "--char-widths", "5")
    assert main(args) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["settings"]["char_widths"] == [3, 5]
    assert len(Tagger.load(out).model.chars.more_convs) == 1
    one = tmp_path / "one"
    assert main(train_args(data, one, "--max-steps", "2")) == 0
    config = json.loads((one / "config.json").read_text())
    del config["settings"]["char_widths"]  # as a run saved before --char-widths existed
    (one / "config.json").write_text(json.dumps(config))
    tagger = Tagger.load(one)
    assert tagger.model.chars.proj.in_features == tagger.model.config.d_model
    assert len(tagger.predict_lines(["the dog sees a cat ."])[0].split()) == 6


def test_word_dropout_hides_all_subwords_of_a_word_or_none(data):
    sentences = read_conllu(data["train"])[:8]
    encoder = WordEncoder.train([s.words for s in sentences], 40)  # small: words split
    config = ModelConfig.preset("tiny", src_vocab_size=encoder.tokenizer.vocab_size,
                                n_decoder_layers=0, max_len=64, dropout=0.0)  # fmt: skip
    model = TaggerModel(config, 5, encoder.n_chars, char_dim=8, token_dropout=0.0,
                        word_dropout=0.5)  # fmt: skip
    seen = []
    model.body.embed.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    batch = collate([e for s in sentences for e in encoder.examples(s.words, None, 64)])
    model.train()(batch.src, batch.word_index, batch.chars)
    model.eval()(batch.src, batch.word_index, batch.chars)
    trained, evaluated = seen
    torch.testing.assert_close(evaluated, batch.src)  # no dropout when tagging
    real = batch.src.ne(0)
    hidden = trained.eq(UNK_ID) & batch.src.ne(UNK_ID)
    states = set()
    for u in range(batch.chars.shape[0]):
        where = batch.word_index.eq(u) & real
        states.add(tuple(sorted(set(hidden[where].tolist()))))
    assert states == {(False,), (True,)}  # some words hidden whole, some kept whole
    multi = [u for u in range(batch.chars.shape[0]) if (batch.word_index.eq(u) & real).sum() > 1]
    assert multi  # the check above covered words of several subwords


def test_rare_word_dropout_hides_a_word_by_its_training_count(data):
    sentences, encoder, upos, _ = aux_setup(data)
    task = TaggingTask(encoder, upos, sentences, sentences, 64, 10_000, 0.0, count_words=True)
    batch = task.train_batches(epoch=0, seed=0)[0]
    assert len(task.train_batches(epoch=0, seed=0)) == 1  # every word in this one batch
    spellings = Counter(tuple(encoder.word_chars(w)) for s in sentences for w in s.words)
    rows = [tuple(r[r.ne(0)].tolist()) for r in batch.chars]  # (U,) each word's characters
    counts = torch.tensor([float(spellings[r]) for r in rows])  # (U,)
    torch.testing.assert_close(batch.word_counts, counts)
    assert collate(task.train).word_counts is None
    plain = TaggingTask(encoder, upos, sentences, sentences, 64, 10_000, 0.0)
    assert plain.train_batches(epoch=0, seed=0)[0].word_counts is None  # counted only when on
    config = ModelConfig.preset("tiny", src_vocab_size=encoder.tokenizer.vocab_size,
                                n_decoder_layers=0, max_len=64, dropout=0.0)  # fmt: skip
    model = TaggerModel(config, len(upos), encoder.n_chars, char_dim=8, token_dropout=0.0,
                        word_dropout=0.2, rare_word_dropout=0.5)  # fmt: skip
    chance = model.hide_chance(len(rows), batch.word_counts, batch.src.device)
    torch.testing.assert_close(chance, 1 - 0.8 * counts / (0.5 + counts))
    torch.testing.assert_close(model.hide_chance(len(rows), None, batch.src.device),
                               torch.full((len(rows),), 0.2))  # fmt: skip
    model.rare_word_dropout = 0.0
    model.word_dropout = 0.0
    assert model.hide_chance(len(rows), batch.word_counts, batch.src.device) is None
    # Drawn while training: a word seen once is hidden far more often than the commonest.
    model.rare_word_dropout = 2.0
    seen = []
    model.body.embed.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    torch.manual_seed(0)
    model.train()
    for _ in range(200):
        model(batch.src, batch.word_index, batch.chars, word_counts=batch.word_counts)
    first = batch.targets.ne(IGNORE) & batch.src.ne(UNK_ID)  # words by their first subword
    hidden = torch.stack(seen).eq(UNK_ID)[:, first].float().mean(0)  # per word occurrence
    words = batch.word_index[first]
    rare = hidden[counts[words] == 1].mean()
    common = hidden[counts[words] == counts.max()].mean()
    assert abs(rare - 2 / 3) < 0.05 and abs(common - 2 / (2 + counts.max())) < 0.05


@pytest.mark.parametrize(
    "line, says",
    [("2\tdog\tdog\tNOUN\tNN\t_\t0", "10 tab-separated columns but this one has 7"),
     ("two\tdog\tdog\tNOUN\tNN\t_\t0\tdep\t_\t_", "token id 'two'"),
     ("2\tdog\tdog\t_\tNN\t_\t0\tdep\t_\t_", "no UPOS tag")],
)  # fmt: skip
def test_malformed_conllu_is_one_error_line_naming_file_and_line(tmp_path, capsys, line, says):
    path = tmp_path / "bad.conllu"
    path.write_text(f"# text = the dog\n1\tthe\tthe\tDET\tDT\t_\t0\tdep\t_\t_\n{line}\n\n")
    code = main(train_args({"train": path, "valid": path}, tmp_path / "run"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"qkv: error: {path}:3: ") and says in err[0]


@pytest.mark.parametrize(
    "option, value",
    [("--char-dim", "-1"), ("--token-dropout", "1.0"), ("--word-dropout", "1.0"),
     ("--rare-word-dropout", "-1.0"),
     ("--max-len", "0"), ("--aux-tags", "lemma"), ("--aux-tags", "upos"),
     ("--aux-weight", "-0.5"), ("--char-widths", "4"),
     ("--max-tokens", "0"), ("--vocab-size", "3"), ("--label-smoothing", "1.5")],
)  # fmt: skip
def test_bad_settings_are_one_error_line_naming_the_option(data, tmp_path, capsys, option, value):
    code = main(train_args(data, tmp_path / "run", option, value))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"qkv: error: {option} {float(value) if '.' in value else value}")
    assert not (tmp_path / "run").exists()


def test_train_help_shows_the_taggers_options_only(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "tagger", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--n-decoder-layers" not in text
    options = ("--train --valid --tagset --vocab-size --max-len --max-tokens --char-dim "
               "--token-dropout --word-dropout --label-smoothing --n-encoder-layers")  # fmt: skip
    for name in options.split():
        assert f"{name} " in text


def test_cli_training_writes_a_tagger_run(cli_run):
    config = json.loads((cli_run / "config.json").read_text())
    assert config["job"] == "tagger" and config["settings"]["tagset"] == "upos"
    assert config["model"]["n_decoder_layers"] == 0
    assert config["model"]["max_len"] == config["settings"]["max_len"] == 1024
    assert config["settings"]["max_tokens"] == 300 and config["settings"]["char_dim"] == 16
    labels = json.loads((cli_run / "labels.json").read_text())["labels"]
    assert sorted(labels) == sorted(LEXICON)
    for name in ("model.safetensors", "tokenizer.json", "chars.json", "metrics.csv"):
        assert (cli_run / name).is_file()
    assert (cli_run / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((cli_run / "summary.json").read_text())
    assert summary["steps"] == 4
    assert 0 <= summary["valid_accuracy"] <= 100 and 0 <= summary["valid_macro_f1"] <= 100


def test_tag_command_writes_one_line_per_input_line(cli_run, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("the dog sees a cat .\n\nhe paints it !\n\n")
    out = tmp_path / "out.txt"
    assert main(["tag", "--model", str(cli_run), "--input", str(text), "--output", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    lines = out.read_text().split("\n")
    assert len(lines) == 5 and lines[1] == lines[3] == lines[4] == ""
    pairs = [token.rsplit("/", 1) for token in lines[0].split()]
    assert [w for w, _ in pairs] == "the dog sees a cat .".split()
    assert {t for _, t in pairs} <= set(LEXICON)
    assert [token.rsplit("/", 1)[0] for token in lines[2].split()] == ["he", "paints", "it", "!"]


def test_tag_command_writes_conllu_numbered_by_input_line(cli_run, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("the dog sees a cat .\n\nhe paints it !\n")
    out = tmp_path / "out.conllu"
    assert main(["tag", "--model", str(cli_run), "--format", "conllu", "--input", str(text),
                 "--output", str(out), "--no-progress"]) == 0  # fmt: skip
    written = out.read_text()
    assert written.startswith("# sent_id = 1\n") and written.endswith("\t_\n\n")
    blocks = [b.strip("\n") for b in written.split("\n\n") if b.strip()]
    assert len(blocks) == 2 and "# sent_id = 1" in blocks[0] and "# sent_id = 3" in blocks[1]
    rows = [r.split("\t") for r in blocks[1].splitlines() if not r.startswith("#")]
    assert [r[1] for r in rows] == ["he", "paints", "it", "!"]
    assert all(len(r) == 10 and r[3] in LEXICON and r[4] == "_" for r in rows)
    tagger = Tagger.load(cli_run, format="conllu")
    outputs = tagger.predict_lines(["a cat", "", "it sees"], first_number=10)
    assert outputs[1] == "" and "# sent_id = 10" in outputs[0] and "# sent_id = 12" in outputs[2]


def test_evaluate_leaves_the_run_alone_and_draws_into_out(cli_run, data, tmp_path, capsys):
    before = listing(cli_run)
    pictures = tmp_path / "pictures"
    assert main(["evaluate", "--model", str(cli_run), "--data", str(data["test"]),
                 "--out", str(pictures), "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert 0 <= result["accuracy"] <= 100 and 0 <= result["macro_f1"] <= 100
    assert result["words"] == sum(len(s.words) for s in read_conllu(data["test"]))
    assert result["sentences"] == 40 and result["tagset"] == "upos"
    assert result["unseen_gold_tags"] == 0 and result["data"] == str(data["test"])
    assert (pictures / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["evaluate", "--model", str(cli_run), "--json"]) == 0  # the run's --valid
    assert json.loads(capsys.readouterr().out)["data"] == str(data["valid"])
    assert listing(cli_run) == before


def test_evaluate_asks_for_data_when_the_validation_file_is_gone(cli_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(cli_run, run)
    config = json.loads((run / "config.json").read_text())
    config["settings"]["valid"] = str(tmp_path / "gone.conllu")
    (run / "config.json").write_text(json.dumps(config))
    assert main(["evaluate", "--model", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --data FILE.conllu" in err[0]


def test_python_training_learns_the_toy_grammar(python_run, data):
    out, summary = python_run
    assert summary["valid_accuracy"] > 90.0
    result = Tagger.load(out).evaluate(read_conllu(data["test"]))
    assert result["accuracy"] > 90.0


def test_tag_accepts_strings_and_word_lists_alike(python_run):
    tagger = Tagger.load(python_run[0])
    sentences = ["the big dog sees it .", "she often paints a red house !", ""]
    together = tagger.tag(sentences)
    assert together == [tagger.tag([s.split()])[0] for s in sentences]
    assert together[2] == [] and [w for w, _ in together[0]] == sentences[0].split()


def test_attention_covers_every_layer_head_and_subword(python_run):
    text = "the quiet bird never finds a lamp ."
    tagger = Tagger.load(python_run[0])
    seen = tagger.attention(text)
    kind = seen.kind("encoder")
    config = tagger.model.config
    S = len(kind.queries)
    assert S >= 8 and kind.queries == kind.keys and all(isinstance(t, str) for t in kind.keys)
    assert kind.weights.shape == (config.n_encoder_layers, config.n_heads, S, S)
    torch.testing.assert_close(
        torch.from_numpy(kind.weights).sum(-1), torch.ones(1, config.n_heads, S)
    )
    assert [t.rsplit("/", 1)[0] for t in seen.output.split()] == text.split()
    assert seen.output == tagger.predict_lines([text])[0]
    assert run_attention(python_run[0], text).output == seen.output
    with pytest.raises(InputError, match="empty"):
        tagger.attention("  ")


def test_unseen_gold_tag_counts_as_wrong(python_run):
    tagger = Tagger.load(python_run[0])
    words = "the dog sees a cat .".split()
    right = [t for _, t in tagger.tag([words])[0]]
    result = tagger.evaluate([TaggedSentence(words, ["NEVER", *right[1:]], list(range(6)))])
    assert result["unseen_gold_tags"] == 1
    assert result["accuracy"] == pytest.approx(100.0 * 5 / 6)


def test_loading_another_kind_of_run_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"job": "translation"}))
    with pytest.raises(InputError, match="not a 'tagger' run"):
        Tagger.load(tmp_path)


def test_resume_keeps_the_runs_settings(data, tmp_path):
    out = tmp_path / "run"
    assert main(train_args(data, out, "--eval-every", "2", "--max-steps", "2",
                           "--tagset", "xpos")) == 0  # fmt: skip
    assert main(train_args(data, out, "--eval-every", "2", "--max-steps", "4", "--resume")) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    assert json.loads((out / "config.json").read_text())["settings"]["tagset"] == "xpos"
    labels = json.loads((out / "labels.json").read_text())["labels"]
    assert sorted(labels) == sorted(x for _, x in LEXICON.values())


# ---------------------------------------------------------------- pretraining


def test_raw_text_is_split_into_treebank_words():
    assert split_words("He didn't see Kim's dog, 3.5 km away!") == [
        "He", "did", "n't", "see", "Kim", "'s", "dog", ",", "3.5", "km", "away", "!",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def pretrained_run(data):
    """A tagger whose encoder was pretrained on the training words and unlabeled text."""
    folder = data["folder"]
    unlabeled = folder / "unlabeled.txt"
    # Words and a character (ž) the treebank lacks, as raw text: punctuation attached.
    unlabeled.write_text("the žebra sees a bird.\nhe never paints žebras!\n" * 20)
    out = folder / "pretrained_run"
    options = ["--unlabeled", str(unlabeled), "--pretrain-steps", "4", "--max-steps", "2"]
    assert main(train_args(data, out, "--eval-every", "2", *options)) == 0
    return out


def test_pretraining_learns_from_the_unlabeled_words_too(pretrained_run):
    summary = json.loads((pretrained_run / "summary.json").read_text())
    assert summary["pretraining"]["task"] == "masked_lm"
    assert summary["pretraining"]["steps"] == 4
    assert (pretrained_run / "pretrain" / "model.safetensors").is_file()
    encoder = WordEncoder.load(pretrained_run)
    assert "ž" in encoder.chars  # the characters of the unlabeled words are known
    sizes = json.loads((pretrained_run / "config.json").read_text())["model"]
    assert sizes["src_vocab_size"] == encoder.tokenizer.vocab_size + 1  # + <mask>


def test_a_run_starts_from_the_encoder_another_pretrained(pretrained_run, data, tmp_path):
    out = tmp_path / "run"
    args = train_args(data, out, "--pretrained", str(pretrained_run), "--max-steps", "2")
    assert main([*args, "--eval-every", "2"]) == 0
    assert (out / "tokenizer.json").read_text() == (pretrained_run / "tokenizer.json").read_text()
    assert (out / "chars.json").read_text() == (pretrained_run / "chars.json").read_text()
    # before tagging is learned, the tagger's subword encoder is the pretrained one
    settings = TaggerSettings(pretrained=str(pretrained_run), char_dim=16)
    assert_starts_from_pretrained(JOB, settings, out, pretrained_run, lambda m: m.body)


def test_without_pretraining_options_the_tagger_does_not_pretrain(cli_run):
    assert json.loads((cli_run / "summary.json").read_text())["pretraining"] is None
    assert not (cli_run / "pretrain").exists()
