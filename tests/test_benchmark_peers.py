"""The plain peers of benchmarks/ train and predict (their figures come from the benchmarks).

Each peer trains for a moment on a task a model learns in a few steps, then predicts: the
outputs have the right shapes and come from the label set, and the training loss fell.
"""

import pytest
import torch
from benchmarks.peers import tagging, vision
from benchmarks.peers.common import length_groups, pad, sinusoid_table

from qkv.embeddings import sinusoid_table as qkv_sinusoid_table

pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor:UserWarning")


def test_length_groups_cover_every_item_once_within_the_budget():
    lengths = [5, 1, 9, 3, 3, 7, 2]
    groups = length_groups(lengths, max_tokens=10)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(len(g) * max(lengths[i] for i in g) <= 10 or len(g) == 1 for g in groups)
    assert pad([[1, 2], [3]], 0).tolist() == [[1, 2], [3, 0]]


def test_the_peers_sinusoids_are_the_papers():
    torch.testing.assert_close(sinusoid_table(20, 8), qkv_sinusoid_table(20, 8))


def test_the_peer_tagger_learns_and_tags():
    tag_of = {"the": "DET", "a": "DET", "cat": "NOUN", "dog": "NOUN"}
    sentences = [
        ([d, n, v], [tag_of[d], tag_of[n], "VERB"])
        for d in ("the", "a") for n in ("cat", "dog") for v in ("runs", "sleeps")
    ] * 4  # fmt: skip
    vocab = tagging.PeerVocab.build(sentences)
    torch.manual_seed(0)
    model = tagging.PeerTagger(
        len(vocab.words) + 2, len(vocab.suffixes) + 2, len(vocab.tags), d_model=32, nhead=2,
        num_layers=1, dim_feedforward=64, dropout=0.0,
    )  # fmt: skip
    batches = tagging.batches_of(vocab, sentences, 64, seed=1)
    first = tagging.peer_loss(model, next(batches(0)), 0.0).item()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(30):
        for batch in batches(0):
            loss = tagging.peer_loss(model, batch, 0.0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert loss.item() < 0.5 * first
    predicted = tagging.tag(model, vocab, [["the", "dog", "sleeps"], ["a"]])
    assert [len(p) for p in predicted] == [3, 1]
    assert predicted[0] == ["DET", "NOUN", "VERB"]


def test_the_peer_vit_trains_and_scores():
    torch.manual_seed(0)
    images = torch.zeros(40, 1, 8, 8)
    labels = torch.arange(40) % 2
    images[labels == 1, :, :4] = 1.0  # class 1: a bright top half
    model, info = vision.train_peer(images, labels, seconds=3.0, seed=1)
    assert info["steps"] > 0
    assert 0.0 <= vision.accuracy(model, images, labels) <= 100.0
    assert model(images[:3]).shape == (3, 2)
