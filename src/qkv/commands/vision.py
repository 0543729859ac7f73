"""Commands of the vision job."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction, jobs: argparse._SubParsersAction) -> None:
    """Add this job's `qkv train` subcommand and its own commands."""
