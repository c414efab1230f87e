"""Where each node of an asynchronous run resumes: after its own newest phase the saved global model holds.

Nodes of an async run are at different phases at any moment, so no single round suits them all. The
host's global file records, beside the global model and its version, each node's newest phase it took in
(``pushed_rounds``, runtime/sync/async_server.py). A resume takes the global file with the highest version
on any present node's disk, and starts every node after its own newest saved phase up to the one recorded
there. So no phase is applied twice (its update is in the global model and the node does not train it
again), and a node whose pushes came after that global save trains them again instead of losing them.
A site that comes back no longer rolls the others back to its own last round.

Checkpoints written before the host recorded ``pushed_rounds`` resume as before: every node from the
newest round every node saved (runtime/recovery.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from geodiloco.runtime import checkpoint
from geodiloco.runtime.state_file import CorruptStateFile, load_structure


@dataclass
class GlobalOffer:
    """A global file one node's disk holds: where, its version, members and each node's newest phase in it
    (None in a file written before those were recorded)."""

    node: str
    round: int
    version: int
    members: list[str]
    pushed_rounds: Optional[dict[str, int]]
    host: Optional[str] = None
    """The node that hosted the global model when the file was written (None in older files)."""


def newest_global_offer(run_dir: Path, node: str, global_members: dict[int, list[str]]) -> Optional[GlobalOffer]:
    """The global file with the highest version among ``global_members`` (round -> members, the rounds whose
    global file verified on this disk); ties go to the newer round. Versions are read from the files' headers.

    Not the newest round: at the end of a run the host writes the final model over the newest round every
    node saved, while its own later rounds hold older models."""
    best: Optional[GlobalOffer] = None
    for round_idx, members in sorted(global_members.items()):
        try:
            offer = _offer_of(load_structure(checkpoint.round_dir(run_dir, round_idx) / checkpoint.GLOBAL_FILE),
                              node, round_idx, members)
        except (CorruptStateFile, AttributeError, TypeError, ValueError):  # a file of another shape: not a candidate
            continue
        if best is None or offer.version >= best.version:
            best = offer
    return best


def _offer_of(state: dict, node: str, round_idx: int, members: list[str]) -> GlobalOffer:
    sync_state = state.get("sync") or {}
    pushed = sync_state.get("pushed_rounds")
    host = sync_state.get("host")
    return GlobalOffer(node, round_idx, int(sync_state.get("version", 0)), [str(name) for name in members],
                       {str(name): int(value) for name, value in pushed.items()} if isinstance(pushed, dict) else None,
                       host if isinstance(host, str) else None)


def choose_global(offers: list[GlobalOffer], present: list[str]) -> Optional[GlobalOffer]:
    """The offer with the highest version (the most updates applied); among equals the first present node's."""
    order = {name: index for index, name in enumerate(present)}
    ranked = sorted(offers, key=lambda offer: (-offer.version, order.get(offer.node, len(order))))
    return ranked[0] if ranked else None


def resume_round(node_rounds: list[int], pushed_round: Optional[int]) -> Optional[int]:
    """The phase a node resumes after: its newest saved one up to ``pushed_round`` (its newest phase the global
    model holds). None: the node has no such file (it never pushed into this model, or its files are gone) and
    joins like a new node. A missing file of ``pushed_round`` itself (a crash before it was written) means the
    phases after the older file are trained and applied again: the only way left to go on."""
    if pushed_round is None:
        return None
    kept = [round_idx for round_idx in node_rounds if round_idx <= pushed_round]
    return max(kept) if kept else None
