"""The idle log record (``idle.jsonl``): one per node per outer round.

Written by the runtime's tracker and by the simulator in the same shape, read
by the report. Times are seconds; ``round_start``/``round_end`` are unix seconds.
GPU idle = wait_s + comm_s + overhead_s, where ``comm_s`` is the exposed sync (the GPU
waits on communication). ``comm_hidden_s`` is sync time overlapped with compute
(``diloco.overlap``): not idle, reported beside it. ``sync_bytes``: bytes the node sent
in the outer sync this round. Compute utilization = compute_s / node time.
``lost_s`` (part of ``overhead_s``): work thrown away and the restart before this round when a
site failed or rejoined (torch backend) or the node fell behind (hivemind). ``present_nodes``:
the nodes that took part in the round. ``staleness`` (``diloco.mode: async`` only): global versions
applied between the node's pull and its update; ``mode``: sync | async. ``gpu_util`` (%), ``power_w``
(W), ``energy_j`` (J) over the round and ``idle_energy_j`` (J while idle) come from NVML; None without it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

REQUIRED_FIELDS = (
    "run_id", "round", "node", "site", "policy", "local_steps", "batch_size", "tokens",
    "compute_s", "wait_s", "comm_s", "round_start", "round_end",
)


@dataclass
class IdleRecord:
    run_id: str
    round: int
    node: str
    site: str
    policy: str
    local_steps: int
    batch_size: int
    tokens: int
    compute_s: float
    wait_s: float
    comm_s: float
    round_start: float
    round_end: float
    overhead_s: float = 0.0
    comm_hidden_s: float = 0.0
    sync_bytes: int = 0
    lost_s: float = 0.0
    present_nodes: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    num_gpus: int = 1
    source: str = "runtime"
    gpu_util: Optional[float] = None
    power_w: Optional[float] = None
    energy_j: Optional[float] = None
    idle_energy_j: Optional[float] = None
    staleness: Optional[int] = None
    mode: str = "sync"

    @property
    def idle_s(self) -> float:
        return self.wait_s + self.comm_s + self.overhead_s

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def append_records(path: str | Path, records: Iterable[IdleRecord]) -> None:
    """Append records as JSON lines, flushed so a crash loses at most the line in flight."""
    with open(path, "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(record.to_json() + "\n")
        handle.flush()


def read_json_lines(path: str | Path) -> list[dict]:
    """The JSON-object lines of a run log that another process may be appending to: a missing file gives no
    rows, and a line that does not parse (the one being written, or one a killed process left half written)
    is skipped, so a reader polling a live run never fails on it."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
