"""Count the bytes the runtime's own model moves outside its GEMMs, op by op, beside the predictor's hand count.

The cold model prices the non-matmul kernels of a step by bytes per token
(``predictor.workload.elementwise_bytes_per_token``, written by hand from the
LLaMA block's eager ops) and the loss over the vocabulary apart
(``vocab_loss_bytes_per_token``). On the H100 those kernels carry most of a
GPU-bound bf16 step's predicted time, and those steps are predicted 13-25 %
too slow, so the hand count is the first suspect.

Truth here: the aten ops that a forward + backward of ``runtime.models.Decoder``
dispatches on the CPU, at fp32 or under bf16 autocast (the op graph CUDA
autocast runs, minus fusions). A TorchDispatchMode adds up the bytes of every
tensor each op reads and writes (views move none), by class: GEMMs, attention
(the scaled-dot-product op's inputs and outputs), the loss over the vocabulary
(every op between the output head's forward and its backward), the embedding,
and everything else. Counted at two batch sizes; the difference per token leaves
out what a step moves once (weight casts, parameter-sized reductions). An op is
charged its whole arguments, also where it reads a part (nll_loss reads one
logit per row), so the loss's count is an upper bound.

The steps run on fake tensors (shapes and dtypes, nothing computed); ``--real`` computes them.

Run:  .venv/bin/python experiments/predictor/count_elementwise_bytes.py   (seconds)
Writes experiments/results/predictor/elementwise_bytes.{md,json}.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from geodiloco.common.schema import ConfigError
from geodiloco.predictor.workload import ModelDims, elementwise_bytes_per_token, preset_dims, vocab_loss_bytes_per_token
from geodiloco.runtime.models import build_model

RESULTS = Path(__file__).resolve().parents[1] / "results" / "predictor"
MATMUL_OPS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "_scaled_mm"}
MOVES_NOTHING = {"detach", "alias", "lift_fresh", "_unsafe_view", "view", "_reshape_alias", "t", "transpose",
                 "permute", "expand", "slice", "select", "unsqueeze", "squeeze", "as_strided", "split", "unbind",
                 "chunk", "split_with_sizes", "empty", "empty_like", "zeros", "ones", "new_empty",
                 "new_zeros", "empty_strided", "ones_like", "zeros_like", "scalar_tensor", "arange"}
CLASSES = ("elementwise", "attention", "vocab_loss", "embedding", "matmul")


def op_class(name: str, in_loss: bool) -> str:
    """The class of an op; ``in_loss``: dispatched between the output head's forward and its backward."""
    if name in MATMUL_OPS:
        return "matmul"
    if in_loss:
        return "vocab_loss"
    if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
        return "attention"
    if name.startswith("embedding"):
        return "embedding"
    return "elementwise"


class ByteCounter(TorchDispatchMode):
    """Bytes read + written per op class (every tensor argument and result, in full; views move none)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_loss = False
        self.bytes_by_class: dict[str, float] = defaultdict(float)
        self.bytes_by_op: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        produced = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
        if not produced or getattr(func, "is_view", False) or name in MOVES_NOTHING:
            return result  # a metadata query or a view: no data moves
        tensors = [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)] + produced
        moved = float(sum(tensor.numel() * tensor.element_size() for tensor in tensors))
        kind = op_class(name, self.in_loss)
        self.bytes_by_class[kind] += moved
        self.bytes_by_op[f"{kind}:{name}"] += moved
        return result


def count_step(model: torch.nn.Module, dims: ModelDims, batch_size: int, seq_len: int,
               precision: str) -> ByteCounter:
    """Bytes of one forward + backward (the loss included, no optimizer step) at ``batch_size``."""
    generator = torch.Generator().manual_seed(batch_size)
    tokens = torch.randint(0, dims.vocab_size, (batch_size, seq_len + 1), generator=generator)
    model.zero_grad(set_to_none=True)
    counter = ByteCounter()

    def loss_starts(*_):
        counter.in_loss = True

    def loss_ends(*_):
        counter.in_loss = False

    hooks = [model.head.register_forward_hook(loss_starts), model.head.register_full_backward_pre_hook(loss_ends)]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    try:
        with counter:
            with autocast:
                loss = model(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
    finally:
        for hook in hooks:
            hook.remove()
    return counter


@dataclass
class Comparison:
    """Bytes per token, forward + backward: counted from the dispatched ops, and the predictor's hand count."""

    preset: str
    precision: str
    seq_len: int
    batch_sizes: tuple[int, int]
    counted: dict[str, float]
    predicted_elementwise: float
    predicted_vocab_loss: float
    top_ops: list[tuple[str, float]]

    @property
    def counted_elementwise(self) -> float:
        """What the hand count's elementwise term covers: the other kernels, attention's reads and writes, and the
        embedding."""
        return self.counted["elementwise"] + self.counted["attention"] + self.counted["embedding"]

    @property
    def elementwise_ratio(self) -> float:
        return self.predicted_elementwise / self.counted_elementwise

    @property
    def vocab_loss_ratio(self) -> float:
        return self.predicted_vocab_loss / self.counted["vocab_loss"]


def counted_steps(dims: ModelDims, batch_sizes: tuple[int, int], seq_len: int, precision: str,
                  fake: bool = True) -> tuple[ByteCounter, ByteCounter]:
    """The two steps' counts. ``fake``: on FakeTensorMode tensors (shapes and dtypes only, nothing computed:
    the same ops and bytes in a fraction of the time; bf16 matmuls are slow on CPUs without bf16 units)."""
    with FakeTensorMode() if fake else contextlib.nullcontext():
        model = build_model(dims, seed=0)
        return tuple(count_step(model, dims, batch, seq_len, precision) for batch in batch_sizes)


def compare(preset: str, precision: str, seq_len: int, batch_sizes: tuple[int, int], fake: bool = True) -> Comparison:
    dims = preset_dims(preset)
    small, large = counted_steps(dims, batch_sizes, seq_len, precision, fake)
    tokens = (batch_sizes[1] - batch_sizes[0]) * seq_len
    per_token = {kind: (large.bytes_by_class[kind] - small.bytes_by_class[kind]) / tokens for kind in CLASSES}
    by_op = {op: (large.bytes_by_op[op] - small.bytes_by_op.get(op, 0.0)) / tokens for op in large.bytes_by_op}
    top = sorted(((op, value) for op, value in by_op.items() if not op.startswith("matmul")),
                 key=lambda item: -item[1])[:12]
    return Comparison(preset, precision, seq_len, batch_sizes, per_token,
                      elementwise_bytes_per_token(dims, seq_len, precision),
                      vocab_loss_bytes_per_token(dims, precision), top)


def markdown(rows: list[Comparison]) -> str:
    lines = [
        "# Bytes per token outside the GEMMs: dispatched ops against the predictor's hand count",
        "",
        "Truth: the aten ops a forward + backward of the runtime's `Decoder` dispatches on the CPU "
        "(bf16: under CPU autocast), every tensor each op reads and writes added up by a TorchDispatchMode, "
        "views excluded; the difference between two batch sizes, per token. Each op is charged its whole "
        "arguments, also where it reads a part (nll_loss reads one logit per row), so the loss's count is an upper "
        "bound. The steps ran on fake tensors (shapes and dtypes; `--real` computes them, with the same counts). "
        "Predicted: "
        "`elementwise_bytes_per_token` (other kernels, attention's reads and writes, embedding) and "
        "`vocab_loss_bytes_per_token`. The counts see every op unfused, as eager CUDA runs them; they do not "
        "see caches. Command: `python experiments/predictor/count_elementwise_bytes.py`.",
        "",
        "| preset | precision | seq | counted elementwise B/token | predicted | predicted / counted | "
        "counted vocab loss B/token | predicted | predicted / counted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row.preset} | {row.precision} | {row.seq_len} | {row.counted_elementwise:,.0f} | "
                     f"{row.predicted_elementwise:,.0f} | {row.elementwise_ratio:.2f} | "
                     f"{row.counted['vocab_loss']:,.0f} | {row.predicted_vocab_loss:,.0f} | "
                     f"{row.vocab_loss_ratio:.2f} |")
    for row in rows:
        lines += ["", f"## {row.preset}, {row.precision}: the largest non-GEMM ops (bytes per token)", "",
                  "| class:op | bytes per token |", "|---|---|"]
        lines += [f"| {op} | {value:,.0f} |" for op, value in row.top_ops]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--presets", default="tiny,small,llama-150m", help="comma-separated model presets")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256)")
    parser.add_argument("--batch-sizes", default="1,2", help="the two batch sizes whose difference is counted")
    parser.add_argument("--real", action="store_true",
                        help="run the steps for real instead of on fake tensors (the same counts, minutes longer)")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    small, large = (int(value) for value in args.batch_sizes.split(","))
    if not 0 < small < large:
        parser.error(f"--batch-sizes: two increasing positive sizes, got {args.batch_sizes!r}")
    precisions = [name.strip() for name in args.precisions.split(",")]
    if set(precisions) - {"fp32", "bf16"}:
        parser.error(f"--precisions: fp32 and/or bf16, got {args.precisions!r}")
    torch.set_num_threads(1)
    presets = [name.strip() for name in args.presets.split(",")]
    for preset in presets:
        try:
            preset_dims(preset)
        except (ConfigError, ValueError) as err:
            parser.error(f"--presets: {err}")
    rows = []
    for preset in presets:
        for precision in precisions:
            rows.append(compare(preset, precision, args.seq_len, (small, large), fake=not args.real))
            print(f"  {preset} {precision}: predicted / counted elementwise {rows[-1].elementwise_ratio:.2f}, "
                  f"vocab loss {rows[-1].vocab_loss_ratio:.2f}", flush=True)
    table = markdown(rows)
    print(table)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "elementwise_bytes.md").write_text(table, encoding="utf-8")
        (RESULTS / "elementwise_bytes.json").write_text(json.dumps(
            [dict(asdict(row), counted_elementwise=row.counted_elementwise) for row in rows], indent=2) + "\n",
            encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
