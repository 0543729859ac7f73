"""Labeled text for sentence classification: TSV, CSV (header optional) and SST-2 lines.

The readers turn files into ``LabeledTexts``; ``encode_texts`` turns texts into the subword
ids the classifier reads ([CLS] first when it pools by it).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from qkv.data import BOS_ID, UNK_ID, SubwordTokenizer, read_lines
from qkv.errors import InputError, where

FORMATS = ("auto", "tsv", "csv", "sst2")
LABEL_HEADERS = {"label", "labels", "class", "category", "sentiment", "target", "y"}
TEXT_HEADERS = {"text", "sentence", "sentences", "review", "document", "content", "comment", "x"}


@dataclass
class LabeledTexts:
    """Texts with one label each, and the line each came from (for error messages)."""

    texts: list[str]
    labels: list[str]
    lines: list[int]
    source: str = "<python>"

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str]], source: str = "<python>") -> LabeledTexts:
        """``(label, text)`` pairs; the i-th pair counts as line i (from 1)."""
        pairs = list(pairs)
        return cls(
            [t for _, t in pairs], [lab for lab, _ in pairs], list(range(1, len(pairs) + 1)), source
        )

    def __len__(self) -> int:
        return len(self.texts)

    def where(self, i: int) -> str:
        return where(self.source, self.lines[i])


def detect_format(path: Path, first_line: str) -> str:
    """``tsv`` or ``csv`` by the file's suffix, else by its first line; otherwise ``sst2``."""
    suffix = path.suffix.lower()
    if suffix in (".tsv", ".csv"):
        return suffix[1:]
    if "\t" in first_line:
        return "tsv"
    # SST-2 lines start with a bare label ("1 a stirring ..."); a comma inside the first
    # word ("label,text", "1,great") means comma-separated values.
    return "csv" if "," in first_line.split(" ", 1)[0] else "sst2"


def _fields(line: str, fmt: str) -> list[str]:
    if fmt == "tsv":
        return line.split("\t", 1)
    if fmt == "sst2":
        return line.split(" ", 1)
    row = next(csv.reader([line], strict=True))
    return [row[0], ",".join(row[1:])] if len(row) > 1 else row


FORMAT_SHAPES = {"tsv": "label<TAB>text", "csv": "label,text", "sst2": "label text"}


def read_labeled(path: str | Path, fmt: str = "auto") -> LabeledTexts:
    """Read one labeled text a line: ``label<TAB>text``, ``label,text`` or SST-2's ``label text``.

    A first row of column names (``label<TAB>text``, ``sentence,label``, ...) is a header and
    sets the column order. Blank lines are skipped.

    Args:
        path: the file (UTF-8).
        fmt: one of ``auto``, ``tsv``, ``csv``, ``sst2``; ``auto`` looks at the suffix and the
            first line.

    Returns:
        The texts, labels and line numbers, in file order.
    """
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    path = Path(path)
    lines = read_lines(path)
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        raise InputError(f"{where(path)}: has only blank lines; give one labeled text a line.")
    fmt = detect_format(path, numbered[0][1]) if fmt == "auto" else fmt
    data = LabeledTexts([], [], [], str(path))
    label_first = True
    for index, (number, line) in enumerate(numbered):
        try:
            fields = [f.strip() for f in _fields(line, fmt)]
        except csv.Error as error:
            raise InputError(f"{where(path, number)}: not valid CSV ({error}).") from None
        if index == 0 and len(fields) == 2 and _is_header(fields):
            label_first = fields[0].lower() in LABEL_HEADERS
            continue
        if len(fields) != 2 or not fields[0] or not fields[1]:
            raise InputError(
                f"{where(path, number)}: expected {FORMAT_SHAPES[fmt]} (read as {fmt}) but got "
                f"{line[:60]!r}; give a label and a text on each line, or pass --format."
            )
        label, text = fields if label_first else fields[::-1]
        data.texts.append(text)
        data.labels.append(label)
        data.lines.append(number)
    if not data.texts:
        raise InputError(f"{where(path)}: has a header but no labeled text.")
    return data


def _is_header(fields: list[str]) -> bool:
    a, b = (f.lower() for f in fields)
    return (a in LABEL_HEADERS and b in TEXT_HEADERS) or (a in TEXT_HEADERS and b in LABEL_HEADERS)


def read_split(path: str | None, fmt: str, option: str) -> LabeledTexts:
    """``read_labeled`` of the file an option named; a missing option or file says which."""
    if path is None:
        raise InputError(f"{option} is missing: give a file of labeled texts, one a line")
    if not Path(path).is_file():
        raise InputError(f"{option} {path}: no such file; give a file of labeled texts")
    return read_labeled(path, fmt)


def encode_texts(
    tokenizer: SubwordTokenizer, texts: Sequence[str], max_len: int, cls: bool
) -> list[list[int]]:
    """Subword ids of each text, after [CLS] (the ``<s>`` id) when ``cls``, cut to ``max_len``."""
    out = []
    for ids in tokenizer.encode_batch(list(texts)):
        ids = ids[: max_len - int(cls)] or [UNK_ID]  # a text of no subwords still gets a row
        out.append([BOS_ID, *ids] if cls else ids)
    return out
