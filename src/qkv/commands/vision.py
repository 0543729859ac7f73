"""``qkv train vit``, ``qkv classify-image``, and evaluation of image classifiers."""

from __future__ import annotations

import argparse

from qkv.cli import add_model_options, add_train_options, model_config_from, train_config_from
from qkv.commands import EVALUATORS
from qkv.errors import InputError

DIGITS_TEST_FRACTION = 0.2


def register(commands: argparse._SubParsersAction, jobs: argparse._SubParsersAction) -> None:
    """Add ``qkv train vit`` and ``qkv classify-image``; evaluate ``vit`` runs."""
    train = jobs.add_parser(
        "vit",
        help="image classification: images cut into patches, read as a sequence",
        description="Train a Vision Transformer. With no --data it trains on scikit-learn's "
        "bundled 8x8 digits, split by a fixed seed into train, validation and test (`qkv "
        "evaluate --model RUN` scores the test split). --data FOLDER holds one sub-folder of "
        "images per class, named after the class.",
    )
    data = train.add_argument_group("data")
    data.add_argument(
        "--data",
        metavar="FOLDER",
        help="folder with one sub-folder of images per class (default: the digits)",
    )
    data.add_argument(
        "--valid",
        metavar="FOLDER",
        help="validation folder, same layout (default: held out from --data)",
    )
    data.add_argument(
        "--valid-fraction",
        type=float,
        default=0.1,
        help="share of each class held out for validation (default: 0.1)",
    )
    data.add_argument(
        "--split-seed", type=int, default=0, help="seed of the held-out splits (default: 0)"
    )
    data.add_argument(
        "--image-size",
        type=int,
        help="images are resized to this many pixels square (default: 32; the digits are 8)",
    )
    data.add_argument(
        "--color",
        choices=("gray", "rgb"),
        default="gray",
        help="read images as grayscale or RGB (default: gray)",
    )
    data.add_argument(
        "--patch-size",
        type=int,
        help="side of a square patch in pixels (default: 2 for the digits, 4 for a folder)",
    )
    data.add_argument(
        "--patch-stride",
        type=int,
        help="pixels between patch starts; less than --patch-size overlaps them "
        "(default: --patch-size)",
    )
    data.add_argument("--batch-size", type=int, default=64, help="images per batch (default: 64)")
    data.add_argument(
        "--shift",
        type=int,
        default=1,
        help="augmentation: move training images by up to this many pixels (default: 1)",
    )
    data.add_argument(
        "--rotate",
        type=float,
        default=0.0,
        help="augmentation: rotate training images by up to this many degrees (default: 0)",
    )
    data.add_argument(
        "--zoom",
        type=float,
        default=0.0,
        help="augmentation: scale training images by up to this share, 0.1 is 90%%..110%% "
        "(default: 0)",
    )
    add_model_options(train, preset="tiny")
    add_train_options(
        train,
        max_steps=4000,
        eval_every=200,
        log_every=50,
        warmup_steps=200,
        lr=1e-3,
        weight_decay=0.05,
        # bf16 autocast costs more in casts than it saves at a ViT's small widths on CPU.
        precision="fp32",
    )
    train.set_defaults(run=run_train)

    classify = commands.add_parser(
        "classify-image",
        help="label image files with a trained vit run",
        description="Print file<TAB>label<TAB>probability for each image file.",
    )
    classify.add_argument("--model", required=True, help="run folder of `qkv train vit`")
    classify.add_argument("files", nargs="+", metavar="FILE", help="image files")
    classify.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (default: cpu)")
    classify.set_defaults(run=run_classify)
    EVALUATORS["vit"] = evaluate_vit


def image_config_from(args: argparse.Namespace, n_classes: int):
    from qkv.vision_model import ImageConfig

    digits = args.data is None
    patch = args.patch_size if args.patch_size is not None else (2 if digits else 4)
    try:
        return ImageConfig(
            image_size=8 if digits else (args.image_size or 32),
            channels=3 if args.color == "rgb" else 1,
            patch_size=patch,
            patch_stride=args.patch_stride,
            n_classes=n_classes,
        )
    except ValueError as error:
        raise InputError(f"{error}; check --image-size, --patch-size and --patch-stride") from None


def check_options(args: argparse.Namespace) -> None:
    if args.data is None:
        for given, name in ((args.valid, "--valid"), (args.image_size, "--image-size")):
            if given is not None:
                raise InputError(f"{name} needs --data; the digits are 8x8 and split by seed")
        if args.color == "rgb":
            raise InputError("--color rgb needs --data; the digits are grayscale")
    if args.positional == "sinusoidal":
        raise InputError("--positional sinusoidal: a ViT learns its position embeddings")
    if args.n_decoder_layers:
        raise InputError(f"--n-decoder-layers {args.n_decoder_layers}: a ViT has no decoder")
    if not 0 < args.valid_fraction < 1:
        raise InputError(f"--valid-fraction {args.valid_fraction} must be between 0 and 1")
    if args.batch_size < 1:
        raise InputError(f"--batch-size {args.batch_size} must be at least 1")
    if args.shift < 0 or args.rotate < 0 or not 0 <= args.zoom < 1:
        raise InputError(
            f"--shift {args.shift}, --rotate {args.rotate}, --zoom {args.zoom}: shift and "
            "rotate must be 0 or more, zoom in [0, 1)"
        )


def use_saved_settings(args: argparse.Namespace) -> None:
    """On --resume, read the data as the run first read it, whatever the options say now."""
    from qkv import checkpoint as ckpt

    saved = ckpt.read_run_config(args.out)
    if saved.get("task") != "vit":
        raise InputError(f"{args.out}: a {saved.get('task')!r} run, not a vit run to resume")
    image, data = saved["image"], saved["data"]
    if data["source"] == "folder":
        args.data, args.valid = data["train"], data["valid"]
        args.image_size = image["image_size"]
    else:
        args.data = args.valid = args.image_size = None
    args.patch_size, args.patch_stride = image["patch_size"], image["patch_stride"]
    args.color = "rgb" if image["channels"] == 3 else "gray"
    args.split_seed, args.valid_fraction = data["split_seed"], data["valid_fraction"]
    args.batch_size = saved["batch_size"]
    args.shift, args.rotate, args.zoom = (saved["augment"][k] for k in ("shift", "rotate", "zoom"))


def load_training_data(args: argparse.Namespace):
    """(train, valid, test or None, labels, image config, data record) from the options."""
    from qkv.tasks import vision

    if args.resume:
        use_saved_settings(args)
    check_options(args)
    if args.data is None:
        splits = vision.digits_splits(args.split_seed, args.valid_fraction, DIGITS_TEST_FRACTION)
        record = {
            "source": vision.DIGITS,
            "split_seed": args.split_seed,
            "valid_fraction": args.valid_fraction,
            "test_fraction": DIGITS_TEST_FRACTION,
            "pixel_max": vision.DIGITS_PIXEL_MAX,
        }
        labels = vision.digits_labels()
        image = image_config_from(args, len(labels))
        return splits["train"], splits["valid"], splits["test"], labels, image, record
    probe = image_config_from(args, 1)  # checks the sizes before any image is read
    train, labels = vision.read_image_folder(args.data, probe)
    if args.valid is not None:
        valid, _ = vision.read_image_folder(args.valid, probe, labels)
    else:
        held, rest = vision.stratified_split(
            train.labels.numpy(), [args.valid_fraction], args.split_seed
        )
        if len(held) == 0:
            raise InputError(
                f"{args.data}: too few images per class to hold out a validation split; "
                "give --valid FOLDER"
            )
        train, valid = train.subset(rest), train.subset(held)
    record = {
        "source": "folder",
        "train": str(args.data),
        "valid": None if args.valid is None else str(args.valid),
        "split_seed": args.split_seed,
        "valid_fraction": args.valid_fraction,
        "pixel_max": 255.0,
    }
    return train, valid, None, labels, image_config_from(args, len(labels)), record


def run_train(args: argparse.Namespace) -> None:
    from qkv.tasks.vision import Augmentation, train_vit

    train, valid, test, labels, image, record = load_training_data(args)
    if args.norm_first is None:
        args.norm_first = True  # pre-norm, as ViTs are built; --post-norm for the paper's
    summary = train_vit(
        train,
        valid,
        labels,
        model_config_from(args),
        image,
        train_config_from(args),
        record,
        test=test,
        batch_size=args.batch_size,
        augment=Augmentation(args.shift, args.rotate, args.zoom),
        resume=args.resume,
    )
    split = "test" if test is not None else "validation"
    key = "test_accuracy" if test is not None else "valid_accuracy"
    print(
        f"best validation accuracy {summary['best_val_accuracy']:.2f}%; {split} accuracy "
        f"{summary[key]:.2f}%; run folder {args.out}"
    )


def run_classify(args: argparse.Namespace) -> None:
    from qkv.tasks.vision import ImageClassifier

    classifier = ImageClassifier.load(args.model, device=args.device)
    for path, (label, probability) in zip(args.files, classifier.predict(args.files), strict=True):
        print(f"{path}\t{label}\t{probability:.4f}")


def evaluate_vit(args: argparse.Namespace) -> dict:
    from qkv.tasks.vision import evaluate_run

    return evaluate_run(args.model, args.data)
