#!/usr/bin/env python3
"""Idle-time report of run directories: ``python scripts/idle_report.py RUN_DIR [RUN_DIR ...]``.

The same as ``geodiloco report``; works from a checkout without installing.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from geodiloco.report.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
