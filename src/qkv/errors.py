"""Errors a user can cause and fix: bad files, bad options, bad checkpoints."""

from __future__ import annotations


class InputError(ValueError):
    """One clear sentence naming the file, line or value at fault and what to do.

    The command line prints it as ``qkv: error: <message>`` and exits non-zero, with no traceback.
    """


def where(path: object, line: int | None = None) -> str:
    """``path`` or ``path:line``, the prefix of every InputError about a file."""
    return f"{path}:{line}" if line is not None else f"{path}"
