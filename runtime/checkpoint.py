"""Checkpoints at outer-sync boundaries, written atomically (temp file + rename).

Layout: ``RUN_DIR/checkpoints/round_00003/global.safetensors`` (global parameters, outer
optimizer and planner history, the same on every node: each node's leader writes it
unless another node sharing the directory already did, so every site's disk holds
it), ``members.json`` (the nodes present in that round), ``node_<name>.safetensors`` (each node's
inner optimizer, data position, planner history, RNG states), and
``RUN_DIR/checkpoints/latest`` naming the newest complete round. ``latest``
is only moved after every node has written its file (each node reports the round
it saved in the next readiness exchange, and the run's end commits the last one),
so a crash at any moment leaves the previous complete checkpoint intact.

Files are runtime/state_file.py's format: safetensors tensors and JSON, with a SHA-256 checked
on every load, so loading a checkpoint never unpickles anything and a damaged file is refused.
"""
from __future__ import annotations

import contextlib
import fnmatch
import os
import threading
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

from geodiloco.runtime.state_file import CorruptStateFile, EncodedState, encode_state, load_state, write_encoded

LATEST_FILE = "latest"
GLOBAL_FILE = "global.safetensors"
MEMBERS_FILE = "members.json"
NODE_MARKS_DIR = "nodes"
_flush_to_disk = True


def set_flush_to_disk(enabled: bool) -> None:
    """This process's ``checkpoint.flush``. Off, files are still replaced atomically (a crashed process
    leaves each one whole or absent), but not fsynced: after a power loss or a kernel crash ``latest``
    may name files that never left the page cache. For fast local disks and runs one can redo."""
    global _flush_to_disk
    _flush_to_disk = enabled


def node_file_name(node_name: str) -> str:
    return f"node_{node_name}.safetensors"


NODE_FILE_GLOB = node_file_name("*")


def round_dir(run_dir: Path, round_idx: int) -> Path:
    return run_dir / "checkpoints" / f"round_{round_idx:05d}"


def note_node_uses_dir(run_dir: Path, node_name: str) -> None:
    """Leave a mark that ``node_name`` checkpoints into ``run_dir``. Nodes of a hivemind run may share
    one run directory (one machine, a shared file system) or each have their own (a site each); a node
    tells the two apart by the round writer's mark (``node_uses_dir``)."""
    marks = run_dir / "checkpoints" / NODE_MARKS_DIR
    marks.mkdir(parents=True, exist_ok=True)
    (marks / node_name).touch()


def node_uses_dir(run_dir: Path, node_name: str) -> bool:
    return (run_dir / "checkpoints" / NODE_MARKS_DIR / node_name).is_file()


@contextlib.contextmanager
def temp_beside(path: Path, tag: str) -> Iterator[Path]:
    """A temp file name beside ``path`` for an atomic replace; removed when the block fails, so a full disk
    or a failed encode leaves no ``*.tmp*`` file behind."""
    temp_path = path.with_name(f"{path.name}.tmp{tag}")
    try:
        yield temp_path
    except BaseException:
        with contextlib.suppress(OSError):
            temp_path.unlink(missing_ok=True)
        raise


def _atomic_save(obj: Any, path: Path) -> None:
    """Write a state (or an already encoded snapshot of one) to a temp file, flush it to disk, then rename it
    over ``path`` and flush the directory: after a power loss the file is either whole or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with temp_beside(path, str(os.getpid())) as temp_path:
        write_encoded(obj if isinstance(obj, EncodedState) else encode_state(obj), temp_path)
        _fsync_path(temp_path)
        os.replace(temp_path, path)
    _fsync_path(path.parent)


def _fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk. ``latest`` moves on, and old rounds are
    deleted, only after the new round's files are durable, not merely in the page cache."""
    if not _flush_to_disk:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_global(run_dir: Path, round_idx: int, state: dict) -> None:
    _atomic_save(state, round_dir(run_dir, round_idx) / GLOBAL_FILE)


def has_global(run_dir: Path, round_idx: int) -> bool:
    return (round_dir(run_dir, round_idx) / GLOBAL_FILE).is_file()


def save_node(run_dir: Path, round_idx: int, node_name: str, state: dict) -> None:
    _atomic_save(state, round_dir(run_dir, round_idx) / node_file_name(node_name))


def _saved_rounds(run_dir: Path) -> list[int]:
    rounds = []
    for path in (run_dir / "checkpoints").glob("round_*"):
        try:
            rounds.append(int(path.name.split("_", 1)[1]))
        except ValueError:
            continue
    return sorted(rounds)


def saved_global_rounds(run_dir: Path) -> list[int]:
    """Rounds with a global state file in ``run_dir`` (committed or not), oldest first."""
    return sorted(round_idx for round_idx in _saved_rounds(run_dir) if has_global(run_dir, round_idx))


def mark_latest(run_dir: Path, round_idx: int, keep: int) -> None:
    """Point ``latest`` at ``round_idx`` and delete the checkpoints older than the newest ``keep`` of those up
    to it (``checkpoint.keep`` counts checkpoints, so with ``every_rounds: 2`` two are two saves apart).

    Newer rounds are left alone: nodes may already be writing the next one. A node's newest own file stays
    where it is, alone in its round's folder, while the node is away: it holds the node's data position, which
    the node needs when it rejoins (docs/elastic.md), so no rounds deleted here make it train its data again."""
    point_latest(run_dir, round_idx)
    saved = [saved_round for saved_round in _saved_rounds(run_dir) if saved_round <= round_idx]
    newer_node_files = {name for kept in saved[-keep:] for name in _node_file_names(round_dir(run_dir, kept))}
    for old_round in reversed(saved[:-keep]):
        folder = round_dir(run_dir, old_round)
        node_files = _node_file_names(folder)
        if node_files <= newer_node_files:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            for entry in _entries(folder):
                if entry.name in node_files - newer_node_files:
                    continue
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        newer_node_files |= node_files


def _entries(folder: Path) -> list[Path]:
    """The folder's entries; none once it is gone. Nodes sharing a run directory (several on one machine) each
    prune old rounds after their commit, so a folder one lists may be deleted by another meanwhile."""
    try:
        return list(folder.iterdir())
    except FileNotFoundError:
        return []


def _node_file_names(folder: Path) -> set[str]:
    return {entry.name for entry in _entries(folder) if fnmatch.fnmatch(entry.name, NODE_FILE_GLOB)}


def point_latest(run_dir: Path, round_idx: int) -> None:
    """Atomically point ``latest`` at ``round_idx`` (several nodes may share the run directory)."""
    pointer = run_dir / "checkpoints" / LATEST_FILE
    pointer.parent.mkdir(parents=True, exist_ok=True)
    write_text_durably(pointer, f"{round_idx}\n")


def write_text_durably(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically and durably (temp file, fsync, rename, fsync of the folder)."""
    with temp_beside(path, f"{os.getpid()}.{threading.get_ident()}") as temp_path:  # nodes may be threads
        temp_path.write_text(text)
        _fsync_path(temp_path)
        os.replace(temp_path, path)
    _fsync_path(path.parent)


def drop_rounds_after(run_dir: Path, round_idx: int) -> None:
    """Delete rounds newer than ``round_idx`` (never committed: a run stopped while writing them).
    Called when resuming from ``round_idx``, before any node writes again."""
    for newer in _saved_rounds(run_dir):
        if newer > round_idx:
            shutil.rmtree(round_dir(run_dir, newer), ignore_errors=True)


def drop_node_files_after(run_dir: Path, node_name: str, round_idx: int) -> None:
    """Delete ``node_name``'s own files of rounds newer than ``round_idx`` (an async node resuming after that
    phase redoes them; left on disk, a later resume could take one for a phase of the new run). Other nodes'
    files stay: nodes of different speeds resume after different phases."""
    for newer in _saved_rounds(run_dir):
        if newer > round_idx:
            (round_dir(run_dir, newer) / node_file_name(node_name)).unlink(missing_ok=True)
            _remove_if_empty(round_dir(run_dir, newer))


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()


def latest_round(run_dir: Path) -> Optional[int]:
    """The committed round ``latest`` names; None when there is none (or it is unreadable)."""
    pointer = run_dir / "checkpoints" / LATEST_FILE
    if not pointer.is_file():
        return None
    try:
        return int(pointer.read_text().strip())
    except ValueError:
        print(f"[geodiloco] {pointer}: not a round number; ignored", file=sys.stderr, flush=True)
        return None


def usable_file(path: Path) -> bool:
    """Whether ``path`` exists, loads and matches its hash; a file that fails is reported on stderr."""
    if not path.is_file():
        return False
    try:
        load_state(path)
    except CorruptStateFile as err:
        print(f"[geodiloco] checkpoint refused: {err}; an older round is used instead", file=sys.stderr, flush=True)
        return False
    return True


def newest_verified_round(run_dir: Path, node_name: str) -> Optional[int]:
    """The newest committed round whose global file and this node's file both verify."""
    return next(iter(verified_rounds(run_dir, node_name)), None)


def verified_rounds(run_dir: Path, node_name: str, stop_at_first: bool = True) -> list[int]:
    """Committed rounds (up to ``latest``) whose global file and this node's file both verify, newest
    first; only the newest unless ``stop_at_first`` is False (each file is read to check its hash)."""
    latest = latest_round(run_dir)
    if latest is None:
        return []
    rounds = []
    for round_idx in sorted(_saved_rounds(run_dir), reverse=True):
        folder = round_dir(run_dir, round_idx)
        if round_idx <= latest and usable_file(folder / GLOBAL_FILE) and usable_file(folder / node_file_name(node_name)):
            rounds.append(round_idx)
            if stop_at_first:
                break
    return rounds


def kept_rounds(run_dir: Path) -> list[int]:
    """Committed rounds (up to ``latest``) whose global checkpoint is kept in ``run_dir/checkpoints``."""
    latest = latest_round(run_dir)
    return sorted(round_idx for round_idx in (int(path.parent.name.split("_", 1)[1])
                                              for path in (run_dir / "checkpoints").glob(f"round_*/{GLOBAL_FILE}"))
                  if latest is not None and round_idx <= latest)


def load_global(run_dir: Path, round_idx: int) -> dict:
    """Raises ``state_file.CorruptStateFile`` for a damaged file."""
    return load_state(round_dir(run_dir, round_idx) / GLOBAL_FILE)


def load_node(run_dir: Path, round_idx: int, node_name: str) -> dict:
    path = round_dir(run_dir, round_idx) / node_file_name(node_name)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; this node's checkpoint for round {round_idx} "
                                "was not found in its run directory (pass the same --run-dir as before)")
    return load_state(path)
