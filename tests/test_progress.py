"""Progress of training: a bar on a terminal, plain lines every N steps elsewhere."""

import io

from qkv.progress import TrainingProgress


def test_plain_lines_every_n_steps_when_not_a_terminal():
    stream = io.StringIO()
    progress = TrainingProgress(True, "train translation", 10, None, every=3, stream=stream)
    for step in range(1, 11):
        progress.update(step, elapsed=step * 0.5, loss="1.234")
    progress.close()
    lines = stream.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "train translation: step 3/10",
        "train translation: step 6/10",
        "train translation: step 9/10",
    ]
    assert "\r" not in stream.getvalue() and "loss 1.234" in lines[0]


def test_a_time_budget_is_shown_as_time_not_steps():
    stream = io.StringIO()
    progress = TrainingProgress(True, "train tagger", 20000, 60.0, every=1, stream=stream)
    progress.update(1, elapsed=12.4)
    assert stream.getvalue().strip() == "train tagger: step 1, 12 s/60 s"


def test_a_terminal_gets_a_bar_that_counts_seconds_under_a_time_budget():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    progress = TrainingProgress(True, "train vit", 20000, 60.0, every=1, stream=stream)
    progress.update(5, elapsed=30.2)
    assert progress.bar is not None and progress.bar.total == 60 and progress.bar.n == 30
    progress.close()
    assert "/60 s" in stream.getvalue() and "20000" not in stream.getvalue()


def test_disabled_progress_writes_nothing():
    stream = io.StringIO()
    progress = TrainingProgress(False, "train", 10, None, every=1, stream=stream)
    progress.update(1, 0.1)
    progress.write("step 1: loss 3")
    assert stream.getvalue() == ""
