"""Image classification with the Vision Transformer: image data, training, inference, scores.

The data is either scikit-learn's bundled 8x8 digits, split once by a saved seed into
train, validation and test, or a folder with one sub-folder of images per class.

Legend: B batch, C channels, Hi image height, Wi image width, K classes, L layers, H heads,
S sequence length (1 + patches).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from qkv import checkpoint as ckpt
from qkv.config import ModelConfig
from qkv.errors import InputError
from qkv.labels import LABELS, LabelVocab
from qkv.metrics import confusion, label_scores, plot_confusion
from qkv.training import TrainConfig, Trainer
from qkv.vision_model import ImageConfig, VisionTransformer, vit_model_config

TASK = "vit"
DIGITS = "digits"
DIGITS_PIXEL_MAX = 16.0  # load_digits stores ink as 0 (background) .. 16 (full ink)
CONFUSION = "confusion.png"
ImageInput = str | Path | Image.Image | np.ndarray | Tensor


@dataclass
class ImageSet:
    """Images converted to what the model reads, with their label ids."""

    images: Tensor  # (B, C, Hi, Wi) float in [0, 1]
    labels: Tensor  # (B,) long

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: np.ndarray) -> ImageSet:
        index = torch.as_tensor(index, dtype=torch.long)
        return ImageSet(self.images[index], self.labels[index])


# -- reading images ------------------------------------------------------------------------------


def image_suffixes() -> set[str]:
    """File endings Pillow can open (.png, .jpg, ...); other files in class folders are skipped."""
    return {ext for ext, kind in Image.registered_extensions().items() if kind in Image.OPEN}


def open_image(path: Path) -> Image.Image:
    """The decoded image at ``path``, or an InputError naming it."""
    if not Path(path).is_file():
        raise InputError(f"{path}: no such image file")
    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise InputError(f"{path}: not a readable image ({error})") from None


def image_array(source: ImageInput, image: ImageConfig, pixel_max: float = 255.0) -> np.ndarray:
    """One image as the model reads it: (Hi, Wi, C) float32 in [0, 1], resized and converted.

    Args:
        source: a file path, a PIL image (both read as 8-bit, 0..255), or an array (Hi, Wi)
            or (Hi, Wi, C) whose values go from 0 to ``pixel_max`` (16 for the digits of
            ``load_digits``, 255 for 8-bit pictures).
        image: the size and channels the model reads.
    """
    size, mode = image.image_size, "L" if image.channels == 1 else "RGB"
    if isinstance(source, Tensor | np.ndarray):
        array = np.clip(np.asarray(source, dtype=np.float32) / pixel_max, 0.0, 1.0)
        array = array[:, :, None] if array.ndim == 2 else array
        if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
            raise InputError(
                f"an image array of shape {tuple(source.shape)}; give (height, width) or "
                "(height, width, channels)"
            )
        if array.shape == (size, size, image.channels):
            return array
        pixels = (array * 255).round().astype(np.uint8)
        source = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
    if isinstance(source, str | Path):
        source = open_image(Path(source))
    converted = source.convert(mode)
    if converted.size != (size, size):
        converted = converted.resize((size, size), Image.Resampling.BILINEAR)
    array = np.asarray(converted, dtype=np.float32) / 255.0
    return array[:, :, None] if array.ndim == 2 else array


def stack_images(arrays: Sequence[np.ndarray]) -> Tensor:
    """(Hi, Wi, C) arrays -> one (B, C, Hi, Wi) tensor."""
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()  # (B, C, Hi, Wi)


def read_image_folder(
    folder: str | Path, image: ImageConfig, labels: LabelVocab | None = None
) -> tuple[ImageSet, LabelVocab]:
    """A folder with one sub-folder of images per class; the sub-folder names are the labels.

    Args:
        labels: the label set of a trained run; without it, the sorted folder names.
    Returns:
        (the images with their label ids, the label set)
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder; give a folder with one sub-folder per class")
    classes = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise InputError(
            f"{folder}: no class folders; put each class's images in a sub-folder named after it"
        )
    labels = labels or LabelVocab(c.name for c in classes)
    suffixes = image_suffixes()
    arrays, ids = [], []
    for class_dir in classes:
        label = labels.id(class_dir.name, where=str(class_dir))
        files = sorted(
            f
            for f in class_dir.iterdir()
            if f.is_file() and not f.name.startswith(".") and f.suffix.lower() in suffixes
        )
        if not files:
            raise InputError(f"{class_dir}: an empty class folder; add images or remove it")
        arrays += [image_array(f, image) for f in files]
        ids += [label] * len(files)
    return ImageSet(stack_images(arrays), torch.tensor(ids, dtype=torch.long)), labels


def stratified_split(labels: np.ndarray, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Sorted indices of one held-out part per fraction, then of the rest; classes split alike.

    Every class keeps at least one example in the rest. ``RandomState`` streams never change
    between numpy versions, so a saved seed gives the same split everywhere.
    """
    rng = np.random.RandomState(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(fractions) + 1)]
    for label in np.unique(labels):
        index = rng.permutation(np.flatnonzero(labels == label))
        start = 0
        for k, fraction in enumerate(fractions):
            n = max(0, min(int(round(fraction * len(index))), len(index) - 1 - start))
            parts[k].append(index[start : start + n])
            start += n
        parts[-1].append(index[start:])
    return [np.sort(np.concatenate(p)) for p in parts]


def digits_splits(
    seed: int = 0, valid_fraction: float = 0.1, test_fraction: float = 0.2
) -> dict[str, ImageSet]:
    """scikit-learn's 1797 bundled 8x8 digits, split by class into train, valid and test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.from_numpy(digits.images / DIGITS_PIXEL_MAX).float()[:, None]  # (B, 1, 8, 8)
    every = ImageSet(images, torch.from_numpy(digits.target).long())
    test, valid, train = stratified_split(digits.target, [test_fraction, valid_fraction], seed)
    return {"train": every.subset(train), "valid": every.subset(valid), "test": every.subset(test)}


def digits_labels() -> LabelVocab:
    return LabelVocab(str(d) for d in range(10))


# -- training ---------------------------------------------------------------------------------


def shift_images(images: Tensor, max_shift: int, generator: torch.Generator) -> Tensor:
    """Move each image by up to ``max_shift`` pixels each way, repeating the edge pixels.

    (B, C, Hi, Wi) -> (B, C, Hi, Wi); the shifts come from ``generator``.
    """
    if max_shift <= 0:
        return images
    B, C, Hi, Wi = images.shape
    s = max_shift
    padded = F.pad(images, (s, s, s, s), mode="replicate")  # (B, C, Hi + 2s, Wi + 2s)
    dy, dx = torch.randint(0, 2 * s + 1, (2, B), generator=generator)
    rows = (dy[:, None] + torch.arange(Hi))[:, None, :, None]  # (B, 1, Hi, 1)
    cols = (dx[:, None] + torch.arange(Wi))[:, None, None, :]  # (B, 1, 1, Wi)
    batch = torch.arange(B)[:, None, None, None]
    channel = torch.arange(C)[None, :, None, None]
    return padded[batch, channel, rows, cols]  # (B, C, Hi, Wi)


def warp_images(
    images: Tensor, max_degrees: float, max_zoom: float, generator: torch.Generator
) -> Tensor:
    """Rotate each image by up to ``max_degrees`` and scale it by up to ``max_zoom`` (a share).

    (B, C, Hi, Wi) -> (B, C, Hi, Wi), about the centre, bilinear, edge pixels repeated.
    """
    if max_degrees <= 0 and max_zoom <= 0:
        return images
    B = images.size(0)
    angle = (torch.rand(B, generator=generator) * 2 - 1) * math.radians(max_degrees)
    zoom = 1 + (torch.rand(B, generator=generator) * 2 - 1) * max_zoom
    # affine_grid maps output coordinates to input ones: dividing by the zoom enlarges.
    cos, sin, zero = torch.cos(angle) / zoom, torch.sin(angle) / zoom, torch.zeros(B)
    theta = torch.stack(
        [torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1
    )  # (B, 2, 3)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)  # (B, Hi, Wi, 2)
    return F.grid_sample(images, grid, padding_mode="border", align_corners=False)


@dataclass
class Augmentation:
    """Random changes of the training images, drawn anew each epoch."""

    shift: int = 1  # largest move, in whole pixels, each way
    rotate: float = 0.0  # largest rotation, in degrees, either way
    zoom: float = 0.0  # largest change of scale, as a share: 0.1 is 90% .. 110%

    def __call__(self, images: Tensor, generator: torch.Generator) -> Tensor:
        warped = warp_images(images, self.rotate, self.zoom, generator)
        return shift_images(warped, self.shift, generator)


def batched_logits(model: nn.Module, images: Tensor, batch_size: int = 256) -> Tensor:
    """Class logits (B, K) in fp32, computed a batch at a time on the model's device."""
    device = next(model.parameters()).device
    chunks = [
        model(images[i : i + batch_size].to(device)).float()
        for i in range(0, len(images), batch_size)
    ]
    return torch.cat(chunks) if chunks else torch.zeros(0, model.image.n_classes)


class VisionTask:
    """Batches, loss and validation of image classification for the ``Trainer``."""

    name = TASK
    metric = "accuracy"
    metric_names = ("loss", "accuracy", "macro_f1")

    def __init__(
        self,
        train: ImageSet,
        valid: ImageSet,
        n_classes: int,
        batch_size: int,
        augment: Augmentation,
        label_smoothing: float,
    ) -> None:
        self.train, self.valid, self.n_classes = train, valid, n_classes
        self.batch_size, self.augment, self.label_smoothing = batch_size, augment, label_smoothing

    def train_batches(self, epoch: int, seed: int) -> list[dict[str, Tensor]]:
        """Shuffled, freshly augmented images; the same for the same (seed, epoch), for resume."""
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.train), generator=generator)
        images = self.augment(self.train.images[order], generator)
        labels = self.train.labels[order]
        return [
            {"images": images[i : i + self.batch_size], "labels": labels[i : i + self.batch_size]}
            for i in range(0, len(labels), self.batch_size)
        ]

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, int]:
        logits = model(batch["images"])  # (B, K)
        loss = F.cross_entropy(
            logits.float(), batch["labels"], label_smoothing=self.label_smoothing
        )
        return loss, len(batch["labels"])

    def validate(self, model: nn.Module) -> dict[str, float]:
        logits = batched_logits(model, self.valid.images)
        labels = self.valid.labels.to(logits.device)
        scores = label_scores(labels.tolist(), logits.argmax(-1).tolist(), self.n_classes)
        return {"loss": F.cross_entropy(logits, labels).item(), **scores}


def train_vit(
    train: ImageSet,
    valid: ImageSet,
    labels: LabelVocab,
    model_config: ModelConfig,
    image: ImageConfig,
    train_config: TrainConfig,
    data: dict[str, Any],
    *,
    test: ImageSet | None = None,
    batch_size: int = 64,
    augment: Augmentation | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Train a ViT into ``train_config.out``; return the summary (also in summary.json).

    At the end the best weights are scored on ``test`` (or, without it, on ``valid``), and
    their confusion matrix is drawn into confusion.png.

    Args:
        data: where the images came from, recorded in config.json (``source`` "digits" with
            its split, or "folder"), so that ``qkv evaluate`` can find the held-out split.
        augment: random changes of the training images (default: shifts of 1 pixel).
        resume: continue the run in ``train_config.out``; its saved model, image and label
            settings are used.
    """
    run_dir = Path(train_config.out)
    if resume:
        saved = ckpt.read_run_config(run_dir)
        model_config = ModelConfig.from_dict(saved["model"])
        image = ImageConfig.from_dict(saved["image"])
        labels = LabelVocab.load(run_dir / LABELS)
    else:
        model_config = vit_model_config(model_config, image)
        run_dir.mkdir(parents=True, exist_ok=True)
        labels.save(run_dir / LABELS)
    if len(labels) != image.n_classes:
        raise ValueError(f"{len(labels)} labels but image.n_classes={image.n_classes}")
    augment = augment or Augmentation()
    task = VisionTask(
        train, valid, image.n_classes, batch_size, augment, train_config.label_smoothing
    )
    torch.manual_seed(train_config.seed)  # the initial weights, too, follow --seed
    model = VisionTransformer(model_config, image)
    run_config = {
        "task": TASK,
        "model": model_config.to_dict(),
        "image": image.to_dict(),
        "data": data,
        "batch_size": batch_size,
        "augment": dataclasses.asdict(augment),
    }
    trainer = Trainer(task, model, train_config, run_config, resume=resume)
    summary = trainer.fit()
    if trainer.is_main:
        classifier = ImageClassifier(trainer.model, labels, data.get("pixel_max", 255.0))
        split = "test" if test is not None else "valid"
        scores = classifier.evaluate(test if test is not None else valid, run_dir / CONFUSION)
        for name in ("accuracy", "macro_f1", "images"):
            summary[f"{split}_{name}"] = scores[name]
        ckpt.write_json(run_dir / "summary.json", summary)
    return summary


# -- inference ---------------------------------------------------------------------------------


class ImageClassifier:
    """A trained ViT run: ``ImageClassifier.load(run_dir).predict(["cat.png"])``."""

    def __init__(self, model: VisionTransformer, labels: LabelVocab, pixel_max: float = 255.0):
        self.model = model.eval()
        self.labels = labels
        self.pixel_max = pixel_max  # the top pixel value of arrays given to ``predict``

    @classmethod
    def load(cls, run_dir: str | Path, device: str | torch.device = "cpu") -> ImageClassifier:
        run_dir = Path(run_dir)
        config = ckpt.read_run_config(run_dir)
        if config.get("task") != TASK:
            raise InputError(f"{run_dir}: a {config.get('task')!r} run, not an image (vit) run")
        model = VisionTransformer(
            ModelConfig.from_dict(config["model"]), ImageConfig.from_dict(config["image"])
        )
        ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
        labels = LabelVocab.load(run_dir / LABELS)
        return cls(model.to(device), labels, config.get("data", {}).get("pixel_max", 255.0))

    @property
    def image(self) -> ImageConfig:
        return self.model.image

    def to_tensor(self, images: Sequence[ImageInput]) -> Tensor:
        """Paths, PIL images or arrays -> (B, C, Hi, Wi) as the model reads them."""
        return stack_images([image_array(x, self.image, self.pixel_max) for x in images])

    @torch.no_grad()
    def probabilities(self, images: Tensor) -> Tensor:
        """(B, C, Hi, Wi) in [0, 1] -> class probabilities (B, K)."""
        self.model.eval()
        return batched_logits(self.model, images).softmax(-1).cpu()

    def predict(self, images: Sequence[ImageInput]) -> list[tuple[str, float]]:
        """The most likely label of each image and its probability."""
        if not images:
            return []
        probs, best = self.probabilities(self.to_tensor(images)).max(-1)
        return [(self.labels.names[i], float(p)) for i, p in zip(best.tolist(), probs, strict=True)]

    def attention_maps(self, image: ImageInput) -> dict[str, Any]:
        """What one image looks like to the model, and where each head of each layer looks.

        Returns:
            ``{"image": (Hi, Wi) or (Hi, Wi, C) numpy array in [0, 1], "grid": (rows, cols)
            of patches, "encoder": (L, H, S, S) attention weights with [CLS] at index 0,
            "output": (label, probability)}``
        """
        array = image_array(image, self.image, self.pixel_max)  # (Hi, Wi, C)
        self.model.eval()
        device = next(self.model.parameters()).device
        maps = self.model.attention_maps(stack_images([array]).to(device))
        probs = maps["logits"][0].float().softmax(-1)
        best = int(probs.argmax())
        return {
            "image": array[:, :, 0] if array.shape[2] == 1 else array,
            "grid": self.image.grid,
            "encoder": maps["encoder"][:, 0].float().cpu(),  # (L, H, S, S)
            "output": (self.labels.names[best], float(probs[best])),
        }

    def evaluate(self, data: ImageSet, confusion_png: Path | None = None) -> dict[str, Any]:
        """Accuracy and macro-F1 in percent on ``data``; draws the confusion matrix if asked."""
        predicted = self.probabilities(data.images).argmax(-1).tolist()
        gold = data.labels.tolist()
        scores: dict[str, Any] = {**label_scores(gold, predicted, len(self.labels))}
        scores["images"] = len(gold)
        if confusion_png is not None:
            matrix = confusion(gold, predicted, len(self.labels))
            title = f"accuracy {scores['accuracy']:.1f}% on {len(gold)} images"
            plot_confusion(matrix, self.labels.names, confusion_png, title)
            scores["confusion"] = str(confusion_png)
        return scores


def evaluate_run(run_dir: str | Path, data: str | Path | None = None) -> dict[str, Any]:
    """Score a run on a class-folder dataset, or with none on its held-out digits test split.

    The confusion matrix goes to confusion.png in the run folder.
    """
    run_dir = Path(run_dir)
    classifier = ImageClassifier.load(run_dir)
    if data is not None:
        dataset, _ = read_image_folder(data, classifier.image, classifier.labels)
        split = str(data)
    else:
        source = ckpt.read_run_config(run_dir).get("data", {})
        if source.get("source") != DIGITS:
            raise InputError(
                f"{run_dir}: trained on an image folder, so there is no held-out split to "
                "score; pass --data FOLDER"
            )
        dataset = digits_splits(
            source["split_seed"], source["valid_fraction"], source["test_fraction"]
        )["test"]
        split = "digits test split"
    return {**classifier.evaluate(dataset, run_dir / CONFUSION), "data": split}
