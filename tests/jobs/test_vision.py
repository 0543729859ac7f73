"""The ViT job: patches, image data, training on digits and on class folders, inference, CLI."""

import csv
import json

import numpy as np
import pytest
import torch
from PIL import Image

from qkv.cli import main
from qkv.config import ModelConfig
from qkv.errors import InputError
from qkv.jobs.vision import (
    JOB,
    ImageClassifier,
    ImageConfig,
    VisionSettings,
    VisionTransformer,
    digits_splits,
    image_config,
    patchify,
)
from qkv.jobs.vision.data import (
    Augmentation,
    digits_labels,
    image_array,
    move_images,
    read_image_folder,
    shift_images,
    shifted_views,
    stratified_split,
    warp_images,
)
from qkv.jobs.vision.model import unpatchify, vit_model_config
from qkv.jobs.vision.task import VisionTask, batched_logits

TINY = [
    "--d-model",
    "16",
    "--n-heads",
    "2",
    "--d-ff",
    "32",
    "--n-encoder-layers",
    "1",
    "--no-progress",
    "--log-every",
    "1",
]


def tiny_model_config(**overrides):
    values = dict(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, norm_first=True)
    return ModelConfig.preset("tiny", **{**values, **overrides})


def train_cli(*args):
    return main(["train", "vit", *map(str, args), *TINY])


def folder_tree(folder):
    """Every file under ``folder`` with its size and modification time."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vit") / "run"
    assert train_cli("--out", out, "--max-steps", 4, "--eval-every", 2, "--warmup-steps", 2) == 0
    return out


def digit_png(folder, index):
    """A digit of load_digits as an 8-bit PNG: ink 0..16 -> 0..255."""
    from sklearn.datasets import load_digits

    pixels = np.round(load_digits().images[index] * 255 / 16).astype(np.uint8)
    path = folder / f"digit{index}.png"
    Image.fromarray(pixels).save(path)
    return path


def write_class_folders(root, per_class=4, size=12):
    """Three classes of tiny pictures: a bright top half, a bright left half, a dark square."""
    for name in ("dark", "left", "top"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.random.RandomState(i).randint(0, 40, (size, size, 3)).astype(np.uint8)
            if name == "top":
                pixels[: size // 2] = 220
            elif name == "left":
                pixels[:, : size // 2] = 220
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


# -- patches and the model --------------------------------------------------------------------


def test_patches_are_cut_row_by_row_and_fold_back_into_the_image():
    images = torch.randn(2, 3, 8, 8)
    patches = patchify(images, 2)
    assert patches.shape == (2, 16, 12)
    for row in range(4):
        for col in range(4):
            expected = images[:, :, 2 * row : 2 * row + 2, 2 * col : 2 * col + 2].flatten(1)
            torch.testing.assert_close(patches[:, row * 4 + col], expected)
    torch.testing.assert_close(unpatchify(patches, 8, 3, 2), images)
    assert patchify(images, 2, stride=1).shape == (2, 49, 12)


def test_image_config_checks_that_patches_tile_the_image():
    assert ImageConfig(image_size=8, patch_size=2, patch_stride=1).grid == (7, 7)
    with pytest.raises(ValueError, match="do not tile"):
        ImageConfig(image_size=8, patch_size=3)
    with pytest.raises(ValueError, match="larger than"):
        ImageConfig(image_size=4, patch_size=8)


def test_model_reads_cls_plus_patches_and_gives_class_logits():
    image = ImageConfig(image_size=8, channels=3, patch_size=4, n_classes=5)
    model = VisionTransformer(vit_model_config(tiny_model_config(), image), image).eval()
    maps = model.attention_maps(torch.rand(3, 3, 8, 8))
    assert maps["logits"].shape == (3, 5)
    assert maps["encoder"].shape == (1, 3, 2, 5, 5)  # L, B, H, 1 + 4 patches twice
    torch.testing.assert_close(maps["encoder"].sum(-1), torch.ones(1, 3, 2, 5))


# -- settings ---------------------------------------------------------------------------------


def test_settings_fill_sizes_from_the_data_and_give_the_image_config():
    digits = JOB.resolve(VisionSettings())
    assert (digits.image_size, digits.patch_size) == (8, 2)
    folder = JOB.resolve(VisionSettings(train="pics", color="rgb", patch_stride=2))
    assert (folder.image_size, folder.patch_size) == (32, 4)
    image = image_config(folder, 3)
    assert (image.channels, image.grid, image.n_classes) == (3, (15, 15), 3)
    assert JOB.resolve(VisionSettings(train="pics", image_size=16)).image_size == 16


@pytest.mark.parametrize(
    "settings, words",
    [
        (dict(valid="v"), "--valid needs --train"),
        (dict(image_size=16), "--image-size needs --train"),
        (dict(color="rgb"), "--color rgb needs --train"),
        (dict(valid_fraction=1.0), "--valid-fraction"),
        (dict(batch_size=0), "--batch-size"),
        (dict(zoom=1.5), "--zoom"),
        (dict(test_shift=-1), "--test-shift"),
        (dict(patch_size=3), "--patch-size"),
        (dict(label_smoothing=1.0), "--label-smoothing"),
    ],
)
def test_settings_check_names_the_bad_option(settings, words):
    with pytest.raises(InputError, match=words):
        JOB.resolve(VisionSettings(**settings)).check()


def test_train_help_shows_only_what_a_vit_uses(capsys):
    with pytest.raises(SystemExit):
        main(["train", "vit", "--help"])
    text = capsys.readouterr().out
    for absent in ("--max-tokens", "--positional", "--n-decoder-layers", "--data "):
        assert absent not in text, absent
    for present in ("--train", "--batch-size", "--post-norm", "--patch-size"):
        assert present in text, present


# -- data -------------------------------------------------------------------------------------


def test_stratified_split_is_disjoint_complete_and_keeps_every_class():
    labels = np.repeat(np.arange(4), [10, 5, 2, 1])
    test, valid, train = stratified_split(labels, [0.2, 0.2], seed=3)
    every = np.concatenate([test, valid, train])
    assert sorted(every.tolist()) == list(range(len(labels)))
    assert set(labels[train].tolist()) == {0, 1, 2, 3}
    again = stratified_split(labels, [0.2, 0.2], seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(again, [test, valid, train], strict=True))


def test_digit_splits_do_not_overlap():
    splits = digits_splits(seed=0, valid_fraction=0.1, test_fraction=0.2)
    sizes = {name: len(s) for name, s in splits.items()}
    assert sum(sizes.values()) == 1797 and 340 <= sizes["test"] <= 380
    flat = {name: {tuple(x.flatten().tolist()) for x in s.images} for name, s in splits.items()}
    # a few digits of load_digits are exact duplicates of one another; nearly none may cross
    assert len(flat["test"] & flat["train"]) <= 2
    assert splits["train"].images.max() <= 1.0 and splits["train"].images.shape[1:] == (1, 8, 8)


def test_read_data_of_the_digits_follows_the_split_settings():
    data = JOB.read_data(JOB.resolve(VisionSettings(split_seed=3, valid_fraction=0.2)))
    expected = digits_splits(3, 0.2, 0.2)
    for split in ("train", "valid", "test"):
        torch.testing.assert_close(data[split].labels, expected[split].labels)
    assert data["labels"].names == digits_labels().names


def test_shifts_move_whole_images_and_depend_only_on_the_seed():
    images = torch.rand(16, 1, 8, 8)
    shifted = shift_images(images, 1, torch.Generator().manual_seed(5))
    torch.testing.assert_close(shift_images(images, 1, torch.Generator().manual_seed(5)), shifted)
    torch.testing.assert_close(shift_images(images, 0, torch.Generator()), images)
    for original, moved in zip(images, shifted, strict=True):
        windows = [move_images(original, dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
        assert any(torch.equal(moved, w) for w in windows)


def test_moves_take_each_pixel_from_its_neighbour_and_repeat_the_edges():
    images = torch.rand(3, 2, 5, 7)
    for dy, dx in [(0, 0), (1, 0), (0, -2), (-1, 1), (2, 3)]:
        moved = move_images(images, dy, dx)
        rows = (torch.arange(5) - dy).clamp(0, 4)
        cols = (torch.arange(7) - dx).clamp(0, 6)
        torch.testing.assert_close(moved, images[:, :, rows][:, :, :, cols])


def test_shifted_views_are_the_image_then_four_moves():
    images = torch.rand(2, 1, 8, 8)
    assert len(shifted_views(images, 0)) == 1 and shifted_views(images, 0)[0] is images
    views = shifted_views(images, 2)
    assert len(views) == 5 and views[0] is images
    moves = [(-2, 0), (2, 0), (0, -2), (0, 2)]
    for view, (dy, dx) in zip(views[1:], moves, strict=True):
        torch.testing.assert_close(view, move_images(images, dy, dx))


def test_warps_keep_the_image_at_zero_and_depend_only_on_the_seed():
    images = torch.rand(4, 3, 8, 8)
    torch.testing.assert_close(warp_images(images, 0.0, 0.0, torch.Generator()), images)
    warped = warp_images(images, 15.0, 0.1, torch.Generator().manual_seed(2))
    again = warp_images(images, 15.0, 0.1, torch.Generator().manual_seed(2))
    torch.testing.assert_close(warped, again)
    assert warped.shape == images.shape and not torch.allclose(warped, images)
    # a constant image stays constant under any rotation and zoom (edges are repeated)
    flat = torch.full((2, 1, 8, 8), 0.25)
    torch.testing.assert_close(warp_images(flat, 30.0, 0.2, torch.Generator()), flat)


def test_train_batches_are_fixed_per_seed_and_epoch():
    splits = digits_splits()
    task = VisionTask(splits["train"], splits["valid"], 10, 100, Augmentation(1, 10.0, 0.1), 0.1)
    first, again = task.train_batches(2, 1), task.train_batches(2, 1)
    other = task.train_batches(3, 1)
    torch.testing.assert_close(first[0]["images"], again[0]["images"])
    assert not torch.equal(first[0]["images"], other[0]["images"])
    assert sum(len(b["labels"]) for b in first) == len(splits["train"])


def test_image_array_converts_paths_pil_images_and_arrays(tmp_path):
    image = ImageConfig(image_size=8, channels=1)
    path = digit_png(tmp_path, 0)
    from_file = image_array(path, image)
    assert from_file.shape == (8, 8, 1) and 0 <= from_file.min() and from_file.max() <= 1
    big = Image.open(path).convert("RGB").resize((32, 32))
    assert image_array(big, image).shape == (8, 8, 1)
    assert image_array(np.full((16, 16, 3), 255.0), image).min() == pytest.approx(1.0)
    rgb = ImageConfig(image_size=4, channels=3, patch_size=2)
    assert image_array(path, rgb).shape == (4, 4, 3)


def test_read_image_folder_reuses_a_runs_labels(tmp_path):
    data = write_class_folders(tmp_path / "data", per_class=2)
    image = ImageConfig(image_size=4, channels=1, patch_size=2)
    dataset, labels = read_image_folder(data, image)
    assert dataset.images.shape == (6, 1, 4, 4) and dataset.labels.tolist() == [0, 0, 1, 1, 2, 2]
    (data / "new").mkdir()
    Image.new("L", (4, 4)).save(data / "new" / "a.png")
    with pytest.raises(InputError, match="never seen"):
        read_image_folder(data, image, labels)


# -- training and using a run -----------------------------------------------------------------


def test_cli_run_folder_holds_weights_labels_and_confusion(digits_run):
    for name in ("model.safetensors", "labels.json", "config.json", "confusion.png"):
        assert (digits_run / name).is_file(), name
    config = json.loads((digits_run / "config.json").read_text())
    assert config["job"] == "vit" and config["settings"]["train"] is None
    settings = config["settings"]
    assert (settings["image_size"], settings["patch_size"], settings["batch_size"]) == (8, 2, 64)
    assert config["model"]["max_len"] == 17 and config["model"]["norm_first"] is True
    assert config["model"]["n_decoder_layers"] == 0
    assert config["model"]["activation"] == "gelu"
    # the benchmarked recipe (benchmarks/vit_digits.py) is what the defaults give
    train = config["train"]
    # precision: measured on the machine (--precision auto), as for every job
    assert train["lr"] == pytest.approx(3e-3) and train["precision"] == "auto"
    assert train["average_last"] == 5 and train["weight_decay"] == pytest.approx(0.05)
    assert (settings["shift"], settings["rotate"], settings["zoom"]) == (1, 10.0, 0.1)
    summary = json.loads((digits_run / "summary.json").read_text())
    assert summary["steps"] == 4 and 0 <= summary["test_accuracy"] <= 100
    assert summary["test_images"] == len(digits_splits()["test"])
    assert Image.open(digits_run / "confusion.png").format == "PNG"


def test_classifier_predicts_files_pil_images_and_arrays_alike(digits_run, tmp_path):
    from sklearn.datasets import load_digits

    classifier = ImageClassifier.load(digits_run)
    path = digit_png(tmp_path, 7)
    raw = load_digits().images[7]  # 0..16, the scale of this run's training images
    predictions = classifier.predict([path, Image.open(path), raw])
    assert len({label for label, _ in predictions}) == 1
    assert predictions[0][0] in digits_labels().names
    probs = [p for _, p in predictions]
    assert all(0 < p <= 1 for p in probs)
    assert probs[0] == pytest.approx(probs[2], abs=0.02)
    assert classifier.predict([]) == []


def test_batch_size_does_not_change_predictions(digits_run, tmp_path):
    paths = [str(digit_png(tmp_path, i)) for i in range(5)]
    together = ImageClassifier.load(digits_run).predict_lines(paths)
    one_by_one = ImageClassifier.load(digits_run, batch_size=1).predict_lines(paths)
    assert together == one_by_one
    lines = ImageClassifier.load(digits_run).predict_lines([paths[0], "", paths[1]])
    assert lines[1] == "" and lines[0] == together[0] and lines[2] == together[1]


def test_predictions_average_the_shifted_views_the_run_was_trained_with(digits_run):
    images = digits_splits()["valid"].images[:6]
    classifier = ImageClassifier.load(digits_run)
    assert classifier.test_shift == classifier.settings.test_shift == 1
    model = classifier.model
    with torch.no_grad():
        views = [batched_logits(model, v).softmax(-1) for v in shifted_views(images, 1)]
        plain = batched_logits(model, images).softmax(-1)
    torch.testing.assert_close(classifier.probabilities(images), sum(views) / 5)
    alone = ImageClassifier.load(digits_run, test_shift=0)
    torch.testing.assert_close(alone.probabilities(images), plain)


def test_validation_without_views_is_the_plain_cross_entropy(digits_run):
    splits = digits_splits()
    model = ImageClassifier.load(digits_run).model
    task = VisionTask(splits["train"], splits["valid"], 10, 64, Augmentation(), 0.1, 0)
    with torch.no_grad():
        logits = batched_logits(model, splits["valid"].images)
        scores = task.validate(model)
    expected = torch.nn.functional.cross_entropy(logits, splits["valid"].labels).item()
    assert scores["loss"] == pytest.approx(expected, rel=1e-5)


def test_attention_of_one_image(digits_run, tmp_path):
    classifier = ImageClassifier.load(digits_run)
    path = digit_png(tmp_path, 3)
    run = classifier.attention(str(path))
    assert run.job == "vit" and run.input == str(path)
    assert run.image.shape == (8, 8) and run.grid == (4, 4)
    encoder = run.kind("encoder")
    assert encoder.weights.shape == (1, 2, 17, 17)
    np.testing.assert_allclose(encoder.weights.sum(-1), np.ones((1, 2, 17)), rtol=1e-5)
    assert encoder.queries[:3] == ["[CLS]", "(0,0)", "(0,1)"] and encoder.keys[-1] == "(3,3)"
    label, probability = classifier.predict([path])[0]
    assert run.output == f"{label} (probability {probability:.2f})"
    shown_label, shown_probability = classifier.attention_maps(str(path))["output"]
    assert shown_label == label and shown_probability == pytest.approx(probability, abs=1e-6)
    with pytest.raises(InputError, match="no such image file"):
        classifier.attention(str(tmp_path / "missing.png"))


def test_classify_image_prints_file_label_probability(digits_run, tmp_path, capsys):
    files = [digit_png(tmp_path, i) for i in (0, 1, 2)]
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{f}\n" for f in files))
    capsys.readouterr()
    command = ["classify-image", "--model", str(digits_run), "--no-progress"]
    assert main([*command, "--input", str(listing), "--batch-size", "2"]) == 0
    lines = capsys.readouterr().out.strip().split("\n")
    assert len(lines) == 3
    for line, path in zip(lines, files, strict=True):
        name, label, probability = line.split("\t")
        assert name == str(path) and label in digits_labels().names
        assert 0 < float(probability) <= 1
    output = tmp_path / "labels.tsv"
    assert main([*command, *map(str, files), "--output", str(output)]) == 0
    assert output.read_text().strip().split("\n") == lines


def test_evaluate_scores_the_test_split_and_leaves_the_run_folder_alone(
    digits_run, tmp_path, capsys
):
    before = folder_tree(digits_run)
    pictures = tmp_path / "pictures"
    capsys.readouterr()
    command = ["evaluate", "--model", str(digits_run), "--json", "--out", str(pictures)]
    assert main(command) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["images"] == len(digits_splits()["test"])
    assert 0 <= scores["macro_f1"] <= 100 and 0 <= scores["accuracy"] <= 100
    summary = json.loads((digits_run / "summary.json").read_text())
    assert scores["accuracy"] == pytest.approx(summary["test_accuracy"])
    assert Image.open(pictures / "confusion.png").format == "PNG"
    assert main(["evaluate", "--model", str(digits_run), "--json"]) == 0
    assert "confusion" not in json.loads(capsys.readouterr().out)
    assert folder_tree(digits_run) == before


def test_resume_continues_exactly_where_the_run_stopped(tmp_path):
    from safetensors.torch import load_file

    settings = ["--patch-size", 4, "--eval-every", 2]
    assert train_cli("--out", tmp_path / "whole", *settings, "--max-steps", 6) == 0
    assert train_cli("--out", tmp_path / "split", *settings, "--max-steps", 4) == 0
    # the run's own settings (patch size 4) are used on resume, not the option defaults
    resumed = ["--out", tmp_path / "split", "--max-steps", 6, "--eval-every", 2, "--resume"]
    assert train_cli(*resumed) == 0
    config = json.loads((tmp_path / "split" / "config.json").read_text())
    assert config["settings"]["patch_size"] == 4
    summary = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert summary["steps"] == 6
    with open(tmp_path / "split" / "metrics.csv", newline="") as f:
        steps = [int(row["step"]) for row in csv.DictReader(f)]
    assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 6
    whole = load_file(tmp_path / "whole" / "last.safetensors")
    split = load_file(tmp_path / "split" / "last.safetensors")
    for name, tensor in whole.items():
        torch.testing.assert_close(split[name], tensor, msg=name)


def test_post_norm_is_a_default_a_user_can_override(tmp_path):
    out = tmp_path / "run"
    assert train_cli("--out", out, "--post-norm", "--patch-size", 4, "--max-steps", 1) == 0
    assert json.loads((out / "config.json").read_text())["model"]["norm_first"] is False
    model = ImageClassifier.load(out).model
    assert model.config.norm_first is False


# -- class folders and bad input --------------------------------------------------------------


def test_class_folders_train_classify_and_evaluate(tmp_path, capsys):
    data = write_class_folders(tmp_path / "data", per_class=5)
    out = tmp_path / "run"
    command = ["--out", out, "--train", data, "--image-size", 8, "--patch-size", 4]
    command += ["--color", "rgb", "--valid-fraction", 0.2, "--batch-size", 4]
    assert train_cli(*command, "--max-steps", 4, "--eval-every", 2) == 0
    assert json.loads((out / "labels.json").read_text())["labels"] == ["dark", "left", "top"]
    config = json.loads((out / "config.json").read_text())
    assert config["settings"]["color"] == "rgb" and config["settings"]["train"] == str(data)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["valid_images"] == 3 and "test_accuracy" not in summary
    capsys.readouterr()
    picture = data / "top" / "0.png"
    answer = tmp_path / "answer.tsv"
    assert main(["classify-image", "--model", str(out), str(picture), "--output", str(answer)]) == 0
    name, label, _ = answer.read_text().strip().split("\t")
    assert name == str(picture) and label in ("dark", "left", "top")
    assert main(["evaluate", "--model", str(out), "--data", str(data), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 15
    assert main(["evaluate", "--model", str(out)]) == 2
    assert "--data FOLDER" in capsys.readouterr().err


def one_line_error(capsys, code):
    assert code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("qkv: error:"), captured.err
    return lines[0]


def test_empty_class_folder_is_one_clear_error(tmp_path, capsys):
    data = write_class_folders(tmp_path / "data", per_class=2)
    (data / "zebra").mkdir()
    line = one_line_error(capsys, train_cli("--out", tmp_path / "run", "--train", data))
    assert str(data / "zebra") in line and "empty class folder" in line


def test_unreadable_image_is_one_clear_error(tmp_path, capsys):
    data = write_class_folders(tmp_path / "data", per_class=2)
    (data / "top" / "broken.png").write_bytes(b"this is not a picture")
    line = one_line_error(capsys, train_cli("--out", tmp_path / "run", "--train", data))
    assert str(data / "top" / "broken.png") in line


def test_folder_without_class_folders_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "flat").mkdir()
    Image.new("L", (4, 4)).save(tmp_path / "flat" / "a.png")
    flat = tmp_path / "flat"
    line = one_line_error(capsys, train_cli("--out", tmp_path / "run", "--train", flat))
    assert str(flat) in line and "no class folders" in line


def test_bad_options_and_files_are_one_clear_error(tmp_path, capsys, digits_run):
    line = one_line_error(capsys, train_cli("--out", tmp_path / "run", "--patch-size", 3))
    assert "patch" in line
    line = one_line_error(capsys, train_cli("--out", tmp_path / "run", "--color", "rgb"))
    assert "--color rgb needs --train FOLDER" in line
    missing = tmp_path / "missing.png"
    line = one_line_error(
        capsys, main(["classify-image", "--model", str(digits_run), str(missing)])
    )
    assert str(missing) in line
