"""Non-finite guard: a node whose model went NaN/inf is left out of the outer average, and a
global model that is not finite is never applied or saved.

A node reports in the readiness exchange whether its local parameters are finite (the global
ones always are, so this is whether its pseudo-gradient is). The torch backend weights such a
node 0 in the average (the others' weights are renormalized when the average is weighted after
the exchange; a streaming fragment sent earlier carries zeros for it instead), reloads the
global state on it and clears its inner optimizer, and the run goes on. A round in which every
node is non-finite, or a global model that is not finite after an outer step, stops the run
with ``NonFiniteModel``: nothing of that round is saved, the last good checkpoint stays.
"""
from __future__ import annotations

from typing import Iterable

import torch


class NonFiniteModel(RuntimeError):
    """The run cannot go on without training on NaN or inf values."""


@torch.no_grad()
def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every element is finite, with one host sync for the whole list (it runs every round, on
    the GPU too). A NaN or an infinity makes any sum it is in non-finite, so a finite sum of the sums
    proves every element finite in one read of the tensors (about 20x faster on a CPU thread than
    ``isfinite(...).all()``, which writes a mask); a non-finite sum (a NaN, an infinity, or finite values
    whose sum overflows) is settled element by element."""
    floats = [tensor for tensor in tensors if tensor.is_floating_point()]
    if not floats:
        return True
    if bool(torch.isfinite(torch.stack([tensor.sum(dtype=torch.float32) for tensor in floats]).sum())):
        return True
    return bool(torch.stack([torch.isfinite(tensor).all() for tensor in floats]).all())


def non_finite_nodes(stats_by_node: dict[str, dict]) -> list[str]:
    """Nodes that reported a non-finite model this round (stats without the flag count as finite)."""
    return [name for name, item in stats_by_node.items() if not item.get("finite", True)]


def check_some_node_finite(stats_by_node: dict[str, dict], round_idx: int) -> None:
    bad = non_finite_nodes(stats_by_node)
    if bad and len(bad) == len(stats_by_node):
        raise NonFiniteModel(f"every node's model is non-finite (NaN or inf) in round {round_idx + 1} "
                             f"({', '.join(bad)}): lower optim.inner.lr or check the data; nothing of this round "
                             "is saved")


def check_global_finite(global_params: Iterable[torch.Tensor], round_idx: int) -> None:
    if not all_finite(global_params):
        raise NonFiniteModel(f"the global model is non-finite (NaN or inf) after the outer step of round "
                             f"{round_idx + 1}: lower optim.outer.lr or optim.inner.lr; nothing of this round is "
                             "saved")
