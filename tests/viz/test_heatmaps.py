from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import AxesImage

from qkv.demo import write_demo_pictures
from qkv.viz import heatmaps
from qkv.viz.attention import AttentionKind, RunAttention, run_attention
from qkv.viz.heatmaps import attention_pictures, heatmap_figure, patch_overlay_figure

from .conftest import SENTENCE, qkv


@pytest.fixture(scope="module")
def maps(translation_run):
    return run_attention(translation_run, SENTENCE)


def heatmap_axes(figure):
    """The axes of a figure that hold a heatmap (not the colour bar)."""
    return [ax for ax in figure.axes if any(isinstance(i, AxesImage) for i in ax.images)]


def labels(ticks):
    return [t.get_text() for t in ticks]


def test_run_attention_of_a_translator(maps):
    assert maps.job == "translation"
    assert [k.name for k in maps.kinds] == ["encoder", "decoder", "cross"]
    encoder, decoder, cross = maps.kinds
    S, T = len(encoder.keys), len(decoder.keys)
    assert encoder.weights.shape == (2, 2, S, S)
    assert decoder.weights.shape == (1, 2, T, T)
    assert cross.weights.shape == (1, 2, T, S) and cross.keys == encoder.keys
    assert decoder.queries[0] == "<s>" and encoder.keys[-1] == "</s>"
    for kind in maps.kinds:
        np.testing.assert_allclose(kind.weights.sum(-1), 1.0, atol=1e-5)
    assert np.allclose(np.triu(decoder.weights, k=1), 0.0)  # masked: no looking ahead


def test_one_figure_per_kind_and_layer_with_a_panel_per_head(maps, tmp_path):
    paths = attention_pictures(maps, tmp_path)
    names = [p.name for p in paths]
    assert names == [
        "encoder_layer0.png",
        "encoder_layer1.png",
        "decoder_layer0.png",
        "cross_layer0.png",
    ]
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    cross = maps.kind("cross")
    figure = heatmap_figure(cross.weights[0], cross.queries, cross.keys, cross.title)
    panels = heatmap_axes(figure)
    assert len(panels) == 2
    for ax in panels:
        assert labels(ax.get_xticklabels()) == cross.keys
        assert labels(ax.get_yticklabels()) == cross.queries
    np.testing.assert_array_equal(panels[1].images[0].get_array(), cross.weights[0, 1])


def test_layer_and_head_give_one_large_heatmap(maps, tmp_path, monkeypatch):
    monkeypatch.setattr(heatmaps, "save_figure", lambda figure, path: Path(path))  # names only
    monkeypatch.setattr(heatmaps, "heatmap_figure", lambda weights, *args: len(weights))
    paths = attention_pictures(maps, tmp_path, layer=1, head=1)
    assert [p.name for p in paths] == ["encoder_layer1_head1.png"]  # the decoder has 1 layer
    paths = attention_pictures(maps, tmp_path, layer=0, head=0)
    assert [p.name for p in paths] == [
        "encoder_layer0_head0.png",
        "decoder_layer0_head0.png",
        "cross_layer0_head0.png",
    ]
    paths = attention_pictures(maps, tmp_path, head=1)
    assert [p.name for p in paths] == [
        "encoder_layer0_head1.png",
        "encoder_layer1_head1.png",
        "decoder_layer0_head1.png",
        "cross_layer0_head1.png",
    ]
    monkeypatch.undo()
    encoder = maps.kind("encoder")
    figure = heatmap_figure(encoder.weights[1, [1]], encoder.queries, encoder.keys, "t", [1])
    (ax,) = heatmap_axes(figure)
    assert ax.get_title() == "head 1"
    np.testing.assert_array_equal(ax.images[0].get_array(), encoder.weights[1, 1])


def test_tokens_are_drawn_as_they_are():
    keys = ["$x$", "a_b", "</s>"]
    figure = heatmap_figure(np.full((3, 3, 3), 1 / 3), keys, keys, "odd tokens")
    assert len(heatmap_axes(figure)) == 3
    assert labels(heatmap_axes(figure)[2].get_xticklabels()) == keys


def test_cls_attention_over_the_image(tmp_path):
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(17), size=(2, 3, 17)).astype(np.float32)  # (L, H, S, S)
    tokens = ["[CLS]"] + [f"({r},{c})" for r in range(4) for c in range(4)]
    image = rng.random((8, 8)).astype(np.float32)
    maps = RunAttention(
        "images",
        "digit.png",
        "7 (probability 0.90)",
        [AttentionKind("encoder", weights, tokens, tokens)],
        image,
        (4, 4),
    )
    paths = attention_pictures(maps, tmp_path)
    assert [p.name for p in paths] == ["vit_layer0.png", "vit_layer1.png"]
    figure = patch_overlay_figure(image, (4, 4), weights[1, :, 0, 1:], "layer 1")
    assert len(figure.axes) == 4  # 3 heads and their average
    overlay = figure.axes[3].images[1].get_array()
    mean = weights[1, :, 0, 1:].mean(0).reshape(4, 4)
    np.testing.assert_allclose(overlay, mean / mean.max(), rtol=1e-6)
    assert figure.axes[3].get_title().startswith("average of heads")
    figure = patch_overlay_figure(image, (4, 4), weights[1, [2], 0, 1:], "layer 1", [2])
    assert [ax.get_title().split("\n")[0] for ax in figure.axes] == ["head 2"]
    paths = attention_pictures(maps, tmp_path, layer=1, head=2)
    assert [p.name for p in paths] == ["vit_layer1_head2.png"]


def test_attention_command_writes_and_prints_the_paths(translation_run, tmp_path, capsys):
    out, page = tmp_path / "pictures", tmp_path / "page.html"
    argv = ["attention", "--model", translation_run, SENTENCE, "--out", out, "--layer", "1"]
    assert qkv(*argv, "--head", "1", "--html", page) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("output: ")
    assert printed[1:] == [str(out / "encoder_layer1_head1.png"), str(page)]
    assert (out / "encoder_layer1_head1.png").is_file() and page.is_file()
    assert sorted(p.name for p in out.iterdir()) == ["encoder_layer1_head1.png"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{run}", SENTENCE], "nothing to write"),
        (["{run}", SENTENCE, "--out", "{tmp}", "--layer", "5"], "--layer 5 is out of range"),
        (["{run}", SENTENCE, "--out", "{tmp}", "--head", "2"], "--head 2 is out of range"),
        (["{run}", " ", "--out", "{tmp}"], "the input is empty"),
        (["{tmp}/none", SENTENCE, "--out", "{tmp}"], "{tmp}/none"),
    ],
)
def test_attention_mistakes_are_one_clear_line(translation_run, tmp_path, capsys, argv, message):
    argv = [a.format(run=translation_run, tmp=tmp_path) for a in argv]
    assert qkv("attention", "--model", *argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("qkv: error: ")
    assert message.format(tmp=tmp_path) in err


def test_write_demo_pictures(translation_run, tmp_path, monkeypatch):
    drawn = []

    def save(figure, path):  # the drawing itself is tested above; here what goes where
        drawn.append(len(heatmap_axes(figure)))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(b"")
        return Path(path)

    monkeypatch.setattr(heatmaps, "save_figure", save)
    paths = write_demo_pictures(translation_run, SENTENCE)
    assert [p.name for p in paths] == [
        "encoder_layer0.png",
        "encoder_layer1.png",
        "decoder_layer0.png",
        "cross_layer0.png",
        "attention.html",
    ]
    assert drawn == [2, 2, 2, 2]
    assert all(p.parent == translation_run / "attention" and p.is_file() for p in paths)
    assert "encoder-decoder attention" in paths[-1].read_text(encoding="utf-8")
