#!/usr/bin/env python3
"""Idle-time report of run directories: ``python scripts/idle_report.py RUN_DIR [RUN_DIR ...]``.

The same as ``geodiloco report``; works from a checkout without installing the project itself, with
its report's dependencies importable (numpy, PyYAML, pydantic, rich; matplotlib for ``--plot``).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPORT_NEEDS = "numpy pyyaml pydantic rich"

try:
    from geodiloco.report.cli import main  # noqa: E402
except ModuleNotFoundError as err:
    print(f"idle_report.py: error: this Python lacks {(err.name or '?').split('.')[0]!r}, which the report needs: run it with the "
          f"project's environment (.venv/bin/python scripts/idle_report.py ...), or pip install {REPORT_NEEDS}",
          file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main())
