"""Image classification for the ``Trainer``: augmented image batches, smoothed loss, accuracy.

Legend: B batch, C channels, Hi image height, Wi image width, K classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.jobs.vision.data import Augmentation, ImageSet, shifted_views
from qkv.metrics import label_scores


def batched_logits(model: nn.Module, images: Tensor, batch_size: int = 256) -> Tensor:
    """Class logits (B, K) in fp32, computed a batch at a time on the model's device."""
    device = next(model.parameters()).device
    chunks = [
        model(images[i : i + batch_size].to(device)).float()
        for i in range(0, len(images), batch_size)
    ]
    return torch.cat(chunks) if chunks else torch.zeros(0, model.image.n_classes)


def view_probabilities(
    model: nn.Module, images: Tensor, shift: int, batch_size: int = 256
) -> Tensor:
    """Class probabilities (B, K), averaged over ``shifted_views`` of the images."""
    views = shifted_views(images, shift)
    return sum(batched_logits(model, v, batch_size).softmax(-1) for v in views) / len(views)


class VisionTask:
    """Batches, loss and validation of image classification for the ``Trainer``."""

    name = "vit"
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
        test_shift: int = 0,
    ) -> None:
        self.train, self.valid, self.n_classes = train, valid, n_classes
        self.batch_size, self.augment, self.label_smoothing = batch_size, augment, label_smoothing
        self.test_shift = test_shift  # validation predicts as the trained run will

    def train_batches(self, epoch: int, seed: int) -> list[dict[str, Tensor]]:
        """Shuffled, freshly augmented images; the same for the same (seed, epoch), for resume."""
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.train), generator=generator)
        images = self.augment(self.train.images[order], generator)  # (B, C, Hi, Wi)
        labels = self.train.labels[order]
        return [
            {"images": images[i : i + self.batch_size], "labels": labels[i : i + self.batch_size]}
            for i in range(0, len(labels), self.batch_size)
        ]

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, int]:
        """Label-smoothed cross-entropy per image."""
        logits = model(batch["images"])  # (B, K)
        loss = F.cross_entropy(
            logits.float(), batch["labels"], label_smoothing=self.label_smoothing
        )
        return loss, len(batch["labels"])

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Loss (no smoothing), accuracy and macro-F1 in percent on the validation images.

        Predictions average the ``test_shift`` views, as the trained run's predictions do;
        the loss is that of the averaged probabilities.
        """
        probs = view_probabilities(model, self.valid.images, self.test_shift)  # (B, K)
        labels = self.valid.labels.to(probs.device)
        scores = label_scores(labels.tolist(), probs.argmax(-1).tolist(), self.n_classes)
        loss = F.nll_loss(probs.clamp_min(1e-12).log(), labels).item()
        return {"loss": loss, **scores}
