"""Subcommands of the `geodiloco` command that belong to report/."""
from __future__ import annotations


def register(subparsers) -> None:
    """Add this package's subcommands to the `geodiloco` parser."""
