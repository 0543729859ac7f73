import dataclasses

import numpy as np
import pytest
import torch

from qkv import checkpoint as ckpt
from qkv.config import ModelConfig
from qkv.explain import encoder_layers, explain_query, explain_with, load_runner
from qkv.model import Transformer
from qkv.tasks.translation import Translator
from qkv.viz import three_steps_figure

from .test_viz import qkv, tiny_translation_run

SENTENCE = "the dog sees a cat"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tiny_translation_run(tmp_path_factory)


@pytest.fixture(scope="module")
def model_weights(run_dir):
    """The encoder's own weights (L, H, S, S), straight from the model's attentions=[]."""
    translator = Translator.load(run_dir)
    src = torch.tensor(translator.encode_sources([SENTENCE]))
    attentions = []
    with torch.no_grad():
        translator.model.encode(src, attentions=attentions)
    return torch.stack(attentions)[:, 0].numpy()


@pytest.mark.parametrize("layer, head, token", [(0, 0, 0), (0, 1, 3), (1, 1, 5), (1, 0, 9)])
def test_weights_are_the_models_own(run_dir, model_weights, layer, head, token):
    steps = explain_query(run_dir, SENTENCE, token, layer, head)
    torch.testing.assert_close(
        torch.from_numpy(steps.weights), torch.from_numpy(model_weights[layer, head, token])
    )
    torch.testing.assert_close(
        torch.from_numpy(steps.model_weights), torch.from_numpy(model_weights[layer, head, token])
    )
    assert steps.weights.sum() == pytest.approx(1.0, abs=1e-6)
    expected = torch.softmax(torch.from_numpy(steps.scores), -1)
    torch.testing.assert_close(torch.from_numpy(steps.weights), expected)
    np.testing.assert_allclose(steps.output, steps.weights @ steps.values, rtol=1e-5, atol=1e-6)
    assert steps.shares.sum() == pytest.approx(steps.output_norm, rel=1e-4)
    assert len(steps.keys) == model_weights.shape[-1] and steps.head_dim == 16


def test_the_weighted_sums_of_all_heads_are_the_layers_attention_output(run_dir):
    """Concatenate step 3 of every head, apply W_o: the sublayer's own output at that token."""
    task, translator = load_runner(run_dir)
    attn = encoder_layers(translator.model)[1].self_attn
    seen = []
    handle = attn.register_forward_hook(lambda m, args, out: seen.append(out[0]))
    try:
        outputs = [explain_with(task, translator, SENTENCE, 4, 1, h).output for h in range(2)]
    finally:
        handle.remove()
    with torch.no_grad():
        mixed = attn.out_proj(torch.from_numpy(np.concatenate(outputs)))  # (D,)
    torch.testing.assert_close(mixed, seen[-1][0, 4], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_pre_and_post_norm_both_explained(run_dir, norm_first):
    """q, k, v come from what self_attn sees, which is after the LayerNorm in pre-norm."""
    config = ModelConfig.from_dict(ckpt.read_run_config(run_dir)["model"])
    config = dataclasses.replace(config, norm_first=norm_first)
    translator = Translator(Transformer(config), Translator.load(run_dir).tokenizer)
    src = torch.tensor(translator.encode_sources([SENTENCE]))
    attentions = []
    with torch.no_grad():
        translator.model.encode(src, attentions=attentions)
    steps = explain_with("translation", translator, SENTENCE, 2, 1, 0)
    torch.testing.assert_close(torch.from_numpy(steps.weights), attentions[1][0, 0, 2])


def test_explain_command_prints_one_row_per_key(run_dir, tmp_path, capsys):
    png = tmp_path / "steps.png"
    argv = ["explain", "--model", str(run_dir), SENTENCE, "--token", "3", "--layer", "1"]
    assert qkv([*argv, "--head", "1", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    steps = explain_query(run_dir, SENTENCE, 3, 1, 1)
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


def test_three_steps_figure(run_dir):
    steps = explain_query(run_dir, SENTENCE, 1, 0, 0)
    figure = three_steps_figure(steps)
    assert len(figure.axes) == 3
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == steps.keys
    widths = [p.get_width() for p in figure.axes[1].patches]
    np.testing.assert_allclose(widths, steps.weights)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--token", "99", "--token 99 is out of range: the tokens of '▁the"),
        ("--token", "-1", "--token -1 is out of range"),
        ("--layer", "2", "--layer 2 is out of range: the encoder layers are 0 to 1"),
        ("--head", "2", "--head 2 is out of range: the heads are 0 to 1"),
    ],
)
def test_out_of_range_is_one_clear_line(run_dir, capsys, option, value, message):
    assert qkv(["explain", "--model", str(run_dir), SENTENCE, option, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"qkv: error: {message}")


# ---------------------------------------------------------------- the encoder-only run kinds

WORDS = {"DET": ["the", "a"], "NOUN": ["dog", "cat", "bird"], "VERB": ["sees", "likes"]}


def write_conllu(path, n):
    rng = np.random.default_rng(0)
    blocks = []
    for _ in range(n):
        tags = ["DET", "NOUN", "VERB", "DET", "NOUN"]
        words = [WORDS[t][rng.integers(len(WORDS[t]))] for t in tags]
        lines = [f"# text = {' '.join(words)}"]
        lines += [
            f"{i}\t{w}\t{w}\t{t}\t_\t_\t0\tdep\t_\t_"
            for i, (w, t) in enumerate(zip(words, tags, strict=True), 1)
        ]
        blocks.append("\n".join(lines) + "\n")
    path.write_text("\n".join(blocks) + "\n", encoding="utf-8")
    return path


def train_tiny(kind, folder):
    """A run of ``kind`` trained for two steps into ``folder``/run; returns (run, input)."""
    from .helpers import tiny_model_config, tiny_train_config

    out = folder / "run"
    model = tiny_model_config(n_encoder_layers=2, dropout=0.0)
    train = tiny_train_config(out, max_steps=2, eval_every=2, max_tokens=300)
    torch.manual_seed(0)
    if kind == "tagger":
        from qkv.tasks.tagging import train_tagger

        data = write_conllu(folder / "train.conllu", 20)
        train_tagger(data, data, model, train, vocab_size=60, char_dim=8)
        return out, "the bird sees a dog"
    if kind == "classifier":
        from qkv.tasks.classification import ClassifierOptions, LabeledTexts, train_classifier

        pairs = [("pos", "a fine good film"), ("neg", "a dull bad film")] * 10
        texts = LabeledTexts.from_pairs(pairs)
        train_classifier(texts, texts, model, train, ClassifierOptions("cls", vocab_size=60))
        return out, "a good film"
    from PIL import Image

    from qkv.tasks.vision import digits_labels, digits_splits, train_vit
    from qkv.vision_model import ImageConfig

    splits = digits_splits()
    image = ImageConfig(image_size=8, patch_size=4)
    train_vit(
        splits["train"].subset(np.arange(64)),
        splits["valid"].subset(np.arange(20)),
        digits_labels(),
        model,
        image,
        train,
        {"source": "digits", "pixel_max": 16.0},
    )
    png = folder / "digit.png"
    pixels = splits["test"].images[0, 0].numpy() * 255
    Image.fromarray(pixels.round().astype(np.uint8)).save(png)
    return out, str(png)


@pytest.mark.parametrize("kind", ["tagger", "classifier", "vit"])
def test_encoder_only_runs(kind, tmp_path):
    from qkv.explain import run_attention
    from qkv.viz import attention_pictures

    run, text = train_tiny(kind, tmp_path)
    maps = run_attention(run, text)
    assert [k.name for k in maps.kinds] == ["encoder"]
    encoder = maps.kinds[0]
    S = len(encoder.keys)
    assert encoder.weights.shape == (2, 2, S, S)
    if kind == "vit":
        assert encoder.keys == ["[CLS]", "(0,0)", "(0,1)", "(1,0)", "(1,1)"]
        assert maps.image.shape == (8, 8) and maps.grid == (2, 2)
    if kind == "classifier":
        assert encoder.keys[0] == "[CLS]" and "probability" in maps.output
    paths = attention_pictures(maps, tmp_path / "pictures", layer=1)
    assert [p.name for p in paths] == [("vit" if kind == "vit" else "encoder") + "_layer1.png"]
    steps = explain_query(run, text, S - 1, 1, 1)
    torch.testing.assert_close(
        torch.from_numpy(steps.weights), torch.from_numpy(encoder.weights[1, 1, S - 1])
    )
    assert steps.keys == encoder.keys
