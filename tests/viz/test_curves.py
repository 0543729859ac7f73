import numpy as np
import pytest

from qkv.embeddings import sinusoid_table
from qkv.viz.curves import positional_encoding_figure, read_metrics, training_curves_figure

from .conftest import qkv


def test_training_curves(translation_run):
    metrics = read_metrics(translation_run / "metrics.csv")
    assert {"train_loss", "val_loss", "val_bleu", "lr"} <= set(metrics)
    figure = training_curves_figure(metrics, "run")
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == ["loss", "bleu", "chrf", "exact_match", "learning rate"]
    steps = [x for x, _ in metrics["val_loss"]]
    assert steps == [3.0, 6.0]
    np.testing.assert_array_equal(figure.axes[0].lines[1].get_xdata(), steps)


def test_positional_encoding_figure():
    figure = positional_encoding_figure(50, 16)
    table = figure.axes[0].images[0].get_array()
    np.testing.assert_array_equal(table, sinusoid_table(50, 16).numpy())


def test_plot_command(translation_run, tmp_path, capsys):
    assert qkv("plot", translation_run) == 0
    assert (translation_run / "curves.png").is_file()
    png = tmp_path / "pe.png"
    argv = ["--positional-encoding", "--max-len", "20", "--d-model", "8", "--out", png]
    assert qkv("plot", *argv) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert capsys.readouterr().out.split() == [str(translation_run / "curves.png"), str(png)]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{tmp}"], "config.json"),
        ([], "give a RUN_DIR"),
        (["--positional-encoding", "--out", "{tmp}/pe.png", "--d-model", "7"], "--d-model 7"),
        (["--positional-encoding"], "--positional-encoding needs --out"),
    ],
)
def test_plot_mistakes_are_one_clear_line(tmp_path, capsys, argv, message):
    assert qkv("plot", *[a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("qkv: error: ") and message in err


def test_curves_leave_out_the_averaged_checkpoints_in_old_and_new_run_folders(tmp_path):
    header = "step,train_loss,val_loss,note\n"
    layouts = {
        "marked": "2,3.0,,\n2,,2.5,\n3,,2.4,final\n3,,2.3,averaged\n",
        "old, stopped off a validation step": "2,3.0,,\n2,,2.5,\n3,,2.4,final\n3,,2.3,final\n",
        "old, stopped on a validation step": "2,3.0,,\n2,,2.5,\n4,,2.4,\n4,,2.3,final\n",
    }
    for i, (name, rows) in enumerate(layouts.items()):
        path = tmp_path / f"metrics{i}.csv"
        path.write_text(header + rows)
        assert [v for _, v in read_metrics(path)["val_loss"]] == [2.5, 2.4], name
