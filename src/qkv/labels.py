"""The label set of a tagging or classification run: names <-> ids, saved as labels.json."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from qkv.checkpoint import write_json
from qkv.errors import InputError

LABELS = "labels.json"


class LabelVocab:
    """Labels in a fixed order; ids are positions. Unknown labels are an InputError."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = list(names)
        self.index = {name: i for i, name in enumerate(self.names)}
        if len(self.index) != len(self.names):
            raise ValueError("duplicate label names")

    @classmethod
    def from_data(cls, labels: Iterable[str]) -> LabelVocab:
        """Sorted, so that a run's label ids do not depend on the order of the data."""
        return cls(sorted(set(labels)))

    def __len__(self) -> int:
        return len(self.names)

    def id(self, name: str, where: str = "") -> int:
        if name not in self.index:
            shown = ", ".join(self.names[:12]) + (" ..." if len(self.names) > 12 else "")
            raise InputError(
                f"{where + ': ' if where else ''}label {name!r} was never seen in "
                f"training; the model knows {shown}"
            )
        return self.index[name]

    def save(self, path: Path) -> None:
        write_json(path, {"labels": self.names})

    @classmethod
    def load(cls, path: Path) -> LabelVocab:
        try:
            return cls(json.loads(Path(path).read_text(encoding="utf-8"))["labels"])
        except (OSError, ValueError, KeyError) as error:
            raise InputError(f"{path}: not a qkv label file ({error})") from None
