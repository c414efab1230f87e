"""Draw rich renderables as a PNG "screenshot" of a terminal, with matplotlib in a monospace font.

Needs no browser or SVG converter: each run of same-styled text is placed at its
character column, so box drawing lines up exactly.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.cells import cell_len  # noqa: E402
from rich.console import Console, RenderableType  # noqa: E402
from rich.segment import Segment  # noqa: E402
from rich.style import Style  # noqa: E402
from rich.terminal_theme import MONOKAI  # noqa: E402

BACKGROUND = MONOKAI.background_color.hex
FOREGROUND = MONOKAI.foreground_color.hex
PROMPT_COLOR = "#8fbf7f"
FONT_FAMILY = ["DejaVu Sans Mono", "DejaVu Sans"]
FONT_SIZE_PT = 10.0
CHAR_WIDTH_EM = 0.602
LINE_HEIGHT_EM = 1.32
MARGIN_CHARS = 2


def render_lines(renderables: list[RenderableType], width_chars: int) -> list[list[Segment]]:
    """Lay out the renderables as a terminal of ``width_chars`` columns would, one segment list per line."""
    console = Console(width=width_chars, file=io.StringIO(), color_system="truecolor", force_terminal=True,
                      markup=False)
    lines: list[list[Segment]] = []
    for renderable in renderables:
        lines.extend(console.render_lines(renderable, console.options, pad=False))
    return lines


def _merged(line: list[Segment]) -> list[tuple[int, str, Optional[Style]]]:
    """(column, text, style) runs with adjacent same-style segments joined."""
    runs: list[tuple[int, str, Optional[Style]]] = []
    column = 0
    for segment in line:
        if segment.control or not segment.text:
            continue
        if runs and runs[-1][2] == segment.style and runs[-1][0] + cell_len(runs[-1][1]) == column:
            start, text, style = runs[-1]
            runs[-1] = (start, text + segment.text, style)
        else:
            runs.append((column, segment.text, segment.style))
        column += cell_len(segment.text)
    return runs


def _text_kwargs(style: Optional[Style]) -> dict:
    color = FOREGROUND
    if style is not None and style.color is not None and not style.color.is_default:
        color = style.color.get_truecolor(MONOKAI, foreground=True).hex
    return {"color": color,
            "fontweight": "bold" if style is not None and style.bold else "normal",
            "alpha": 0.6 if style is not None and style.dim else 1.0}


def prompt_lines(command_words: list[str], width_chars: int) -> list[str]:
    """``$ command`` broken between words into lines ending in `` \\`` that fit ``width_chars``."""
    lines, current = [], "$"
    for word in command_words:
        if len(current) + 1 + len(word) + 2 > width_chars and current.strip() not in ("$", ""):
            lines.append(current + " \\")
            current = "   "
        current = f"{current} {word}"
    return lines + [current]


def save_terminal_png(renderables: list[RenderableType], path: str | Path, width_chars: int = 160,
                      command_words: Optional[list[str]] = None, dpi: int = 110) -> Path:
    """Write the renderables as a terminal screenshot; ``command_words`` are shown as a prompt on top."""
    lines = render_lines(renderables, width_chars)
    prompt_style = Style(color=PROMPT_COLOR, bold=True)
    lines[:0] = [[Segment(text, prompt_style)] for text in prompt_lines(command_words or [], width_chars)
                 if command_words]
    char_w_in = FONT_SIZE_PT * CHAR_WIDTH_EM / 72
    line_h_in = FONT_SIZE_PT * LINE_HEIGHT_EM / 72
    columns = width_chars + 2 * MARGIN_CHARS
    width_in, height_in = columns * char_w_in, (len(lines) + 2) * line_h_in
    figure = plt.figure(figsize=(width_in, height_in), facecolor=BACKGROUND)
    for row, line in enumerate(lines, start=1):
        y = 1 - (row + 0.5) * line_h_in / height_in
        for column, text, style in _merged(line):
            if text.strip():
                figure.text((MARGIN_CHARS + column) * char_w_in / width_in, y, text, family=FONT_FAMILY,
                            fontsize=FONT_SIZE_PT, va="center", ha="left", parse_math=False,
                            **_text_kwargs(style))
    target = Path(path)
    figure.savefig(target, dpi=dpi, facecolor=BACKGROUND)
    plt.close(figure)
    return target
