"""CTranslate2 export and ``--engine ctranslate2``: the same translations as qkv's own decoder.

CTranslate2 is an implementation nobody here wrote, so these are parity tests against an
outsider: log-probabilities of whole target sentences, greedy outputs of a trained translator,
int8 quality, and the command line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "ctranslate2", reason="CTranslate2 is not installed (pip install qkv[ctranslate2])"
)

from qkv.cli import main  # noqa: E402
from qkv.data import BOS_ID, EOS_ID, SubwordTokenizer  # noqa: E402
from qkv.decoding import translate_ids  # noqa: E402
from qkv.jobs.run import run_job  # noqa: E402
from qkv.jobs.translation import (  # noqa: E402
    JOB,
    DecodeOptions,
    Translator,
    corpus_scores,
    ct2,
)
from qkv.jobs.translation.ct2 import CTranslate2Translator, int8_kernels_exact  # noqa: E402
from qkv.jobs.translation.export import EXPORT_INFO, export_ctranslate2  # noqa: E402
from qkv.model import Transformer  # noqa: E402
from tests.helpers import (  # noqa: E402
    tiny_model_config,
    tiny_pairs,
    tiny_train_config,
    tiny_translation_settings,
)

# A model that learns the generated language in ~400 steps (BLEU ~45 on held-out sentences).
TRAINED_MODEL = dict(
    d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0
)
VARIANTS = {
    "post-norm": dict(norm_first=False),
    "pre-norm": dict(norm_first=True),
    "pre-norm without final norm, gelu": dict(norm_first=True, final_norm=False, activation="gelu"),
    "untied, separate embeddings, learned positions": dict(
        share_embeddings=False, tie_output=False, positional="learned"
    ),
}


@pytest.fixture(scope="module")
def splits():
    return tiny_pairs(2000, 100)


@pytest.fixture(scope="module")
def run(tmp_path_factory, splits) -> Path:
    """A trained pre-norm translator's run folder."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("ct2") / "run"
    run_job(
        JOB,
        tiny_translation_settings(vocab_size=300, label_smoothing=0.0, max_tokens=1000),
        tiny_model_config(**TRAINED_MODEL, norm_first=True),
        tiny_train_config(out, max_steps=400, eval_every=400, warmup_steps=50),
        data={"train": splits["train"], "valid": splits["valid"]},
    )
    return out


@pytest.fixture(scope="module")
def held_out(splits) -> tuple[list[str], list[str]]:
    pairs = splits["valid"] + splits["test"]
    return [s for s, _ in pairs], [t for _, t in pairs]


@pytest.fixture(scope="module")
def tokenizer(splits) -> SubwordTokenizer:
    return SubwordTokenizer.train([side for pair in splits["train"][:300] for side in pair], 120)


def random_model(tokenizer: SubwordTokenizer, **overrides) -> Transformer:
    """An untrained model with weights far enough from their init to differ everywhere."""
    config = tiny_model_config(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
    )
    model = Transformer(dataclasses.replace(config, **overrides)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_score_and_decode_as_qkv(variant, tokenizer, tmp_path):
    model = random_model(tokenizer, **VARIANTS[variant])
    translator = CTranslate2Translator(
        export_ctranslate2(model, tokenizer, tmp_path),
        tokenizer,
        model.config,
        DecodeOptions(beam_size=1, engine="ctranslate2", compute_type="float32"),
    )
    V = tokenizer.vocab_size
    src = torch.randint(4, V, (3, 7))  # (B, S) without </s>
    tgt = torch.randint(4, V, (3, 5))  # (B, T) without <s> and </s>
    # Every log-prob of the whole target, </s> included: encoder and decoder at once.
    qkv_src = torch.cat([src, torch.full((3, 1), EOS_ID)], dim=1)
    qkv_in = torch.cat([torch.full((3, 1), BOS_ID), tgt], dim=1)
    qkv_out = torch.cat([tgt, torch.full((3, 1), EOS_ID)], dim=1)
    with torch.no_grad():
        expected = model.log_probs(qkv_src, qkv_in).gather(-1, qkv_out[..., None])[..., 0]
    scored = translator.engine.score_batch(
        [tokenizer.token_strings(s.tolist()) for s in src],
        [tokenizer.token_strings(t.tolist()) for t in tgt],
    )
    actual = torch.tensor([r.log_probs for r in scored])
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    # Greedy decoding: untrained logits have near-ties late on, so compare the first tokens.
    ours = translate_ids(model, qkv_src, beam_size=1)
    theirs = translator.translate_ids(qkv_src.tolist())
    assert [ids[:3] for ids in theirs] == [ids[:3] for ids in ours]
    assert [len(ids) for ids in theirs] == [len(ids) for ids in ours]


def test_post_norm_with_final_norm_is_refused(tokenizer, tmp_path):
    model = random_model(tokenizer, norm_first=False, final_norm=True)
    with pytest.raises(ValueError, match="no CTranslate2 equivalent"):
        export_ctranslate2(model, tokenizer, tmp_path)


def test_trained_translator_float32_greedy_agrees(run, held_out):
    sources, references = held_out
    ours = Translator.load(run, beam_size=1)
    theirs = CTranslate2Translator.from_model(
        ours.model, ours.tokenizer, DecodeOptions(beam_size=1, engine="ctranslate2"), ours.settings
    )
    expected, actual = ours.translate(sources), theirs.translate(sources)
    assert corpus_scores(expected, references)["bleu"] > 20  # a translator, not noise
    same = sum(a == e for a, e in zip(actual, expected, strict=True)) / len(sources)
    assert same >= 0.98, f"CTranslate2 float32 agrees with qkv on {same:.1%} of sentences"


@pytest.mark.skipif(
    not int8_kernels_exact(), reason="CTranslate2's int8 keeps float32's BLEU only with AVX-512"
)
def test_int8_bleu_within_half_a_point(run, held_out, tmp_path):
    sources, references = held_out
    model = Translator.load(run)
    folder = export_ctranslate2(model.model, model.tokenizer, tmp_path, "int8")
    scores = {}
    for compute_type in ("float32", "int8"):
        options = DecodeOptions(beam_size=1, engine="ctranslate2", compute_type=compute_type)
        translator = CTranslate2Translator.from_export(folder, options)
        scores[compute_type] = translator.evaluate(sources, references)["bleu"]
    assert scores["float32"] > 20
    assert abs(scores["int8"] - scores["float32"]) <= 0.5, scores


def test_beam_search_agrees(run, held_out):
    sources = held_out[0][:40]
    ours = Translator.load(run, beam_size=4)
    theirs = JOB.predictor(ours.model, ours.settings, ours.tokenizer, engine="ctranslate2")
    assert isinstance(theirs, CTranslate2Translator)
    same = sum(
        a == e for a, e in zip(theirs.translate(sources), ours.translate(sources), strict=True)
    )
    assert same >= 0.98 * len(sources)


def test_cli_export_then_translate(run, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", "--model", str(run), "--to", "ctranslate2", str(out)]) == 0
    info = json.loads((out / EXPORT_INFO).read_text())
    assert (info["job"], info["quantization"]) == ("translation", "float32")
    assert info["source_run"] == str(run.resolve())
    lines = ["three trees moved your angry keys", "", "my lazy frog"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    args = ["translate", "--model", str(run), "--input", str(tmp_path / "in.txt"), "--no-progress"]
    assert main([*args, "--engine", "ctranslate2", "--compute-type", "int8"]) == 0
    result = capsys.readouterr()
    outputs = result.out.splitlines()
    assert len(outputs) == len(lines) and outputs[1] == "" and outputs[0] and outputs[2]
    assert "converting it for this session" in result.err  # the run has no ctranslate2/ yet
    assert main([*args, "--beam", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == ""


def test_exports_are_found_in_the_run_and_alone(run, tmp_path):
    options = dict(engine="ctranslate2", beam_size=1)
    assert JOB.load_export(run, **options) is None  # no export yet: convert at load time
    assert main(["export", "--model", str(run), "--to", "ctranslate2"]) == 0
    try:
        in_run = JOB.load_export(run, **options)
        assert isinstance(in_run, CTranslate2Translator)
        assert in_run.folder == run / "ctranslate2"
        alone = JOB.load_export(run / "ctranslate2", **options)
        assert alone.translate(["my lazy frog", ""]) == in_run.translate(["my lazy frog", ""])
        with pytest.raises(ValueError, match="--engine ctranslate2"):
            JOB.load_export(run / "ctranslate2", engine="qkv")
    finally:
        for path in (run / "ctranslate2").iterdir():
            path.unlink()
        (run / "ctranslate2").rmdir()


def _one_error(capsys, argv: list[str], text: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("qkv: error: ") and text in err, err


def test_cli_errors_are_one_line(run, tmp_path, capsys, monkeypatch):
    full = tmp_path / "full"
    full.mkdir()
    (full / "something").write_text("x")
    export = ["export", "--to", "ctranslate2"]
    _one_error(capsys, [*export, "--model", str(run), str(full)], "--force")
    tagger = tmp_path / "tagger"
    tagger.mkdir()
    (tagger / "config.json").write_text(json.dumps({"job": "tagger", "settings": {}}))
    _one_error(capsys, [*export, "--model", str(tagger), str(tmp_path / "o")], "'tagger' run")
    translate = ["translate", "--model", str(run), "x"]
    _one_error(capsys, [*translate, "--compute-type", "int8"], "--engine ctranslate2")
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if not installed
    _one_error(capsys, [*export, "--model", str(run), str(tmp_path / "o")], "qkv[ctranslate2]")
    _one_error(capsys, [*translate, "--engine", "ctranslate2"], "qkv[ctranslate2]")


def test_int8_without_avx512_says_what_it_costs(run, tmp_path, monkeypatch, capsys):
    model = Translator.load(run)
    folder = export_ctranslate2(model.model, model.tokenizer, tmp_path, "int8")
    for exact, warned in ((True, False), (False, True)):
        monkeypatch.setattr(ct2, "int8_kernels_exact", lambda exact=exact: exact)
        for compute_type, expected in (("int8", warned), ("float32", False)):
            options = DecodeOptions(beam_size=1, engine="ctranslate2", compute_type=compute_type)
            CTranslate2Translator.from_export(folder, options)
            said = ct2.INT8_WITHOUT_AVX512 in capsys.readouterr().err
            assert said == expected, (exact, compute_type)
