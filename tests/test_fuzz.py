"""Every reader and every prediction command, fed random and malformed bytes.

Each case ends in data, or in one clear ``InputError`` (exit 2 on the command line): never a
traceback. A prediction command that succeeds writes exactly one line per input line.

``make test`` runs a quick profile; ``make fuzz`` (HYPOTHESIS_PROFILE=fuzz) runs 1,000 cases
per target, more than 10,000 in all.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from qkv import checkpoint as ckpt
from qkv.cli import main
from qkv.data import SubwordTokenizer, read_lines
from qkv.errors import InputError
from qkv.jobs.classification.data import read_labeled
from qkv.jobs.pretraining import read_texts
from qkv.jobs.tagging.data import read_conllu
from qkv.jobs.translation.data import read_pairs
from qkv.jobs.vision.data import ImageConfig, read_image_folder
from qkv.model import Transformer
from qkv.viz.curves import read_metrics

from .helpers import tiny_model_config
from .viz.conftest import train_encoder_run

settings.register_profile(
    "quick", max_examples=15, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.register_profile(
    "fuzz", max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck)
)
# make test: the quick profile; make fuzz: HYPOTHESIS_PROFILE=fuzz.
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))

# Pieces that break readers: BOMs, line ends of three systems, NUL, Latin-1, a lone
# surrogate, tabs, CoNLL-U and TSV shapes with columns missing or extra.
PIECES = [
    b"\xef\xbb\xbf", b"\xff\xfe", b"\r\n", b"\n", b"\r", b"\t", b"\x00", b" ",
    "caf\xe9".encode("latin-1"), "\ud800".encode("utf-8", "surrogatepass"), "日本語".encode(),
    b"word", b"positive", b"0", b"1", b"# text = a b\n", b"1-2\tab\t_\t_\t_\t_\t_\t_\t_\t_\n",
    b"1\tWord\tword\tNOUN\tNN\t_\t0\troot\t_\t_\n", b"2\tx\tx\tVERB\n", b"1.1\tx\t_\n",
    b"1\tWord\tword\tNOUN\tNN\t_\t0\troot\t_\t_\textra\n", b"label\ttext\n", b"a sentence",
    b"{", b"}", b'{"job": "translation"}', b"\x89PNG\r\n\x1a\n", b"P5 8 8 255\n",
]  # fmt: skip
CONTENT = st.one_of(
    st.binary(max_size=300),
    st.lists(
        st.one_of(
            st.sampled_from(PIECES),
            st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass")),
        ),
        max_size=40,
    ).map(b"".join),
)
MEGABYTE_LINE = b"w " * 500_000 + b"\n"


def must_be_clear(read: Callable[[], Any]) -> None:
    """``read()`` returns, or raises an InputError of one line naming what is wrong."""
    try:
        read()
    except InputError as error:
        assert str(error) and "\n" not in str(error), repr(str(error))


def file_with(content: bytes, folder: Path, name: str = "data") -> Path:
    path = folder / name
    path.write_bytes(content)
    return path


READERS: dict[str, Callable[[Path], Any]] = {
    "tsv pairs": lambda p: read_pairs(p, None, None),
    "conllu": lambda p: read_conllu(p),
    "labeled texts": lambda p: read_labeled(p),
    "unlabeled texts": lambda p: read_texts(p),
    "lines": lambda p: read_lines(p),
    "tokenizer": lambda p: SubwordTokenizer.load(p),
    "training state": lambda p: ckpt.load_state(p),
    "weights": lambda p: ckpt.load_weights(Transformer(tiny_model_config()), p),
    "metrics": lambda p: read_metrics(p),
}


@pytest.mark.parametrize("reader", list(READERS))
@given(content=CONTENT)
@example(content=b"")
@example(content=MEGABYTE_LINE)
def test_a_reader_reads_or_says_what_is_wrong(reader, content):
    with tempfile.TemporaryDirectory() as folder:
        must_be_clear(lambda: READERS[reader](file_with(content, Path(folder))))


@given(source=CONTENT, target=CONTENT)
def test_parallel_files_read_or_say_what_is_wrong(source, target):
    with tempfile.TemporaryDirectory() as folder:
        file_with(source, Path(folder), "data.de")
        file_with(target, Path(folder), "data.en")
        must_be_clear(lambda: read_pairs(Path(folder) / "data", "de", "en"))


@given(content=CONTENT)
def test_a_run_config_reads_or_says_what_is_wrong(content):
    with tempfile.TemporaryDirectory() as folder:
        file_with(content, Path(folder), ckpt.CONFIG)
        must_be_clear(lambda: ckpt.read_run_config(Path(folder)))


@given(content=CONTENT)
@example(content=b"")
def test_an_image_folder_reads_or_says_what_is_wrong(content):
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "seven").mkdir()
        file_with(content, Path(folder) / "seven", "picture.png")
        config = ImageConfig(image_size=8, channels=1, patch_size=4, n_classes=1)
        must_be_clear(lambda: read_image_folder(folder, config))


# -- prediction commands -------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny tagger and classifier (trained through the CLI), and a tiny translator."""
    from .helpers import train_translation_args, write_splits
    from .viz.conftest import TRANSLATION_OPTIONS, qkv

    folder = tmp_path_factory.mktemp("fuzz_runs")
    translation = folder / "translation"
    translation.mkdir()
    out = translation / "run"
    assert qkv(*train_translation_args(write_splits(translation), out, *TRANSLATION_OPTIONS)) == 0
    found = {"translate": out}
    for job, command in (("tagger", "tag"), ("classifier", "classify")):
        (folder / job).mkdir()
        found[command] = train_encoder_run(job, folder / job)[0]
    return found


def predict(command: str, run: Path, content: bytes) -> tuple[int, list[bytes], str]:
    """Run ``qkv COMMAND`` on ``content``; (exit code, output lines, what it said on stderr)."""
    with tempfile.TemporaryDirectory() as folder:
        given_path = file_with(content, Path(folder), "in.txt")
        out = Path(folder) / "out.txt"
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = main([command, "--model", str(run), "--input", str(given_path),
                         "--output", str(out), "--threads", "1"])  # fmt: skip
        written = out.read_bytes() if out.is_file() else b""
        return code, written.split(b"\n")[:-1], stderr.getvalue()


@pytest.mark.parametrize("command", ["translate", "tag", "classify"])
@given(content=CONTENT)
@example(content=b"")
@example(content=b"\xef\xbb\xbfa\r\nb\x00c\n\n\xe9\n")
@example(content=MEGABYTE_LINE)
def test_a_prediction_command_answers_every_line_or_stops_clearly(runs, command, content):
    code, lines, said = predict(command, runs[command], content)
    given_lines = content.split(b"\n")
    expected = len(given_lines) - (given_lines[-1] == b"")  # the last line may lack "\n"
    if code == 0:
        assert len(lines) == expected
    else:
        assert code == 2
        assert said.startswith("qkv: error:") and said.count("\n") == 1, said
        assert len(lines) < expected  # the lines before the bad one, answered
