import json

from qkv.demo import run_demo


def test_demo_trains_translates_and_writes_a_summary(tmp_path, capsys):
    summary = run_demo(tmp_path / "demo", max_time=3.0, progress=False)
    written = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert written["test_sentences"] == 1000
    assert 0.0 <= written["test_exact_match"] <= 100.0
    assert written["steps"] == summary["steps"] >= 1
    out = capsys.readouterr().out
    assert out.count("->") == 5  # five held-out sentences shown with their translations
    assert "exact match" in out
    pictures = [
        tmp_path / "demo" / "attention" / name
        for name in (
            "encoder_layer0.png",
            "decoder_layer0.png",
            "cross_layer0.png",
            "attention.html",
        )
    ]
    assert all(p.is_file() for p in pictures)
    assert all(str(p) in out for p in pictures)
