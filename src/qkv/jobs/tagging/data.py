"""Treebanks in CoNLL-U: the words of each sentence with their UPOS or XPOS tags."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import conllu

from qkv.data import read_lines
from qkv.errors import InputError, where

TAGSETS = {"upos": 3, "xpos": 4}  # column index (0-based) of the tag in a CoNLL-U token line
_TOKEN_ID = re.compile(r"\d+|\d+-\d+|\d+\.\d+")


@dataclasses.dataclass
class TaggedSentence:
    """Words of one sentence with their gold tags and the file lines they came from."""

    words: list[str]
    tags: list[str]
    lines: list[int]


def read_conllu(path: str | Path, tagset: str = "upos") -> list[TaggedSentence]:
    """Read the words (plain integer ids) and their UPOS or XPOS tags from a CoNLL-U file.

    Multiword-token ranges (``1-2``) and empty nodes (``1.1``) are skipped. The lines are
    checked here, since the ``conllu`` library accepts some malformed ones.

    Args:
        path: the CoNLL-U file (UTF-8).
        tagset: ``"upos"`` (column 4) or ``"xpos"`` (column 5).
    """
    if tagset not in TAGSETS:
        raise InputError(f"tagset {tagset!r} is not one of {sorted(TAGSETS)}")
    column = TAGSETS[tagset]
    sentences: list[TaggedSentence] = []
    block: list[str] = []
    numbers: list[int] = []
    for number, line in enumerate([*read_lines(path), ""], start=1):
        if line.strip():
            if not line.startswith("#"):
                _check_token_line(line, path, number, column, tagset)
                numbers.append(number)
            block.append(line)
            continue
        if numbers:
            tokens = conllu.parse("\n".join(block) + "\n\n")[0]
            sentence = TaggedSentence([], [], [])
            for token, line_number in zip(tokens, numbers, strict=True):
                if isinstance(token["id"], int):
                    sentence.words.append(token["form"])
                    sentence.tags.append(token[tagset])
                    sentence.lines.append(line_number)
            sentences.append(sentence)
        block, numbers = [], []
    if not sentences:
        raise InputError(f"{where(path)}: holds no CoNLL-U token lines; is it a CoNLL-U file?")
    return sentences


def _check_token_line(line: str, path: str | Path, number: int, column: int, tagset: str) -> None:
    fields = line.split("\t")
    if len(fields) != 10:
        raise InputError(
            f"{where(path, number)}: a CoNLL-U token line needs 10 tab-separated columns but "
            f"this one has {len(fields)}; separate the columns with single tabs."
        )
    if not _TOKEN_ID.fullmatch(fields[0]):
        raise InputError(
            f"{where(path, number)}: token id {fields[0]!r} is not a number, a range like 1-2 "
            "or an empty node like 1.1."
        )
    if "-" not in fields[0] and "." not in fields[0]:
        if not fields[1].strip():
            raise InputError(f"{where(path, number)}: the word form (column 2) is empty.")
        if fields[column] in ("", "_"):
            raise InputError(
                f"{where(path, number)}: word {fields[1]!r} has no {tagset.upper()} tag "
                f"(column {column + 1} is {fields[column]!r}); tag it or choose the other --tagset."
            )
