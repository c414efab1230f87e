#!/usr/bin/env python3
"""Cold accuracy of the step-time predictor on measured GPU steps, with the current predictor code.

    python experiments/gpu/cold_accuracy.py DIR [DIR ...]

Each DIR holds what one machine measured: validate.py sweeps (``*/<gpu>.json``) and, when the
probe ran there, ``probe_row.yaml``. Every measured point (median of its timed steps) is
predicted twice from its GPU's datasheet row: with the table's constant host cost per op, and
with the host costs the probe measured on that machine (``host_op_us``,
``host_optimizer_tensor_us``). The predictions are recomputed here, so they follow the
predictor's code, not the one that ran the sweep. Writes DIR/cold_accuracy.md for each DIR.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Optional

import yaml

from geodiloco.predictor.specs import GpuSpec, lookup_gpu
from geodiloco.predictor.workload import resolve_dims

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_sweep import spec_step_ms  # noqa: E402


def probed_host(folder: Path) -> Optional[dict]:
    path = folder / "probe_row.yaml"
    if not path.exists():
        return None
    row = yaml.safe_load(path.read_text())["gpus"][0]
    if row.get("host_op_us") is None:
        return None
    return {"host_op_us": row["host_op_us"], "host_optimizer_tensor_us": row["host_optimizer_tensor_us"]}


def predicted_ms(spec: GpuSpec, sweep: dict, batch_size: int) -> float:
    return spec_step_ms(spec, resolve_dims(sweep["preset"]), sweep["seq_len"], sweep["precision"], batch_size)


def folder_rows(folder: Path) -> tuple[list[dict], Optional[dict], str]:
    host = probed_host(folder)
    rows, gpu = [], ""
    for path in sorted(folder.glob("*/*.json")):
        data = json.loads(path.read_text())
        if not data.get("sweeps"):
            continue
        gpu = data["measured_with"]["gpu_0"]
        table_row = lookup_gpu(data["detection"]["datasheet"])
        with_probe = dataclasses.replace(table_row, **host) if host else None
        for sweep in data["sweeps"]:
            for point in sweep["points"]:
                if not point["step_times_s"]:
                    continue
                measured_ms = statistics.median(point["step_times_s"]) * 1e3
                table_ms = predicted_ms(table_row, sweep, point["batch_size"])
                probe_ms = predicted_ms(with_probe, sweep, point["batch_size"]) if with_probe else None
                rows.append({"preset": sweep["preset"], "precision": sweep["precision"], "seq_len": sweep["seq_len"],
                             "batch_size": point["batch_size"], "measured_ms": measured_ms, "table_ms": table_ms,
                             "table_error": table_ms / measured_ms - 1, "probe_ms": probe_ms,
                             "probe_error": probe_ms / measured_ms - 1 if probe_ms else None})
    return rows, host, gpu


def summary(rows: list[dict], key: str) -> str:
    errors = [abs(row[key]) for row in rows if row[key] is not None]
    if not errors:
        return "-"
    return f"median {statistics.median(errors):.1%}, worst {max(errors):.1%} ({len(errors)} points)"


def write(folder: Path) -> str:
    """Writes FOLDER/cold_accuracy.md and returns its text; "" (and writes nothing) without measured points."""
    rows, host, gpu = folder_rows(folder)
    if not rows:
        return ""
    host_text = (f"{host['host_op_us']:.1f} µs per chain op, {host['host_optimizer_tensor_us']:.1f} µs per optimizer "
                 "tensor" if host else "no probe with host costs in this folder")
    lines = [f"# Cold accuracy on measured steps: {folder.name}", "",
             f"Truth: training steps measured on one {gpu} (validate.py sweeps in this folder; median of 10 steps). "
             "Predictions recomputed by `python experiments/gpu/cold_accuracy.py` with the current predictor code.",
             f"Probe on the same machine: {host_text}.", "",
             "| preset | precision | batch | measured ms | table host cost ms | error | probed host cost ms | error |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        probe = (f"{row['probe_ms']:.2f} | {row['probe_error']:+.1%}" if row["probe_ms"] is not None else "- | -")
        lines.append(f"| {row['preset']} | {row['precision']} | {row['batch_size']} | {row['measured_ms']:.2f} | "
                     f"{row['table_ms']:.2f} | {row['table_error']:+.1%} | {probe} |")
    lines += ["", f"- table host cost: {summary(rows, 'table_error')}",
              f"- probed host cost: {summary(rows, 'probe_error')}", ""]
    text = "\n".join(lines)
    (folder / "cold_accuracy.md").write_text(text, encoding="utf-8")
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, metavar="DIR",
                        help="a GPU check's output folder (experiments/gpu/run_all.sh OUT), holding */<gpu>.json")
    folders = parser.parse_args(argv).folders
    for folder in folders:
        if not folder.is_dir():
            parser.error(f"{folder}: no such folder (give the OUT folder of experiments/gpu/run_all.sh)")
    for folder in folders:
        text = write(folder)
        print(text if text else f"{folder}: no measured sweep points (validate.py */<gpu>.json); nothing written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
