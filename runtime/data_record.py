"""What data a run trained and evaluated on, so that a resume or ``geodiloco evaluate`` can tell the user
when the files behind ``data.source`` (or the dataset) changed since.

The config names the data by path only: edited, added or removed files give the same config and a
different corpus. A resume would then deal other windows from the saved data positions, and
``evaluate`` would score every round on another held-out set than the run's own eval rows; both go on
(adding data on purpose is legitimate), but say so in one line. The record is ``data.json`` in the run
directory: token count and SHA-256 of the eval set and, when the corpus is one array, of the corpus.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from geodiloco.runtime.checkpoint import write_text_durably

RECORD_FILE = "data.json"


def tokens_digest(arrays: Iterable[np.ndarray]) -> dict:
    """``{"tokens": count, "sha256": hex}`` of the arrays' values, back to back (so batching does not change
    it), as stored: the same data read the same way hashes alike without a widened copy of the corpus."""
    digest = hashlib.sha256()
    count = 0
    for array in arrays:
        values = np.ascontiguousarray(array)
        digest.update(values.data)
        count += values.size
    return {"tokens": count, "sha256": digest.hexdigest()}


def eval_set_digest(batches: list) -> dict:
    """Digest of the held-out inputs (targets are the same windows shifted by one token)."""
    return tokens_digest(inputs.numpy() for inputs, _ in batches)


SAMPLED_ABOVE_BYTES = 256 << 20
"""A memory-mapped corpus (``data.token_file``) larger than this is digested from samples, not read whole: every
node's leader records it at each start, and hashing tens of GB there would hold the formed world for minutes."""
SAMPLE_BLOCKS, SAMPLE_BLOCK_BYTES = 256, 64 << 10


def corpus_digest(corpus: np.ndarray) -> dict:
    """``tokens_digest`` of the corpus; for a large memory-mapped one, the SHA-256 of its size and 256 blocks of
    64 KiB spread evenly over it, the last one included (``"sampled": true``): an edit that changes no sampled
    block, or only the order of equal-sized parts between them, goes unseen."""
    if not isinstance(corpus, np.memmap) or corpus.nbytes <= SAMPLED_ABOVE_BYTES:
        return tokens_digest([corpus])
    raw = corpus.view(np.uint8).reshape(-1)
    digest = hashlib.sha256(str(raw.size).encode())
    last_start = raw.size - SAMPLE_BLOCK_BYTES
    for index in range(SAMPLE_BLOCKS):
        start = last_start * index // (SAMPLE_BLOCKS - 1)
        digest.update(raw[start:start + SAMPLE_BLOCK_BYTES].tobytes())
    return {"tokens": int(corpus.size), "sha256": digest.hexdigest(), "sampled": True}


def data_record(eval_batches: list, corpus: Optional[np.ndarray]) -> dict:
    """The run's record: the eval set's digest, and the corpus's (None for a streamed dataset)."""
    return {"eval_set": eval_set_digest(eval_batches),
            "corpus": None if corpus is None else corpus_digest(corpus)}


def read_record(run_dir: Path) -> Optional[dict]:
    """The saved record, or None where the run has none (runs from before it, or one unreadable)."""
    try:
        record = json.loads((run_dir / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_record(run_dir: Path, record: dict) -> None:
    """Atomic: several nodes of one machine share the run directory and write the same record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_durably(run_dir / RECORD_FILE, json.dumps(record, indent=1) + "\n")


def _describe(part: str, saved: dict, now: dict) -> str:
    if saved.get("tokens") != now.get("tokens"):
        return f"{part} has {now.get('tokens')} tokens, it had {saved.get('tokens')}"
    return f"{part} has the same {now.get('tokens')} tokens but other contents"


def changed_parts(saved: dict, now: dict, parts: tuple[str, ...]) -> list[str]:
    """A phrase per part of ``parts`` ("corpus", "eval_set") whose digest differs; parts either record
    lacks are not compared."""
    found = []
    for part in parts:
        before, after = saved.get(part), now.get(part)
        if isinstance(before, dict) and isinstance(after, dict) and before.get("sha256") != after.get("sha256"):
            found.append(_describe(part.replace("_", " "), before, after))
    return found


def record_key(record: dict) -> str:
    """A short key of a record's digests (the corpus's, else the eval set's)."""
    return (record.get("corpus") or record["eval_set"])["sha256"][:16]


def first_to_tell(run_dir: Path, key: str) -> bool:
    """Whether this node is the first of those sharing ``run_dir`` to tell ``key`` (nodes of one machine share
    it and see the same data: one line, not one per node; a site with its own run directory tells its own)."""
    marker = run_dir / f".told-{key}"
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def resume_notice(run_dir: Path, record: dict) -> Optional[str]:
    """The line a resumed node prints when its data differs from the run's record; None when it agrees or
    the run kept none."""
    saved = read_record(run_dir)
    if saved is None:
        return None
    changes = changed_parts(saved, record, ("corpus", "eval_set"))
    if not changes:
        return None
    return (f"data changed since this run started ({'; '.join(changes)}): training resumes from its saved data "
            "positions in the new data, and eval losses from here on are not comparable with earlier rounds'")


def evaluate_notice(run_dir: Path, eval_batches: list) -> Optional[str]:
    """The line ``geodiloco evaluate`` prints when the held-out set it rebuilt from the config's data is not
    the one the run evaluated on; None when it is, or the run kept no record."""
    saved = read_record(run_dir)
    if saved is None:
        return None
    changes = changed_parts(saved, {"eval_set": eval_set_digest(eval_batches)}, ("eval_set",))
    if not changes:
        return None
    return (f"the data changed since this run trained ({'; '.join(changes)}): these losses are on another "
            "held-out set than the run's own eval rows, and may include text the run trained on")
