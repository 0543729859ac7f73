"""A trained ViT run: label images, score it on labelled images, show where it looks.

Legend: B batch, C channels, Hi image height, Wi image width, K classes, L layers, H heads,
S sequence length (1 + patches).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from qkv.config import option
from qkv.errors import InputError
from qkv.jobs.base import Predictor, picture_path
from qkv.jobs.vision.data import (
    DIGITS_PIXEL_MAX,
    DIGITS_TEST_FRACTION,
    ImageInput,
    ImageSet,
    digits_splits,
    image_array,
    read_image_folder,
    stack_images,
)
from qkv.jobs.vision.model import ImageConfig, VisionTransformer
from qkv.jobs.vision.task import view_probabilities
from qkv.labels import LabelVocab
from qkv.metrics import CONFUSION, confusion, label_scores, plot_confusion
from qkv.viz.attention import CLS_TOKEN, AttentionKind, RunAttention


@dataclass
class ClassifyOptions:
    """How ``ImageClassifier`` runs. The options of ``qkv classify-image``."""

    batch_size: int = option(256, "images per forward pass")
    test_shift: int | None = option(
        None,
        "average the image and its copies moved this many pixels up, down, left and right; "
        "0: the image alone; none: the run's --test-shift",
    )

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InputError(f"--batch-size {self.batch_size} must be at least 1")
        if self.test_shift is not None and self.test_shift < 0:
            raise InputError(f"--test-shift {self.test_shift} must be 0 or more")


class ImageClassifier(Predictor):
    """A trained ViT run: ``ImageClassifier.load(run_dir).predict(["cat.png"])``."""

    job = "vit"

    def __init__(
        self,
        model: VisionTransformer,
        labels: LabelVocab,
        options: ClassifyOptions | None = None,
        settings: Any = None,
    ) -> None:
        self.model = model.eval()
        self.labels = labels
        self.options = options or ClassifyOptions()
        self.settings = settings
        digits = settings is not None and settings.train is None
        # The top pixel value of arrays given to ``predict``: the scale the run trained on.
        self.pixel_max = DIGITS_PIXEL_MAX if digits else 255.0
        trained_shift = getattr(settings, "test_shift", 0)
        self.test_shift = (
            self.options.test_shift if self.options.test_shift is not None else trained_shift
        )

    @property
    def image(self) -> ImageConfig:
        return self.model.image

    def to_tensor(self, images: Sequence[ImageInput]) -> Tensor:
        """Paths, PIL images or arrays -> (B, C, Hi, Wi) as the model reads them."""
        return stack_images([image_array(x, self.image, self.pixel_max) for x in images])

    @torch.no_grad()
    def probabilities(self, images: Tensor) -> Tensor:
        """(B, C, Hi, Wi) in [0, 1] -> class probabilities (B, K), over the shifted views."""
        self.model.eval()
        probs = view_probabilities(self.model, images, self.test_shift, self.options.batch_size)
        return probs.cpu()

    def predict(self, images: Sequence[ImageInput]) -> list[tuple[str, float]]:
        """The most likely label of each image (path, PIL image or array) and its probability."""
        if not images:
            return []
        probs, best = self.probabilities(self.to_tensor(images)).max(-1)
        return [(self.labels.names[i], float(p)) for i, p in zip(best.tolist(), probs, strict=True)]

    def predict_lines(self, lines: list[str], first_number: int = 1) -> list[str]:
        """``path<TAB>label<TAB>probability`` per line naming an image file; empty stays empty."""
        paths = [line.strip() for line in lines]
        todo = [p for p in paths if p]
        labelled = iter(self.predict(todo))
        outputs = []
        for path in paths:
            if path:
                label, probability = next(labelled)
                outputs.append(f"{path}\t{label}\t{probability:.4f}")
            else:
                outputs.append("")
        return outputs

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

    def held_out(self) -> ImageSet:
        """The digits test split of a run trained on the digits (the split it never saw)."""
        settings = self.settings
        if settings is None or settings.train is not None:
            raise InputError(
                "this vit run was trained on an image folder, so there is no held-out split "
                "to score; pass --data FOLDER"
            )
        splits = digits_splits(settings.split_seed, settings.valid_fraction, DIGITS_TEST_FRACTION)
        return splits["test"]

    def evaluate_data(self, data: str | None, out: Path | None) -> dict[str, Any]:
        """Scores on a class folder ``data`` (default: the digits test split of a digits run).

        The confusion matrix goes to ``out``/confusion.png when ``out`` is given; the run
        folder is never written.
        """
        if data is not None:
            dataset, _ = read_image_folder(data, self.image, self.labels)
        else:
            dataset = self.held_out()
        scores = self.evaluate(dataset, picture_path(out, CONFUSION))
        return {"data": str(data) if data is not None else "digits test split", **scores}

    @torch.no_grad()
    def attention_maps(self, image: ImageInput) -> dict[str, Any]:
        """What one image looks like to the model, and where each head of each layer looks.

        Returns:
            ``{"image": (Hi, Wi) or (Hi, Wi, C) numpy array in [0, 1], "grid": (rows, cols)
            of patches, "encoder": (L, H, S, S) attention weights with [CLS] at index 0,
            "output": (label, probability) as ``predict`` gives them}``
        """
        array = image_array(image, self.image, self.pixel_max)  # (Hi, Wi, C)
        images = stack_images([array])  # (1, C, Hi, Wi)
        self.model.eval()
        maps = self.model.attention_maps(images.to(self.device))
        # The answer is ``predict``'s, over the shifted views; the weights are the image's own.
        probs = self.probabilities(images)[0]  # (K,)
        best = int(probs.argmax())
        return {
            "image": array[:, :, 0] if array.shape[2] == 1 else array,
            "grid": self.image.grid,
            "encoder": maps["encoder"][:, 0].float().cpu(),  # (L, H, S, S)
            "output": (self.labels.names[best], float(probs[best])),
        }

    def attention(self, text: str) -> RunAttention:
        """Classify the image file at ``text`` and gather every layer's and head's attention.

        The tokens are [CLS] and then the patches, row by row, named ``(row,col)``.
        """
        if not Path(text).is_file():
            raise InputError(f"{text}: no such image file; a vit run reads an image")
        maps = self.attention_maps(text)
        rows, cols = maps["grid"]
        tokens = [CLS_TOKEN] + [f"({r},{c})" for r in range(rows) for c in range(cols)]
        label, probability = maps["output"]
        kinds = [AttentionKind("encoder", maps["encoder"].numpy(), tokens, tokens)]
        image = np.asarray(maps["image"], dtype=np.float32)
        output = f"{label} (probability {probability:.2f})"
        return RunAttention(self.job, text, output, kinds, image, (rows, cols))
