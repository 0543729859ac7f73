"""Line-by-line prediction: read a batch of lines, write one output line for each, repeat.

Works on files and pipes and interactively (a terminal gets each line answered as it is
typed, as ``fairseq-interactive`` does). Bytes that are not UTF-8 stop the stream with one
line naming the input line; everything before it has been written already.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from tqdm.auto import tqdm

from qkv.errors import InputError
from qkv.progress import is_terminal


def decode_line(raw: bytes, name: str, number: int) -> str:
    """One input line as text, without its line ending; a BOM on line 1 is dropped."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{name}, line {number}: byte {e.start + 1} (0x{raw[e.start]:02x}) is not valid "
            "UTF-8; re-encode the input as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    line = line.removesuffix("\n").removesuffix("\r")
    return line.removeprefix("\ufeff") if number == 1 else line


def line_batches(
    stream: BinaryIO, name: str, size: int, interactive: bool
) -> Iterator[tuple[int, list[str]]]:
    """(number of the first line, lines) batches of up to ``size`` lines; 1 when interactive."""
    batch: list[str] = []
    first = number = 1
    for raw in iter(stream.readline, b""):
        try:
            line = decode_line(raw, name, number)
        except InputError:
            if batch:  # answer the good lines before the bad one, then stop
                yield first, batch
            raise
        batch.append(line)
        number += 1
        if interactive or len(batch) >= size:
            yield first, batch
            first, batch = number, []
    if batch:
        yield first, batch


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def open_input(path: str | None) -> tuple[BinaryIO, str]:
    if path is None or path == "-":
        return sys.stdin.buffer, "stdin"
    try:
        return open(path, "rb"), path  # noqa: SIM115 (closed by the caller)
    except OSError as error:
        raise InputError(f"--input {path}: cannot be read ({error.strerror})") from None


def open_output(path: str | None) -> TextIO:
    if path is None or path == "-":
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by the caller)
    except OSError as error:
        raise InputError(f"--output {path}: cannot be written ({error.strerror})") from None


def run_stream(
    predict: Callable[[list[str], int], list[str]],
    input_path: str | None,
    output_path: str | None,
    buffer_size: int,
    progress: bool = True,
) -> int:
    """Answer every input line with one output line; returns the number of lines.

    Args:
        predict: ``(lines, number of the first) -> one output line per input line``.
        buffer_size: lines predicted together (more is faster on a file).
        progress: show a bar on stderr when it is a terminal and the input a file.
    """
    if buffer_size < 1:
        raise InputError(f"--buffer-size {buffer_size} must be at least 1")
    stream, name = open_input(input_path)
    out = open_output(output_path)
    interactive = is_terminal(stream)
    bar = None
    if progress and name != "stdin" and is_terminal(sys.stderr):
        bar = tqdm(total=count_lines(Path(name)), unit="line", desc="predict", leave=False)
    done = 0
    try:
        for first, lines in line_batches(stream, name, buffer_size, interactive):
            outputs = predict(lines, first)
            if len(outputs) != len(lines):
                raise AssertionError(f"{len(outputs)} outputs for {len(lines)} lines")
            out.write("".join(line + "\n" for line in outputs))
            out.flush()
            done += len(lines)
            if bar is not None:
                bar.update(len(lines))
    finally:
        if bar is not None:
            bar.close()
        if stream is not sys.stdin.buffer:
            stream.close()
        if out is not sys.stdout:
            out.close()
    return done
