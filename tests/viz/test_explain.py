import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from qkv.config import ModelConfig
from qkv.errors import InputError
from qkv.jobs import load_run
from qkv.jobs.base import Predictor
from qkv.layers import EncoderLayer
from qkv.model import Transformer
from qkv.viz.attention import AttentionKind, RunAttention
from qkv.viz.explain import attention_modules, explain_query, format_steps
from qkv.viz.heatmaps import three_steps_figure

from .conftest import SENTENCE, qkv


@pytest.fixture(scope="module")
def translator(translation_run):
    return load_run(translation_run)


@pytest.fixture(scope="module")
def reported(translator):
    """What the translator itself reports: every kind's (L, H, Q, K) weights."""
    return translator.attention(SENTENCE)


def check_steps(steps, expected: np.ndarray) -> None:
    """The recomputed weights are the model's, a distribution, and step 3 follows from them."""
    weights = torch.from_numpy(steps.weights)
    torch.testing.assert_close(weights, torch.from_numpy(expected))
    torch.testing.assert_close(torch.from_numpy(steps.model_weights), torch.from_numpy(expected))
    assert steps.weights.sum() == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(weights, torch.softmax(torch.from_numpy(steps.scores), -1))
    np.testing.assert_allclose(steps.output, steps.weights @ steps.values, rtol=1e-5, atol=1e-6)
    assert steps.shares.sum() == pytest.approx(steps.output_norm, rel=1e-4, abs=1e-6)
    assert steps.head_dim == 16 and len(steps.keys) == expected.shape[-1]


@pytest.mark.parametrize("layer, head", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_encoder_weights_are_the_models_own(translator, reported, layer, head):
    encoder = reported.kind("encoder")
    for token in range(len(encoder.queries)):
        steps = explain_query(translator, SENTENCE, "encoder", layer, head, token)
        check_steps(steps, encoder.weights[layer, head, token])
        assert steps.keys == encoder.keys and steps.query == encoder.queries[token]


@pytest.mark.parametrize("head", [0, 1])
def test_decoder_weights_are_the_models_own_and_never_look_ahead(translator, reported, head):
    decoder = reported.kind("decoder")
    T = len(decoder.queries)
    assert T >= 3 and decoder.queries[0] == "<s>"  # something to mask
    for token in range(T):
        steps = explain_query(translator, SENTENCE, "decoder", 0, head, token)
        check_steps(steps, decoder.weights[0, head, token])
        assert steps.queries == steps.keys == decoder.keys
        np.testing.assert_array_equal(steps.weights[token + 1 :], 0.0)
        assert np.isneginf(steps.scores[token + 1 :]).all()
        assert np.isfinite(steps.scores[: token + 1]).all()
        assert steps.weights[: token + 1].min() > 0.0


@pytest.mark.parametrize("head", [0, 1])
def test_cross_weights_are_the_models_own(translator, reported, head):
    cross, encoder = reported.kind("cross"), reported.kind("encoder")
    for token in range(len(cross.queries)):
        steps = explain_query(translator, SENTENCE, "cross", 0, head, token)
        check_steps(steps, cross.weights[0, head, token])
        assert steps.queries == reported.kind("decoder").queries  # <s> and the output
        assert steps.keys == encoder.keys  # the source, through the encoder
        assert np.isfinite(steps.scores).all()  # one sentence: no padding to mask


@pytest.mark.parametrize("kind, layer", [("encoder", 1), ("decoder", 0), ("cross", 0)])
def test_the_weighted_sums_of_all_heads_are_the_sublayers_output(translator, kind, layer):
    """Concatenate step 3 of every head, apply W_o: the attention's own output at that token."""
    attn = attention_modules(translator.model, kind)[layer]
    seen = []
    handle = attn.register_forward_hook(lambda m, args, out: seen.append(out[0]))
    try:
        outputs = [explain_query(translator, SENTENCE, kind, layer, h, 2).output for h in (0, 1)]
    finally:
        handle.remove()
    with torch.no_grad():
        mixed = attn.out_proj(torch.from_numpy(np.concatenate(outputs)))  # (D,)
    torch.testing.assert_close(mixed, seen[-1][0, 2], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_pre_and_post_norm_both_explained(translator, kind, norm_first):
    """q, k, v come from what the attention sees, which is after the LayerNorm in pre-norm."""
    config = dataclasses.replace(translator.model.config, norm_first=norm_first)
    fresh = type(translator)(Transformer(config).eval(), translator.tokenizer)
    maps = fresh.attention(SENTENCE).kind(kind)
    token = len(maps.queries) - 1
    steps = explain_query(fresh, SENTENCE, kind, 0, 1, token)
    torch.testing.assert_close(
        torch.from_numpy(steps.weights), torch.from_numpy(maps.weights[0, 1, token])
    )


class EncoderOnly(Predictor):
    """A predictor of no registered job: two encoder layers over made-up embeddings."""

    job = "encoder-only"

    def __init__(self) -> None:
        config = ModelConfig.preset("tiny", n_heads=2, dropout=0.0)
        self.model = nn.ModuleList(EncoderLayer(config) for _ in range(2)).eval()
        self.d_model = config.d_model

    @torch.no_grad()
    def attention(self, text: str) -> RunAttention:
        words = text.split()
        x = torch.randn(1, len(words), self.d_model, generator=torch.Generator().manual_seed(0))
        weights = []
        for layer in self.model:
            x = layer(x, None, weights)
        stacked = torch.stack(weights)[:, 0].numpy()  # (L, H, S, S)
        return RunAttention(self.job, text, "-", [AttentionKind("encoder", stacked, words, words)])


def test_any_predictor_is_explained_and_a_missing_kind_is_one_sentence():
    predictor = EncoderOnly()
    steps = explain_query(predictor, "one two three", "encoder", 1, 1, 2)
    check_steps(steps, predictor.attention("one two three").kind("encoder").weights[1, 1, 2])
    for kind, title in [("decoder", "decoder masked self-attention"), ("cross", "encoder-decoder")]:
        with pytest.raises(InputError, match=f"an? encoder-only run has no {title}") as error:
            explain_query(predictor, "one two three", kind, 0, 0, 0)
        assert "--kind encoder" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(InputError, match="'decoder'"):
        RunAttention("encoder-only", "x", "-", []).kind("decoder")


@pytest.mark.parametrize(
    "kind, title, note",
    [
        ("encoder", "encoder self-attention", "marks the query token itself)"),
        ("decoder", "decoder masked self-attention", "the causal mask hides the keys after it"),
        ("cross", "encoder-decoder attention", "keys and values come from the source"),
    ],
)
def test_format_steps_names_the_kind(translator, kind, title, note):
    text = format_steps(explain_query(translator, SENTENCE, kind, 0, 1, 1))
    assert f"{title}, layer 0, head 1: query token 1" in text
    assert note in text and "weights sum to 1.000000" in text


def test_explain_command_prints_one_row_per_key(translation_run, translator, tmp_path, capsys):
    png = tmp_path / "steps.png"
    argv = ["explain", "--model", translation_run, SENTENCE, "--token", "3", "--layer", "1"]
    assert qkv(*argv, "--head", "1", "--png", png) == 0
    out = capsys.readouterr().out
    steps = explain_query(translator, SENTENCE, "encoder", 1, 1, 3)
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "key token" in line)
    rows = lines[header + 1 : header + 1 + len(steps.keys)]
    for j, row in enumerate(rows):
        number, token, score, weight = row.replace("*", " ").split()[:4]
        assert int(number) == j and token == steps.keys[j]
        assert float(score) == pytest.approx(float(steps.scores[j]), abs=1e-3)
        assert float(weight) == pytest.approx(float(steps.weights[j]), abs=1e-4)
    assert rows[3].startswith("  3*")
    assert "weights sum to 1.000000" in out and "d_k = 16" in out
    assert out.rstrip().endswith(str(png)) and png.read_bytes()[:4] == b"\x89PNG"


def test_explain_command_of_the_decoder(translation_run, translator, capsys):
    argv = ["explain", "--model", translation_run, SENTENCE, "--kind", "decoder", "--token", "1"]
    assert qkv(*argv) == 0
    out = capsys.readouterr().out
    steps = explain_query(translator, SENTENCE, "decoder", 0, 0, 1)
    assert "decoder masked self-attention, layer 0, head 0: query token 1" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "key token" in line)
    rows = lines[header + 1 : header + 1 + len(steps.keys)]
    assert [row.split()[2] for row in rows[2:]] == ["-inf"] * (len(rows) - 2)
    assert [float(row.split()[3]) for row in rows[2:]] == [0.0] * (len(rows) - 2)


@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_three_steps_figure(translator, kind):
    steps = explain_query(translator, SENTENCE, kind, 0, 0, 1)
    figure = three_steps_figure(steps)
    assert len(figure.axes) == 3
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == steps.keys
    widths = [p.get_width() for p in figure.axes[1].patches]
    np.testing.assert_allclose(widths, steps.weights)
    assert figure.get_suptitle().startswith(steps.title)


@pytest.mark.parametrize(
    "options, message",
    [
        (["--token", "99"], "--token 99 is out of range: the tokens of '"),
        (["--token", "-1"], "--token -1 is out of range"),
        (["--layer", "2"], "--layer 2 is out of range: the encoder layers are 0 to 1"),
        (["--head", "2"], "--head 2 is out of range: the heads are 0 to 1"),
        (["--kind", "decoder", "--layer", "1"], "--layer 1 is out of range: the decoder layers"),
        (["--kind", "cross", "--token", "99"], "--token 99 is out of range: the tokens of '<s>"),
    ],
)
def test_out_of_range_is_one_clear_line(translation_run, capsys, options, message):
    assert qkv("explain", "--model", translation_run, SENTENCE, *options) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"qkv: error: {message}")
