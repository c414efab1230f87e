"""Every node starts from the same model and keeps bitwise the same global copy.

DiLoCo keeps one global copy per node and moves them all by the same averaged pseudo-gradient, so
the copies stay equal only if they start equal and every node rounds its outer step the same way.
Neither holds across machines by itself:

- the initial weights come from the run's seed, but torch draws normal samples with vectorized
  kernels where the CPU has them (AVX2, AVX-512, NEON) and scalar ones where it has not, and torch
  releases may draw differently: the same seed then gives different weights;
- torch's fused outer SGD computes ``a + alpha * b`` as one fused multiply-add on such CPUs and as a
  multiply and an add elsewhere, so the copies part in their last bits every round.

At the start of a run each node's leader reports a digest of its initial global copy and a digest
of two outer steps on fixed values (``rounding_digest``) with its platform. Where the initial
digests differ, the first node's leader sends its initial parameters to the others (once, over the
leaders' group); where the rounding digests differ, every node takes ``portable_sgd_step``
(runtime/diloco.py), which rounds the same everywhere. Nodes that agree pay for neither.
"""
from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from geodiloco.runtime.diloco import outer_sgd

PROBE_ELEMENTS = 4099
"""Values in the rounding probe: the vectorized kernels' main loop and a scalar tail both run."""


@dataclass(frozen=True)
class StartReport:
    """One node leader's view of its starting point (hex digests, and where it computes)."""

    node: str
    params_digest: str
    rounding_digest: str
    platform: str


@dataclass(frozen=True)
class StartAgreement:
    """What the nodes do before their first round.

    ``source``: the node whose initial parameters the others take; ``receivers``: the nodes whose
    own initial parameters differ from it (empty: no transfer); ``portable``: every node takes the
    portable outer step, because their rounding digests differ."""

    source: str
    receivers: tuple[str, ...]
    portable: bool
    notices: tuple[str, ...]


def tensors_digest(tensors: Sequence[torch.Tensor]) -> str:
    """sha256 of the tensors' bytes in order (shapes and dtypes included)."""
    digest = hashlib.sha256()
    for tensor in tensors:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{tuple(tensor.shape)}:{flat.dtype}".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


def probe_values(salt: int) -> torch.Tensor:
    """Fixed fp32 values in [-0.5, 0.5], made from integers by IEEE division alone (the same on every machine)."""
    return torch.tensor([((index * 7919 + salt * 104729) % 1009 - 504) / 1009 for index in range(PROBE_ELEMENTS)],
                        dtype=torch.float32)


def rounding_digest(device: torch.device, lr: float, momentum: float, nesterov: bool) -> str:
    """Digest of two outer steps (``outer_sgd``, as the run builds it) on fixed values on ``device``: two
    nodes with the same digest round the outer step the same way."""
    param = probe_values(0).to(device)
    optimizer = outer_sgd([param], lr, momentum, nesterov)
    for salt in (1, 2):
        param.grad = probe_values(salt).to(device)
        optimizer.step()
    buffer = optimizer.state[param].get("momentum_buffer")
    return tensors_digest([param] + ([buffer] if buffer is not None else []))


def platform_line(device: torch.device) -> str:
    """Where this node computes its outer step, in words: the CPU's architecture and torch's kernel set,
    or the GPU, and the torch version."""
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        capability = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "unknown"
        where = f"{platform.machine()} with {capability} CPU kernels"
    return f"{where}, torch {torch.__version__}"


def agree(reports: Sequence[StartReport], fresh: bool, rounding_matters: bool = True) -> StartAgreement:
    """The plan from every leader's report (``reports`` in node order; the first is the source).
    ``fresh``: a new run (a resumed one loads its saved global state, so only the rounding matters).
    ``rounding_matters``: every node keeps its own global copy (synchronous DiLoCo; asynchronous mode
    keeps one, on the first node)."""
    if not reports:
        raise ValueError("no node leader reported its starting point")
    source = reports[0]
    receivers = tuple(report.node for report in reports[1:]
                      if fresh and report.params_digest != source.params_digest)
    portable = rounding_matters and len({report.rounding_digest for report in reports}) > 1
    notices = []
    if receivers:
        notices.append(
            f"node(s) {', '.join(receivers)} start from other initial parameters than node {source.node} "
            f"({_platforms(reports, receivers, source)}; one seed draws other weights on other CPU kernels or torch "
            f"releases): every node starts from node {source.node}'s, sent once over the leaders' group")
    if portable:
        groups = _rounding_groups(reports)
        notices.append(
            f"the nodes' outer steps round differently ({groups}): every node takes the portable outer step "
            "(separate multiplies and adds) so that all keep bitwise the same global model (docs/runtime.md)")
    return StartAgreement(source.node, receivers, portable, tuple(notices))


def _platforms(reports: Sequence[StartReport], receivers: Sequence[str], source: StartReport) -> str:
    named = [source] + [report for report in reports if report.node in receivers]
    return "; ".join(f"{report.node}: {report.platform}" for report in named)


def _rounding_groups(reports: Sequence[StartReport]) -> str:
    by_digest: dict[str, list[StartReport]] = {}
    for report in reports:
        by_digest.setdefault(report.rounding_digest, []).append(report)
    return "; ".join(f"{', '.join(report.node for report in group)}: {group[0].platform}"
                     for group in by_digest.values())


def own_report(node: str, global_params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer,
               fresh: bool) -> StartReport:
    """This leader's report (``global_params``: its fp32 global copy; ``optimizer``: the outer one)."""
    device = global_params[0].device if global_params else torch.device("cpu")
    defaults = optimizer.defaults
    params_digest = tensors_digest(global_params) if fresh else ""
    return StartReport(node, params_digest,
                       rounding_digest(device, defaults["lr"], defaults["momentum"], bool(defaults["nesterov"])),
                       platform_line(device))


def reports_of(items: Sequence[Optional[dict]]) -> list[StartReport]:
    """The leaders' reports from an exchange's items (non-leaders send None)."""
    return [StartReport(**item) for item in items if item is not None]
