"""Image data of the ViT job: reading images and class folders, the digits, splits, augmentation.

The data is either scikit-learn's bundled 8x8 digits, split once by a saved seed into
train, validation and test, or a folder with one sub-folder of images per class.

Legend: B batch, C channels, Hi image height, Wi image width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from qkv.errors import InputError
from qkv.jobs.vision.model import ImageConfig
from qkv.labels import LabelVocab

DIGITS_PIXEL_MAX = 16.0  # load_digits stores ink as 0 (background) .. 16 (full ink)
DIGITS_TEST_FRACTION = 0.2  # the digits' test split: fixed, so every run scores the same kind
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


# -- augmentation ---------------------------------------------------------------------------------


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


def move_images(images: Tensor, dy: int, dx: int) -> Tensor:
    """Move every image ``dy`` pixels down and ``dx`` right, repeating the edge pixels.

    (B, C, Hi, Wi) -> (B, C, Hi, Wi); negative moves go up and left.
    """
    s = max(abs(dy), abs(dx))
    if s == 0:
        return images
    Hi, Wi = images.shape[-2:]
    padded = F.pad(images, (s, s, s, s), mode="replicate")  # (B, C, Hi + 2s, Wi + 2s)
    return padded[..., s - dy : s - dy + Hi, s - dx : s - dx + Wi]


def shifted_views(images: Tensor, shift: int) -> list[Tensor]:
    """The images, then copies moved ``shift`` pixels up, down, left and right.

    What test-time augmentation averages over: a model trained on shifted images is not
    exactly shift-invariant, and the mean of its five answers errs less than any one.
    ``shift`` 0 gives the images alone.
    """
    if shift <= 0:
        return [images]
    moves = [(0, 0), (-shift, 0), (shift, 0), (0, -shift), (0, shift)]
    return [move_images(images, dy, dx) for dy, dx in moves]


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


def folder_splits(
    train: str | Path,
    valid: str | Path | None,
    image: ImageConfig,
    valid_fraction: float,
    seed: int,
) -> tuple[dict[str, ImageSet], LabelVocab]:
    """Training and validation images of class folders; validation is held out without ``valid``.

    Returns:
        ({"train": ..., "valid": ...}, the label set: the training folder's class names)
    """
    train_set, labels = read_image_folder(train, image)
    if valid is not None:
        valid_set, _ = read_image_folder(valid, image, labels)
        return {"train": train_set, "valid": valid_set}, labels
    held, rest = stratified_split(train_set.labels.numpy(), [valid_fraction], seed)
    if len(held) == 0:
        raise InputError(
            f"{train}: too few images per class to hold out a validation split; give --valid FOLDER"
        )
    return {"train": train_set.subset(rest), "valid": train_set.subset(held)}, labels
