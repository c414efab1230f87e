"""``geodiloco run`` and ``geodiloco train``."""
from __future__ import annotations


def register(subparsers) -> None:
    """Add the runtime's subcommands to the ``geodiloco`` parser."""
