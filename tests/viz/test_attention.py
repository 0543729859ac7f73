"""Every job's run gives its attention the same way; viz draws and explains any of them."""

import numpy as np
import pytest
import torch

from qkv.errors import InputError
from qkv.jobs import load_run
from qkv.viz.attention import CLS_TOKEN, run_attention
from qkv.viz.explain import explain_query
from qkv.viz.heatmaps import attention_pictures

from .conftest import qkv, train_encoder_run


@pytest.mark.parametrize("job", ["tagger", "classifier", "vit"])
def test_encoder_only_runs(job, tmp_path, capsys):
    run, text = train_encoder_run(job, tmp_path)
    maps = run_attention(run, text)
    assert maps.job == job and [k.name for k in maps.kinds] == ["encoder"]
    encoder = maps.kinds[0]
    S = len(encoder.keys)
    assert encoder.weights.shape == (2, 2, S, S)
    np.testing.assert_allclose(encoder.weights.sum(-1), 1.0, atol=1e-5)
    if job == "vit":
        assert encoder.keys == [CLS_TOKEN, "(0,0)", "(0,1)", "(1,0)", "(1,1)"]
        assert maps.image.shape == (8, 8) and maps.grid == (2, 2)
    if job == "classifier":
        assert encoder.keys[0] == CLS_TOKEN and "probability" in maps.output
    paths = attention_pictures(maps, tmp_path / "pictures", layer=1)
    assert [p.name for p in paths] == [("vit" if job == "vit" else "encoder") + "_layer1.png"]
    predictor = load_run(run)
    steps = explain_query(predictor, text, "encoder", 1, 1, S - 1)
    torch.testing.assert_close(
        torch.from_numpy(steps.weights), torch.from_numpy(encoder.weights[1, 1, S - 1])
    )
    assert steps.keys == encoder.keys
    with pytest.raises(InputError, match=f"a {job} run has no decoder masked self-attention"):
        explain_query(predictor, text, "decoder", 0, 0, 0)
    assert qkv("explain", "--model", run, text, "--kind", "cross") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"a {job} run has no encoder-decoder attention" in err
