"""Published figures in the README: the text between two marker lines, rewritten by the script
in experiments/ that measured it (so the README never holds a figure no script regenerates)."""
from __future__ import annotations

from pathlib import Path


def replace_marked_block(path: Path, start: str, end: str, body: str) -> bool:
    """Put ``body`` between the ``start`` and ``end`` markers of ``path``, keeping both markers and
    everything around them; False (the file untouched) when a marker is missing."""
    text = path.read_text()
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{start}\n{body.rstrip()}\n{end}{tail}")
    return True
