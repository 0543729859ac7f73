"""Progress of long work: a bar on a terminal, a plain line now and then anywhere else.

A log file or CI output gets one readable line every N steps instead of a carriage-return
bar; with a time budget the bar counts seconds, not steps, since the budget ends the run.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm.auto import tqdm


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class TrainingProgress:
    """Shows steps (or seconds, with ``max_time``) of a training run.

    Args:
        enabled: False shows nothing (``--no-progress``, ranks other than 0).
        desc: what is trained, e.g. ``train translation``.
        max_steps, max_time: the budgets; with ``max_time`` the bar counts seconds.
        step, elapsed: where a resumed run starts.
        every: on a non-terminal, print a line every this many steps.
        stream: where to write (default: stderr).
    """

    def __init__(
        self,
        enabled: bool,
        desc: str,
        max_steps: int,
        max_time: float | None,
        step: int = 0,
        elapsed: float = 0.0,
        every: int = 50,
        stream: TextIO | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        self.enabled, self.desc, self.every = enabled, desc, every
        self.max_steps, self.max_time = max_steps, max_time
        self.terminal = enabled and is_terminal(self.stream)
        self.postfix: dict[str, Any] = {}
        self.bar = None
        if self.terminal:
            by_time = max_time is not None
            self.bar = tqdm(
                total=round(max_time) if by_time else max_steps,
                initial=round(elapsed) if by_time else step,
                unit="s" if by_time else "step",
                dynamic_ncols=True,
                desc=desc,
                file=self.stream,
                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{postfix}]" if by_time else None,
            )

    def update(self, step: int, elapsed: float, **postfix: Any) -> None:
        """After optimizer step ``step``, ``elapsed`` seconds into the budget."""
        if postfix:
            self.postfix = postfix
        if self.bar is not None:
            if self.max_time is not None:
                self.bar.n = min(round(elapsed), self.bar.total)
                self.bar.refresh()
            else:
                self.bar.update(step - self.bar.n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
        elif self.enabled and step % self.every == 0:
            self.write(self.line(step, elapsed))

    def line(self, step: int, elapsed: float) -> str:
        budget = f"/{self.max_steps}" if self.max_time is None else ""
        time = f"{elapsed:.0f} s" + (f"/{self.max_time:.0f} s" if self.max_time else "")
        extra = "".join(f", {k} {v}" for k, v in self.postfix.items())
        return f"{self.desc}: step {step}{budget}, {time}{extra}"

    def write(self, text: str) -> None:
        """A line that does not break the bar."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
