"""Where a torch-backend run resumes after its membership changed (a site failed or came back).

Every node's leader keeps, on its own disk, the global state of the rounds it saved
(``global.safetensors``, the same on every node after an outer step) with the round's members
(``members.json``), and its own node file. When the workers start again (torchrun's
elastic agent restarted them, or a person passed ``--resume``), the present leaders report
what they hold and all pick the same round: the newest one whose global state some
present node holds and whose node file every present member of that round holds. A node
that was not a member of it (it rejoins) takes the global state and the inner optimizer
state of the node that sent it (AdamW started from zero moments moves every parameter by
about the learning rate on its first steps, far more than a warmed-up optimizer does). So a
failure costs at most the round in progress.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from geodiloco.balancer.records import read_json_lines
from geodiloco.runtime import checkpoint

MEMBERS_FILE = checkpoint.MEMBERS_FILE
MEMBERSHIP_LOG = "membership.jsonl"


@dataclass
class SavedRounds:
    """What one node's leader holds in its run directory.

    ``global_members``: round -> the nodes that took part in it, for every round whose global
    state is on this disk; ``node_rounds``: rounds this node saved its own file for."""

    node: str
    global_members: dict[int, list[str]]
    node_rounds: list[int]
    jobs: list[str] = field(default_factory=list)
    """The elastic jobs (torchrun rendezvous ids) that wrote those rounds."""


@dataclass
class ResumePoint:
    """The round every present node restarts after, who sends its global state (a member of that
    round when one is present: it also lends its inner optimizer state to nodes that rejoin), and
    who had been a member of it."""

    round: int
    source_node: str
    members: list[str]
    synthetic: bool = False
    """Not a round every present member can restart after: the newest global state, for a backend that chooses each
    node's start itself (async mode)."""


AGENT_STARTED_ENV = "GEODILOCO_AGENT_STARTED"
"""Unix time the site's elastic agent (runtime/agent.py) started: a site that rejoins counts its wait from it."""


def agent_started() -> Optional[float]:
    """When this worker's site agent started (None outside one, or unreadable)."""
    try:
        return float(os.environ[AGENT_STARTED_ENV])
    except (KeyError, ValueError):
        return None


def elastic_job() -> Optional[str]:
    """The torchrun rendezvous id of this worker's job (None outside torchrun's elastic agent).
    Workers that find rounds written by their own job were restarted by their agents (a site
    failed or joined) and resume without being asked."""
    return os.environ.get("TORCHELASTIC_RUN_ID") or None


def restarts_left(environ=os.environ) -> bool:
    """Whether torchrun's elastic agent will restart this worker when it exits (so a world can form again)."""
    if not elastic_job():
        return False
    return int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")) < int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))


def trained_in_job(run_dir: Path, node_name: str, job: Optional[str]) -> bool:
    """Whether ``node_name`` was a member of a round this elastic ``job`` saved in ``run_dir`` (it was
    training in the running job before this world formed). Reads only the rounds' member lists."""
    if job is None:
        return False
    for path in (run_dir / "checkpoints").glob(f"round_*/{MEMBERS_FILE}"):
        saved = read_members(path)
        if saved is not None and saved.get("job") == job and node_name in saved["members"]:
            return True
    return False


def write_members(run_dir: Path, round_idx: int, members: list[str]) -> None:
    path = checkpoint.round_dir(run_dir, round_idx) / MEMBERS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_text_durably(path, json.dumps({"members": members, "job": elastic_job()}) + "\n")


def read_members(path: Path) -> Optional[dict]:
    """A round's members.json, or None when it is missing or damaged (that round is not used)."""
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        saved = None
    if not isinstance(saved, dict) or not isinstance(saved.get("members"), list):
        print(f"[geodiloco] checkpoint refused: {path} is damaged; an older round is used instead",
              file=sys.stderr, flush=True)
        return None
    return saved


def saved_rounds(run_dir: Path, node_name: str) -> SavedRounds:
    """Scan ``run_dir/checkpoints`` for this node: rounds whose files exist and verify (a damaged
    file is reported and its round skipped, so the run resumes from an older intact one)."""
    global_members: dict[int, list[str]] = {}
    jobs: set[str] = set()
    node_rounds: list[int] = []
    for round_path in sorted((run_dir / "checkpoints").glob("round_*")):
        try:
            round_idx = int(round_path.name.split("_", 1)[1])
        except ValueError:
            continue
        saved = read_members(round_path / MEMBERS_FILE)
        if saved is not None and checkpoint.usable_file(round_path / checkpoint.GLOBAL_FILE):
            global_members[round_idx] = saved["members"]
            if saved.get("job"):
                jobs.add(saved["job"])
        if checkpoint.usable_file(round_path / checkpoint.node_file_name(node_name)):
            node_rounds.append(round_idx)
    return SavedRounds(node_name, global_members, node_rounds, sorted(jobs))


def choose_resume_point(reports: list[SavedRounds], present: list[str]) -> Optional[ResumePoint]:
    """The newest round that every present node can restart after (None: nothing usable saved).

    ``reports``: the present leaders' ``saved_rounds``; ``present``: node names in config order."""
    by_node = {report.node: report for report in reports}
    candidates = sorted({round_idx for report in reports for round_idx in report.global_members}, reverse=True)
    for round_idx in candidates:
        holders = [name for name in present if name in by_node and round_idx in by_node[name].global_members]
        members = by_node[holders[0]].global_members[round_idx]
        returning = [name for name in present if name in members]
        if all(name in by_node and round_idx in by_node[name].node_rounds for name in returning):
            source = next((name for name in holders if name in returning), holders[0])
            return ResumePoint(round_idx, source, members)
    return None


def newest_node_round(report: SavedRounds, before: int) -> Optional[int]:
    """This node's newest own file up to round ``before`` (a rejoining node's data position)."""
    rounds = [round_idx for round_idx in report.node_rounds if round_idx <= before]
    return max(rounds) if rounds else None


def log_membership_event(run_dir: Path, event: str, **fields) -> None:
    """Append ``{"time", "event", ...}`` to ``RUN_DIR/membership.jsonl``: when a worker noticed a
    lost peer (``peer_failed``), when a world went on with other members (``resumed``), and when a
    node was left out of a round's average for a non-finite model (``non_finite``)."""
    row = {"time": time.time(), "event": event, **fields}
    with contextlib.suppress(OSError):
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / MEMBERSHIP_LOG, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")


def read_membership_events(run_dir: Path) -> list[dict]:
    return read_json_lines(Path(run_dir) / MEMBERSHIP_LOG)
