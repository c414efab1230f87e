"""The README figure script and the terminal screenshot renderer, on a synthetic run directory."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import matplotlib.image
from rich.table import Table

from geodiloco.report.terminal_image import prompt_lines, render_lines, save_terminal_png
from test_report_support import default_run

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "report" / "make_readme_figures.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("make_readme_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_readme_figures_writes_both_pictures(tmp_path, capsys):
    script = _load_script()
    run = default_run(tmp_path / "run")
    assert script.main([str(run), "--out", str(tmp_path / "figs"), "--price", "A30=0.6",
                        "--price", "RTX 2080 Ti=0.25"]) == 0
    terminal, timeline = tmp_path / "figs" / "report_terminal.png", tmp_path / "figs" / "timeline.png"
    assert f"wrote {terminal}" in capsys.readouterr().out
    terminal_image = matplotlib.image.imread(terminal)
    assert terminal_image.shape[1] > 1000 and terminal_image.shape[0] > 300
    assert terminal_image[..., :3].std() > 0.02  # text drawn on the background
    assert timeline.stat().st_size > 20_000
    assert script._shown_path(str(run)) == f"runs/{run.name}"
    assert script._shown_path("runs/demo") == "runs/demo"


def test_make_readme_figures_bad_run_dir(tmp_path, capsys):
    assert _load_script().main([str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_terminal_lines_keep_columns_aligned(tmp_path):
    table = Table("node", "idle s")
    table.add_row("a", "12.0")
    table.add_row("bb", "4.50")
    lines = ["".join(segment.text for segment in line) for line in render_lines([table], 40)]
    assert lines[3].index("12.0") == lines[4].index("4.50")
    image = save_terminal_png([table], tmp_path / "t.png", width_chars=40, command_words=["geodiloco", "report"])
    height, width = matplotlib.image.imread(image).shape[:2]
    assert width < 500 and height > 50


def test_long_prompt_is_broken_between_words():
    words = ["geodiloco", "report", "runs/demo", "--price", "'RTX 2080 Ti=0.25'", "--price", "A30=0.60"]
    lines = prompt_lines(words, 40)
    # every line keeps room for " \\", so the 39-character "    'RTX 2080 Ti=0.25' --price A30=0.60" is split
    assert lines == ["$ geodiloco report runs/demo --price \\", "    'RTX 2080 Ti=0.25' --price \\", "    A30=0.60"]
    assert all(len(line) <= 40 for line in lines)
