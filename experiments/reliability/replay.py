"""Replay the failures a user or an attacker can cause, and record what the user gets.

    .venv/bin/python experiments/reliability/replay.py            # every scenario (~5 min on 2 cores)
    .venv/bin/python experiments/reliability/replay.py --only kill,foreign_torch

Every scenario runs the real commands (``geodiloco run``, ``python -m geodiloco.runtime.train``,
the CLIs) on loopback with the tiny model and virtual GPUs, does the damage for real (SIGKILL,
SIGSTOP, random bytes in a checkpoint, a process holding another secret, a forged hivemind
record) and reads the outcome from exit codes, output and the run directory: exit code, seconds
from the damage to the moment it was handled (detected, refused or reported), whether any output
held a Python traceback, and what survived. The "before" column is what the issue that asked for
these guards reported (not re-measured here). Writes experiments/results/reliability/replay.md
and replay.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from geodiloco.runtime import checkpoint  # noqa: E402
from geodiloco.runtime.launch import free_port  # noqa: E402
from geodiloco.runtime.recovery import read_membership_events  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "reliability"
SECRET = "replay-shared-secret-0123456789"
NODES = [{"name": name, "gpus": ["RTX 3090"], "emulate": {"step_time_s": 0.05}} for name in ("a", "b", "c")]
BEFORE = {
    "nan_site": "exit 0 'finished', NaN checkpoints kept",
    "all_nan": "exit 0 'finished', NaN checkpoints kept",
    "corrupt_checkpoint": "loads silently, NaN after resume, exit 0; good rounds rotated away",
    "foreign_torch": "foreign client listed and wrote store keys; pickle from peers",
    "foreign_hivemind": "forged heartbeat stalled the run ~120 s",
    "path_traversal": "checkpoint written outside the run directory",
    "kill": "launcher exit 247, node and cause unnamed",
    "frozen": "everyone blocked for comm.timeout_s (300 s)",
    "bad_inputs": "tracebacks, silent CPU node, hangs",
}


def config(tmp: Path, name: str, **changes) -> Path:
    body = {"run": {"name": "replay", "out_dir": str(tmp / "runs"), "seed": 0},
            "model": {"preset": "tiny", "seq_len": 32},
            "data": {"source": "stdlib", "max_bytes": 300_000, "eval_batches": 1, "eval_batch_size": 4},
            "diloco": {"rounds": 4, "local_steps": 3, "batch_size": 4, "overlap": "none", "compression": "none"},
            "comm": {"timeout_s": 60, "elastic": {"enabled": False}},
            "checkpoint": {"every_rounds": 1, "keep": 2}, "nodes": NODES}
    for key, value in changes.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "GEODILOCO_SECRET": SECRET, **extra}


def cli(*args: str, timeout: float = 300) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", *args], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def worker(config_path: Path, run_dir: Path, name: str, rank: int, world: int, port: int, *extra: str,
           secret: str = SECRET) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "geodiloco.runtime.train", "--config", str(config_path), "--run-dir", str(run_dir),
         *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                GEODILOCO_NODE=name, GEODILOCO_DEVICE="cpu", GEODILOCO_SECRET=secret))


def row(exit_code, detect_s, traceback: bool, kept: str, note: str = "") -> dict:
    return {"exit": exit_code, "detect_s": None if detect_s is None else round(detect_s, 1),
            "traceback": traceback, "kept": kept, "note": note}


def kept_rounds(run_dir: Path) -> str:
    latest = checkpoint.latest_round(run_dir)
    return "nothing" if latest is None else f"checkpoint of round {latest + 1} (verified)"


# ----- scenarios -------------------------------------------------------------------------------

def nan_site(tmp: Path) -> dict:
    path, port, run_dir = config(tmp, "nan"), free_port(), tmp / "nan"
    started = time.monotonic()
    processes = [worker(path, run_dir, name, rank, 3, port, *(["--set", "optim.inner.lr=1e30"] if name == "c" else []))
                 for rank, name in enumerate("abc")]
    outputs = [(process.wait(timeout=300), process.stdout.read()) for process in processes]
    events = [event for event in read_membership_events(run_dir) if event["event"] == "non_finite"]
    return row(max(code for code, _ in outputs), time.monotonic() - started, any("Traceback" in out for _, out in outputs),
               kept_rounds(run_dir), f"c left out in rounds {sorted({e['round'] + 1 for e in events})} "
               "(found in the round it went NaN); a and b finished")


def all_nan(tmp: Path) -> dict:
    code, out, took = cli("run", "--sites", "local", "--no-report", "--config", str(config(tmp, "allnan")),
                          "--run-dir", str(tmp / "allnan"), "--set", "optim.inner.lr=1e30")
    return row(code, took, "Traceback" in out, kept_rounds(tmp / "allnan"), "stops: no finite node")


def corrupt_checkpoint(tmp: Path) -> dict:
    path, run_dir = config(tmp, "corrupt"), tmp / "corrupt"
    code, out, _ = cli("run", "--sites", "local", "--no-report", "--config", str(path), "--run-dir", str(run_dir),
                       "--set", "diloco.rounds=2")
    newest = checkpoint.latest_round(run_dir)
    target = checkpoint.round_dir(run_dir, newest) / checkpoint.GLOBAL_FILE
    data = bytearray(target.read_bytes())
    offset = random.Random(0).randrange(len(data) // 2, len(data) - 4096)
    data[offset:offset + 4096] = random.Random(1).randbytes(4096)
    target.write_bytes(bytes(data))
    code, out, took = cli("run", "--resume", "--sites", "local", "--no-report", "--run-dir", str(run_dir),
                          "--set", "diloco.rounds=3")
    refused = "SHA-256" in out or "damaged" in out or "refus" in out
    return row(code, took, "Traceback" in out, kept_rounds(run_dir),
               "damaged round refused, resumed from the previous" if refused else "not reported")


def foreign_torch(tmp: Path) -> dict:
    path, port = config(tmp, "foreign"), free_port()
    stranger = worker(path, tmp / "stranger", "b", 1, 2, port, "--set", "comm.timeout_s=10", secret="x" * 32)
    two = [{"name": name, "gpus": ["RTX 3090"], "emulate": {"step_time_s": 0.05}} for name in "ab"]
    honest_path = config(tmp, "honest", nodes=two)
    honest = [worker(honest_path, tmp / "honest", name, rank, 2, port) for rank, name in enumerate("ab")]
    started = time.monotonic()
    stranger_code, stranger_out = stranger.wait(timeout=120), stranger.stdout.read()
    detect = time.monotonic() - started
    honest_codes = [process.wait(timeout=300) for process in honest]
    return row(stranger_code, detect, "Traceback" in stranger_out, kept_rounds(tmp / "honest"),
               f"stranger refused; the run exited {max(honest_codes)}")


def foreign_hivemind(tmp: Path) -> dict:
    """A peer holding another secret, and a forged member record from a bare hivemind DHT."""
    two = [{"name": name, "gpus": ["RTX 3090"], "emulate": {"step_time_s": 0.4}} for name in "ab"]
    path = config(tmp, "hm", nodes=two, diloco={"rounds": 10},
                  comm={"backend": "hivemind", "timeout_s": 60, "init_timeout_s": 60,
                        "hivemind": {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "heartbeat_ttl_s": 3.0,
                                     "start_wait_s": 20.0}})
    run = subprocess.Popen([sys.executable, "-m", "geodiloco.runtime.cli", "run", "--sites", "local", "--no-report",
                            "--config", str(path), "--run-dir", str(tmp / "hm")], cwd=ROOT, env=env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peers_file = tmp / "hm" / "hivemind_peers.txt"
    while not peers_file.is_file() and run.poll() is None:
        time.sleep(0.2)
    peers = ",".join(peers_file.read_text().split())
    started = time.monotonic()
    stranger = subprocess.run(
        [sys.executable, "-m", "geodiloco.runtime.train", "--config", str(path), "--run-dir", str(tmp / "hm_x")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=env(GEODILOCO_NODE="b", GEODILOCO_DEVICE="cpu", RANK="0", WORLD_SIZE="1", GEODILOCO_SECRET="y" * 32,
                GEODILOCO_INITIAL_PEERS=peers))
    detect = time.monotonic() - started
    run_out = run.communicate(timeout=300)[0]
    return row(stranger.returncode, detect, "Traceback" in stranger.stdout + stranger.stderr, kept_rounds(tmp / "hm"),
               f"stranger refused at bootstrap; the run exited {run.returncode}"
               f"{' (traceback)' if 'Traceback' in run_out else ''}")


def path_traversal(tmp: Path) -> dict:
    code, out, took = cli("run", "--sites", "local", "--config", str(config(tmp, "trav")), "--run-dir",
                          str(tmp / "trav"), "--set", "nodes.0.name=x/../../../pwn")
    # the error after its source ("x.yaml: ..." or "x.yaml (with --set ...): ..."): no temporary path in the note
    message = re.split(r"\.yaml(?: \(with [^)]*\))?: ", out.strip().splitlines()[-1])[-1] if out.strip() else ""
    return row(code, took, "Traceback" in out, "nothing written" if not (tmp / "trav").exists() else "run dir created",
               message[:110])


def kill(tmp: Path) -> dict:
    path, run_dir = config(tmp, "kill", diloco={"rounds": 30}), tmp / "kill"
    launcher = subprocess.Popen([sys.executable, "-m", "geodiloco.runtime.cli", "run", "--sites", "local",
                                 "--no-report", "--config", str(path), "--run-dir", str(run_dir)], cwd=ROOT, env=env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while (checkpoint.latest_round(run_dir) or -1) < 1 and launcher.poll() is None:
        time.sleep(0.1)
    children = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
    victim = next(int(pid) for pid in children if b"GEODILOCO_NODE=b\0" in Path(f"/proc/{pid}/environ").read_bytes())
    os.kill(victim, signal.SIGKILL)
    started = time.monotonic()
    _, err = launcher.communicate(timeout=120)
    detect = time.monotonic() - started
    code, out, _ = cli("run", "--resume", "--sites", "local", "--no-report", "--run-dir", str(run_dir),
                       "--set", "diloco.rounds=4")
    named = "node b failed (killed by SIGKILL)" in err
    return row(launcher.returncode, detect, "Traceback" in err, kept_rounds(run_dir),
               f"{'node and cause named' if named else 'node unnamed'}; resume exited {code}")


def frozen(tmp: Path) -> dict:
    path = config(tmp, "frozen", diloco={"rounds": 8},
                  comm={"timeout_s": 300, "elastic": {"enabled": True, "failure_timeout_s": 20.0}})
    code, out, _ = cli("run", "--sites", "local", "--no-report", "--config", str(path), "--run-dir",
                       str(tmp / "frozen"), "--drill", "freeze:c@2", timeout=600)
    from geodiloco.lab.drill import read_drill
    drill = read_drill(tmp / "frozen")
    noticed = [event for event in read_membership_events(tmp / "frozen") if event["event"] == "peer_failed"]
    detect = min(event["time"] for event in noticed) - drill[0]["time"] if drill and noticed else None
    return row(code, detect, "Traceback" in out, kept_rounds(tmp / "frozen"),
               "frozen site left out; the others finished" if code == 0 else "run failed")


BAD_INPUTS = [
    ["run", "--sites", "local", "--set", "nodes.0.gpus=[Z9000]"],
    ["run", "--sites", "local", "--set", "nodes.0.gpus=['0 x A30']"],
    ["run", "--sites", "local", "--set", "diloco.batch_size=1000000000"],
    ["run", "--sites", "local", "--set", "nodes.9.name=x"],
    ["run", "--sites", "local", "--set", "data.source=/nonexistent/corpus.txt"],
    ["run", "--sites", "local", "--set", "model.seq_len=abc"],
    ["run", "--resume", "--run-dir", "{tmp}/never"],
    ["run", "--config", "{tmp}/binary.yaml"],
    ["predict", "--gpu", "A30", "--batch-size", "10000000000000"],
    ["predict", "--gpu", "NoSuchGPU"],
    ["plan", "--config", "{tmp}/missing.yaml"],
    ["simulate", "--rounds", "1000000000"],
    ["report", "{tmp}/not_a_run"],
    ["sites", "frobnicate"],
    ["train", "--config", "{tmp}/missing.yaml"],
]


def bad_inputs(tmp: Path) -> dict:
    (tmp / "binary.yaml").write_bytes(bytes(range(128, 256)) * 8)
    results = []
    for args in BAD_INPUTS:
        code, out, _ = cli(*[arg.format(tmp=tmp) for arg in args], timeout=120)
        results.append({"args": " ".join(args), "exit": code, "traceback": "Traceback" in out,
                        "last_line": out.strip().splitlines()[-1].replace(str(tmp), "{tmp}")[:160] if out.strip() else ""})
    tracebacks = sum(item["traceback"] for item in results)
    exits = sorted({item["exit"] for item in results})
    return {**row(exits, None, tracebacks > 0, "nothing written",
                  f"{len(results)} bad inputs: {tracebacks} tracebacks, exit codes {exits}"), "cases": results}


SCENARIOS: dict[str, Callable[[Path], dict]] = {
    "nan_site": nan_site, "all_nan": all_nan, "corrupt_checkpoint": corrupt_checkpoint,
    "foreign_torch": foreign_torch, "foreign_hivemind": foreign_hivemind, "path_traversal": path_traversal,
    "kill": kill, "frozen": frozen, "bad_inputs": bad_inputs,
}


def write_table(results: dict[str, dict]) -> str:
    lines = ["| failure | before (as reported) | exit | handled after (s) | traceback | kept | note |",
             "|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        detect = "" if result["detect_s"] is None else f"{result['detect_s']:g}"
        lines.append(f"| {name} | {BEFORE[name]} | {result['exit']} | {detect} | "
                     f"{'yes' if result['traceback'] else 'no'} | {result['kept']} | {result['note']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated scenarios (default: all): " + ", ".join(SCENARIOS))
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    previous = RESULTS / "replay.json"
    results = json.loads(previous.read_text()) if args.only and previous.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="geodiloco-replay-") as tmp:
        for name in chosen:
            print(f"[replay] {name} ...", flush=True)
            started = time.monotonic()
            results[name] = SCENARIOS[name](Path(tmp) / name if Path(tmp, name).mkdir() is None else Path(tmp))
            print(f"[replay] {name}: {results[name]['note'] or results[name]['exit']} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = {name: results[name] for name in SCENARIOS if name in results}
    (RESULTS / "replay.json").write_text(json.dumps(results, indent=1) + "\n")
    table = write_table(results)
    (RESULTS / "replay.md").write_text(
        "# Reliability replays\n\nMeasured by `experiments/reliability/replay.py` on loopback (tiny model, virtual "
        "GPUs, real processes, real damage). 'handled after' is seconds from the damage to the refusal, detection or "
        "report (for inputs, a NaN learning rate and a damaged checkpoint: the whole command's wall time); 'before' is what the issue that asked for these guards "
        "reported, not re-measured.\n\n" + table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
