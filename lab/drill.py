"""Failure drills: kill, freeze, thaw or restart an emulated site at a chosen round.

``geodiloco run --drill "kill:c@3,restart:c@5"`` kills every process of node c's site halfway
through round 3 (SIGKILL to its torchrun agent and workers: a machine that died) and starts
the site again halfway through round 5 (its agent joins the next rendezvous). ``freeze``
sends SIGSTOP (a hung machine that keeps its sockets open), ``thaw`` SIGCONT. Each event is
written to ``RUN_DIR/drill.jsonl`` with its unix time, so the report and the benchmarks can
measure detection, recovery and rejoin from the logs.

Rounds count from 1 as the progress lines do, from round 2 on: "halfway" is timed from the
round before. It is half the duration of the last round the run logged (the round starts when the
previous one is in plan.jsonl), read from the times plan.jsonl was written, not from when the
drill noticed, so an event lands in the middle of its round even when rounds last only a second.
Round 1's start is not logged, so an event in round 2 takes half of round 1's longest local phase
(its nodes' compute_s in metrics.jsonl) instead. When the last round was long (it held a failure
and the restart), an event whose round ends before that halfway mark fires as soon as that round
is logged.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from geodiloco.balancer.records import read_json_lines
from geodiloco.lab.process_tree import signal_tree
from geodiloco.common.schema import ConfigError

ACTIONS = {"kill": signal.SIGKILL, "freeze": signal.SIGSTOP, "thaw": signal.SIGCONT, "restart": None}
DRILL_LOG = "drill.jsonl"


@dataclass
class DrillEvent:
    action: str
    node: str
    round: int
    """1-based round in whose middle the event fires."""


def parse_drill(text: str, config, rounds_done: int = 0) -> list[DrillEvent]:
    """``ACTION:NODE@ROUND`` items separated by commas, e.g. ``kill:c@3,restart:c@5``. ``rounds_done``: rounds a
    resumed run has already done (an event in one of them would fire at once, in another round)."""
    names = [node.name for node in config.nodes]
    events = []
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise ConfigError(f"--drill {text!r}: no event; give ACTION:NODE@ROUND items separated by commas, e.g. "
                          f"kill:{names[-1]}@3")
    for item in items:
        parsed = re.fullmatch(r"([a-z]+):([^@]+)@([0-9]+)", item, flags=re.ASCII)
        if parsed is None or parsed.group(1) not in ACTIONS:
            raise ConfigError(f"--drill {item!r}: expected ACTION:NODE@ROUND with ACTION one of "
                              f"{', '.join(ACTIONS)}, e.g. kill:{names[-1]}@3")
        action, node, round_idx = parsed.group(1), parsed.group(2), int(parsed.group(3))
        if node not in names:
            raise ConfigError(f"--drill {item!r}: node {node!r} is not in the config ({', '.join(names)})")
        if not 2 <= round_idx <= config.diloco.rounds:
            raise ConfigError(f"--drill {item!r}: round {round_idx} is outside 2..{config.diloco.rounds} "
                              "(diloco.rounds; an event fires halfway through its round, timed from the round "
                              "before, so round 1 cannot hold one)")
        if round_idx <= rounds_done:
            raise ConfigError(f"--drill {item!r}: round {round_idx} is done already (the run resumes after round "
                              f"{rounds_done}); give a round from {rounds_done + 1} on")
        events.append(DrillEvent(action, node, round_idx))
    events.sort(key=lambda event: event.round)
    check_sites_left(events, names, config.comm.min_nodes)
    return events


def check_sites_left(events: list[DrillEvent], names: list[str], min_nodes: int) -> None:
    """Refuse a drill that leaves fewer than ``comm.min_nodes`` sites running: no world can form without them,
    so the survivors would wait ``comm.elastic.join_timeout_s`` and fail, and no later round (nor an event set
    in one) would come."""
    down: set[str] = set()
    for event in events:
        if event.action in ("kill", "freeze"):
            down.add(event.node)
        else:
            down.discard(event.node)
        if len(names) - len(down) < min_nodes:
            raise ConfigError(f"--drill: after {event.action}:{event.node}@{event.round}, {len(names) - len(down)} "
                              f"of {len(names)} sites run ({', '.join(name for name in names if name not in down)}), "
                              f"fewer than comm.min_nodes ({min_nodes}): the run would wait "
                              "comm.elastic.join_timeout_s and fail; stop fewer sites at once, or lower "
                              "comm.min_nodes")


def rounds_logged(run_dir: Path) -> tuple[int, float]:
    """Rounds the coordinator has finished and logged (highest round in plan.jsonl, plus one), and
    the unix time plan.jsonl was last written (0 rounds and 0.0 before it exists)."""
    path = run_dir / "plan.jsonl"
    try:
        written_at = path.stat().st_mtime
    except FileNotFoundError:
        return 0, 0.0
    rounds = [row["round"] for row in read_json_lines(path) if isinstance(row.get("round"), int)]
    return (max(rounds) + 1 if rounds else 0), written_at


def longest_local_phase_s(run_dir: Path, round_idx: int) -> float | None:
    """The longest node compute_s of a round in metrics.jsonl (seconds), None before the round is there."""
    rows = read_json_lines(run_dir / "metrics.jsonl")
    phases_s = [row["compute_s"] for row in rows
                if row.get("round") == round_idx and row.get("node") != "global" and row.get("compute_s") is not None]
    return max(phases_s) if phases_s else None


class DrillRunner:
    """Fires drill events against the launcher's site processes from a thread (context manager)."""

    def __init__(self, events: list[DrillEvent], processes: list[subprocess.Popen], launcher, run_dir: Path,
                 poll_s: float = 0.2) -> None:
        self.events = list(events)
        self.processes = processes
        self.launcher = launcher
        self.run_dir = run_dir
        self.poll_s = poll_s
        self.frozen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="geodiloco-drill", daemon=True)
        self._names = [node.name for node in launcher.config.nodes]

    def __enter__(self) -> "DrillRunner":
        if self.events:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for index in self.frozen:
            signal_tree(self.processes[index].pid, signal.SIGKILL)

    def _run(self) -> None:
        logged, logged_at, round_s = 0, time.time(), None
        wait_s = self.poll_s
        while not self._stop.wait(wait_s):
            now_logged, written_at = rounds_logged(self.run_dir)
            if now_logged > logged:
                round_s = written_at - logged_at if logged else None
                logged, logged_at = now_logged, written_at
            if round_s is None and logged:
                round_s = longest_local_phase_s(self.run_dir, logged - 1)
            wait_s = self.poll_s
            while self.events and logged >= self.events[0].round - 1:
                overdue = logged >= self.events[0].round  # its round ended first: the last one was long (a failure)
                if round_s is None and not overdue:
                    break  # round 1's metrics are not written yet
                until_halfway_s = logged_at + (round_s or 0.0) / 2 - time.time()
                if until_halfway_s > 0 and not overdue:
                    wait_s = min(wait_s, until_halfway_s)
                    break
                self._fire(self.events.pop(0), logged + 1)
            if not self.events:
                self._release_frozen_when_alone()

    def _fire(self, event: DrillEvent, in_round: int) -> None:
        """``in_round``: the 1-based round running now (its round, or a later one when the round before the
        event's was long, as after a failure); written beside the requested one."""
        index = self._names.index(event.node)
        process = self.processes[index]
        note = None
        if event.action == "restart":
            if process.poll() is None:
                note = "it was running: killed first"
                signal_tree(process.pid, signal.SIGKILL)
                process.wait()
            self.frozen.discard(index)
            self.processes[index] = self.launcher.start(index)
        elif process.poll() is not None:
            note = f"skipped: the site is not running (it exited with code {process.returncode})"
        elif event.action == "thaw" and index not in self.frozen:
            note = "skipped: the site was not frozen"
        else:
            signal_tree(process.pid, ACTIONS[event.action])
            if event.action == "freeze":
                self.frozen.add(index)
            elif event.action == "thaw":
                self.frozen.discard(index)
        row = {**asdict(event), "fired_in_round": in_round, "time": time.time(), **({"note": note} if note else {})}
        with open(self.run_dir / DRILL_LOG, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        late = f" (asked for round {event.round}, which ended first)" if in_round != event.round else ""
        print(f"[geodiloco] drill: {event.action} node {event.node} in round {in_round}{late}"
              f"{f'; {note}' if note else ''}", flush=True)

    def _release_frozen_when_alone(self) -> None:
        """Once every site that is not frozen has ended, a frozen one would wait forever: kill it."""
        others = [process for index, process in enumerate(self.processes) if index not in self.frozen]
        if self.frozen and all(process.poll() is not None for process in others):
            for index in sorted(self.frozen):
                signal_tree(self.processes[index].pid, signal.SIGKILL)
            self.frozen.clear()


def read_drill(run_dir: Path) -> list[dict]:
    return read_json_lines(Path(run_dir) / DRILL_LOG)

