"""What the outer step's host work costs at every sync: the shipped code against the plain formulas.

After each all-reduce a node's leader computes the next pseudo-gradient's inputs and takes the outer
step on the global copy, which lives on the CPU by default (``comm.outer_device: cpu``); under torchrun
with several ranks per site it runs on one thread (``OMP_NUM_THREADS=1``). That work is exposed sync:
the GPUs wait for it. Four parts, each timed on the real runtime code (truth: wall-clock time on this
machine; nothing predicted):

- pseudo-gradient: the torch backend's contribution (``OverlapSchedule.launch``: the difference to the
  anchor, the anchor moved, the finite check of what is sent) of a bf16 local model, as a GPU node sends
  it; or the hivemind backend's ``OuterState.pseudo_gradient`` (``--backends``);
- outer step: ``OuterState.apply`` (SGD with Nesterov momentum); on the torch backend
  ``OverlapSchedule.land``, which also moves the local model (its load column is then 0);
- finite check: ``finite_guard.all_finite`` over the global parameters;
- load: ``OuterState.load_into`` the local model.

"plain" is the same work as first written: ``torch.cat`` of per-tensor differences and a finite mask of
what is sent, torch's default SGD (no fused kernel), the local model moved through temporaries, and
``isfinite(...).all()`` per tensor. The two are interleaved repeat by repeat,
so machine noise hits both alike; each figure is the best of the repeats, and the ratio is plain /
shipped from the same run.

Usage: python experiments/runtime/bench_outer_step.py [--params 25e6 100e6] [--threads 1 2] [--repeats 5]
       [--backends torch hivemind]
Writes experiments/results/runtime/outer_step.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from torch import nn

from geodiloco.runtime.diloco import OuterState
from geodiloco.runtime.finite_guard import all_finite
from geodiloco.runtime.sync.overlap import OverlapSchedule, SyncJob

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results" / "runtime"
PARTS = ("pseudo_gradient_s", "outer_step_s", "finite_check_s", "load_s")
TENSORS = 8
"""Parameter tensors the model is split into (the count barely matters for tensors this large)."""


def plain_launch(schedule: OverlapSchedule, fragment: int, weight: float) -> None:
    """``OverlapSchedule.launch`` as first written."""
    pieces = []
    for index in schedule.fragments[fragment]:
        local = schedule.params[index].detach().to(schedule.anchors[index].device, torch.float32)
        pieces.append((schedule.anchors[index] - local).view(-1))
        schedule.anchors[index].copy_(local)
    contribution = torch.cat(pieces).mul_(weight)
    if weight == 0.0 or not bool(torch.isfinite(contribution).all()):
        contribution.zero_()
    schedule._submit(SyncJob(fragment, contribution, schedule.feedback[fragment].copy()))


@torch.no_grad()
def plain_land(schedule: OverlapSchedule, fragment: int) -> None:
    """``OverlapSchedule.land`` as first written (the outer step, then the local model moved)."""
    job = schedule.in_flight.pop(fragment)
    indices = schedule.fragments[fragment]
    schedule.outer.apply(job.result, indices)
    for index in indices:
        global_param, local = schedule.outer.global_params[index], schedule.params[index]
        moved = global_param + (local.detach().to(global_param.device, torch.float32) - schedule.anchors[index])
        local.copy_(moved.to(local.device, local.dtype))
        schedule.anchors[index].copy_(global_param)


def plain_pseudo_gradient(outer: OuterState, local: nn.Module) -> torch.Tensor:
    return torch.cat([(global_param - param.detach().to(global_param.device, torch.float32)).view(-1)
                      for global_param, param in zip(outer.global_params, local.parameters())])




def plain_all_finite(tensors: list[torch.Tensor]) -> bool:
    return bool(torch.stack([torch.isfinite(tensor).all() for tensor in tensors]).all())


def build(params: int, plain: bool) -> tuple[OuterState, nn.Module, OverlapSchedule]:
    local = nn.ParameterList([nn.Parameter(torch.randn(params // TENSORS)) for _ in range(TENSORS)])
    outer = OuterState(local, lr=0.7, momentum=0.9, nesterov=True)
    if plain:
        outer.optimizer = torch.optim.SGD(outer.global_params, lr=0.7, momentum=0.9, nesterov=True)
    local = local.to(torch.bfloat16)
    with torch.no_grad():
        for param in local.parameters():
            param.add_(0.01)
    schedule = OverlapSchedule("none", list(local.parameters()), outer, [list(range(TENSORS))],
                               reducer=lambda contribution, feedback: contribution, run_in_background=False)
    return outer, local, schedule


def time_once(outer: OuterState, local: nn.Module, schedule: OverlapSchedule, plain: bool,
              hivemind: bool) -> dict[str, float]:
    marks = [time.perf_counter()]
    if hivemind:
        flat = plain_pseudo_gradient(outer, local) if plain else outer.pseudo_gradient(local)
        marks.append(time.perf_counter())
        outer.apply(flat)
    else:  # the no-op reducer hands the contribution back as the sum; landing it steps and moves the model
        (plain_launch if plain else OverlapSchedule.launch)(schedule, 0, 0.5)
        marks.append(time.perf_counter())
        plain_land(schedule, 0) if plain else schedule.land(0)
    marks.append(time.perf_counter())
    finite = plain_all_finite(outer.global_params) if plain else all_finite(outer.global_params)
    marks.append(time.perf_counter())
    if hivemind:
        outer.load_into(local)
    marks.append(time.perf_counter())
    assert finite
    return {part: end - start for part, start, end in zip(PARTS, marks, marks[1:])}


def measure(params: int, threads: int, repeats: int, hivemind: bool) -> dict:
    torch.set_num_threads(threads)
    states = {plain: build(params, plain) for plain in (True, False)}
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(repeats + 1):  # the first of each is a warm-up
        for plain in (True, False):
            runs[plain].append(time_once(*states[plain], plain, hivemind))
    row = {"params": params, "threads": threads, "repeats": repeats, "backend": "hivemind" if hivemind else "torch"}
    for plain, label in ((True, "plain"), (False, "shipped")):
        timed = runs[plain][1:]
        row[label] = {part: min(run[part] for run in timed) for part in PARTS}
        row[label]["total_s"] = min(sum(run.values()) for run in timed)
    row["ratio"] = row["plain"]["total_s"] / row["shipped"]["total_s"]
    return row


def write(rows: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "outer_step.json").write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n")
    lines = ["# The outer step's host work at every sync: shipped code against the plain formulas", "",
             "Truth: wall-clock time of the runtime's own functions on this machine "
             f"({machine()}); `python experiments/runtime/bench_outer_step.py`. A bf16 local model (a GPU node's), "
             "fp32 global copy on the CPU; best of the repeats, plain and shipped interleaved.", "",
             "| backend | parameters | threads | | pseudo-gradient s | outer step s | finite check s | load s | total s | plain / shipped |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for label in ("plain", "shipped"):
            timed = row[label]
            ratio = f"**{row['ratio']:.2f}x**" if label == "shipped" else ""
            lines.append(f"| {row['backend']} | {row['params'] / 1e6:.0f} M | {row['threads']} | {label} | "
                         + " | ".join(f"{timed[part]:.3f}" for part in PARTS)
                         + f" | {timed['total_s']:.3f} | {ratio} |")
    lines += ["", "On the torch backend the outer step column is `OverlapSchedule.land`, which also loads the "
              "model (its load column is 0). The seconds grow linearly with the parameter count: a 1 B-parameter model takes about ten "
              "times the 100 M row at every sync."]
    (RESULTS / "outer_step.md").write_text("\n".join(lines) + "\n")


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, torch {torch.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=float, nargs="+", default=[25e6, 100e6],
                        help="parameter counts of the model (default: 25e6 100e6)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="torch intra-op threads (default: 1 2; torchrun with several ranks per site gives 1)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of each, after a warm-up (default 5)")
    parser.add_argument("--backends", nargs="+", choices=["torch", "hivemind"], default=["torch", "hivemind"],
                        help="whose pseudo-gradient to time (default: both)")
    args = parser.parse_args()
    if args.repeats < 1 or any(count < 1 for count in args.threads) or any(count < TENSORS for count in args.params):
        parser.error(f"--repeats and --threads must be at least 1 and --params at least {TENSORS}")
    rows = []
    for backend in args.backends:
        for params in args.params:
            for threads in args.threads:
                row = measure(int(params), threads, args.repeats, hivemind=backend == "hivemind")
                rows.append(row)
                print(f"{backend}, {row['params'] / 1e6:.0f} M parameters, {threads} thread(s): plain "
                      f"{row['plain']['total_s']:.3f} s, shipped {row['shipped']['total_s']:.3f} s "
                      f"({row['ratio']:.2f}x)", flush=True)
    write(rows)
    print(f"wrote {RESULTS / 'outer_step.md'}")


if __name__ == "__main__":
    main()
