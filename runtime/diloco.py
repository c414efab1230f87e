"""DiLoCo's outer loop: global copy, pseudo-gradients, weighted average, outer Nesterov step.

Each round every node starts from the global parameters, runs its inner steps,
and sends ``weight_i * (global - local_i)``; the sum over nodes is the averaged
pseudo-gradient, applied by SGD with Nesterov momentum to the global copy
(fp32, on CPU by default).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import nn

def outer_weights(mode: str, tokens: Sequence[int], local_steps: Sequence[int],
                  batch_sizes: Sequence[int]) -> list[float]:
    """Per-node weights w_i of the outer average sum_i w_i * delta_i.

    - ``uniform``: 1/N. Right when every node does the same work on i.i.d. shards.
    - ``tokens``: tokens_i / sum(tokens). Right for i.i.d. shards with unequal work: a node
      that saw more data moves the average more, like one big data-parallel batch.
    - ``normalized`` (FedNova): w_i = p_i * tau_eff / H_i with p_i = B_i / sum(B) and
      tau_eff = sum_i p_i * H_i. Each node's pseudo-gradient counts per step, so nodes that ran
      more steps do not pull the average toward their own (site-specific) data.
    """
    num_nodes = len(tokens)
    if mode == "uniform":
        return [1.0 / num_nodes] * num_nodes
    if mode == "tokens":
        total_tokens = sum(tokens)
        if total_tokens <= 0:
            return [1.0 / num_nodes] * num_nodes
        return [count / total_tokens for count in tokens]
    if mode == "normalized":
        total_batch = sum(batch_sizes)
        shares = [batch / total_batch for batch in batch_sizes]
        effective_steps = sum(share * steps for share, steps in zip(shares, local_steps))
        return [share * effective_steps / steps if steps > 0 else 0.0
                for share, steps in zip(shares, local_steps)]
    raise ValueError(f"unknown weighting {mode!r}; use uniform, tokens or normalized")


def group_average_terms(mode: str, tokens: int, local_steps: int, batch_size: int) -> tuple[float, float]:
    """(input scale, averaging weight) of one node's pseudo-gradient for a backend that forms its
    averaging group on the fly (hivemind) and returns sum_i weight_i * scale_i * delta_i / sum_i weight_i.

    Neither term depends on which other nodes are in the group, so nodes need not agree on the
    group beforehand; ``group_average_scale`` over the group that formed then gives exactly
    ``outer_weights`` for that group. The weight is kept above zero because the backend divides by
    the weights' sum.
    """
    if mode == "uniform":
        return 1.0, 1.0
    if mode == "tokens":
        return 1.0, max(float(tokens), 1e-12)
    if mode == "normalized":
        return (1.0 / local_steps if local_steps > 0 else 0.0), max(float(batch_size), 1e-12)
    raise ValueError(f"unknown weighting {mode!r}; use uniform, tokens or normalized")


def group_average_scale(mode: str, local_steps: Sequence[int], batch_sizes: Sequence[int]) -> float:
    """Factor that turns the group mean of ``group_average_terms`` into sum_i w_i * delta_i:
    FedNova's effective step count tau_eff = sum_i p_i * H_i for ``normalized``, 1 otherwise."""
    if mode != "normalized":
        return 1.0
    total_batch = sum(batch_sizes)
    return sum(batch * steps for batch, steps in zip(batch_sizes, local_steps)) / total_batch


def outer_sgd(params: list[torch.Tensor], lr: float, momentum: float, nesterov: bool) -> torch.optim.SGD:
    """torch's SGD (Nesterov momentum) for the outer step, with its fused kernel where this torch build
    has one for the parameters' device: one pass over each tensor instead of four, which matters
    because the outer step runs at every sync, after the all-reduce, often on one CPU thread
    (experiments/runtime/bench_outer_step.py). Builds without it (CPU before torch 2.4) take the default."""
    options = dict(lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0)
    try:
        return torch.optim.SGD(params, fused=True, **options)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.SGD(params, **options)


@torch.no_grad()
def portable_sgd_step(optimizer: torch.optim.SGD) -> None:
    """torch's SGD step (momentum, optionally Nesterov; no dampening or weight decay, as ``outer_sgd``
    builds it) written as separate multiplies and adds, so that it rounds the same on every machine.

    Why: the fused and vectorized kernels compute ``a + alpha * b`` as one fused multiply-add where
    the CPU has one (AVX2, AVX-512, NEON) and as a multiply then an add where it has not, so nodes
    whose CPUs (or torch builds) differ would end a round with global copies that differ in their
    last bits, and drift further every round. One multiply or one add is rounded by IEEE 754 alone,
    whatever the kernel. The update is ``m = momentum m + g``, then ``p -= (lr momentum) m + lr g``
    (Nesterov) or ``p -= lr m``, through one scratch buffer. The momentum buffers stay in
    ``optimizer.state`` under torch's key, so checkpoints of either step load into the other."""
    largest = max((param.numel() for group in optimizer.param_groups for param in group["params"]
                   if param.grad is not None), default=0)
    scratch_by_device: dict[torch.device, torch.Tensor] = {}
    for group in optimizer.param_groups:
        if group.get("dampening", 0) or group.get("weight_decay", 0):
            raise ValueError("portable_sgd_step takes no dampening or weight decay (outer_sgd sets neither)")
        lr, momentum, nesterov = group["lr"], group["momentum"], group["nesterov"]
        for param in group["params"]:
            if param.grad is None:
                continue
            grad = param.grad
            if param.device not in scratch_by_device:
                scratch_by_device[param.device] = torch.empty(largest, dtype=param.dtype, device=param.device)
            scratch = scratch_by_device[param.device][:param.numel()].view_as(param)
            if momentum == 0:
                param.sub_(torch.mul(grad, lr, out=scratch))
                continue
            state = optimizer.state[param]
            buffer = state.get("momentum_buffer")
            if buffer is None:
                buffer = state["momentum_buffer"] = grad.detach().clone()
            else:
                buffer.mul_(momentum).add_(grad)
            if nesterov:
                param.sub_(torch.mul(buffer, lr * momentum, out=scratch))
                param.sub_(torch.mul(grad, lr, out=scratch))
            else:
                param.sub_(torch.mul(buffer, lr, out=scratch))


class OuterState:
    """Global parameters and the outer optimizer, kept in fp32 on ``device``."""

    def __init__(self, model: nn.Module, lr: float, momentum: float, nesterov: bool,
                 device: str | torch.device = "cpu") -> None:
        self.global_params = [param.detach().to(device=device, dtype=torch.float32).clone()
                              for param in model.parameters()]
        self.optimizer = outer_sgd(self.global_params, lr, momentum, nesterov)
        self.fused = bool(self.optimizer.defaults.get("fused"))
        self.portable = False
        """Take ``portable_sgd_step`` instead of torch's kernels: set when the nodes' kernels round differently
        (runtime/sync/start_model.py)."""
        self.numel = sum(param.numel() for param in self.global_params)

    @torch.no_grad()
    def pseudo_gradient(self, model: nn.Module | Sequence[torch.Tensor], weight: float = 1.0) -> torch.Tensor:
        """Flat ``weight * (global - local)`` in fp32 on the global copy's device (``model``: a module
        or its parameter list). Each difference is written in place into the flat tensor: an fp32 local
        parameter is subtracted straight, any other is first copied (and widened) into its slot, which is
        faster than torch's mixed-dtype subtraction."""
        params = model.parameters() if isinstance(model, nn.Module) else model
        device = self.global_params[0].device if self.global_params else torch.device("cpu")
        flat = torch.empty(self.numel, dtype=torch.float32, device=device)
        offset = 0
        for global_param, local in zip(self.global_params, params):
            count = global_param.numel()
            slot, local = flat[offset:offset + count], local.detach().reshape(-1)
            if local.dtype == torch.float32 and local.device == device:
                torch.sub(global_param.reshape(-1), local, out=slot)
            else:
                slot.copy_(local)
                torch.sub(global_param.reshape(-1), slot, out=slot)
            offset += count
        if weight != 1.0:
            flat.mul_(weight)
        return flat

    def apply(self, averaged: torch.Tensor, indices: Optional[Sequence[int]] = None) -> None:
        """Outer step with the averaged pseudo-gradient as the gradient of the global copy.

        ``indices``: the parameters ``averaged`` covers (concatenated in that order; default all).
        Parameters outside them keep their values and momentum."""
        indices = range(len(self.global_params)) if indices is None else indices
        offset = 0
        for index in indices:
            global_param = self.global_params[index]
            count = global_param.numel()
            global_param.grad = averaged[offset:offset + count].view_as(global_param).to(
                global_param.device, torch.float32)
            offset += count
        if self.portable:
            portable_sgd_step(self.optimizer)
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def subtract(self, summed: torch.Tensor, indices: Sequence[int]) -> None:
        """global -= summed over ``indices`` (no optimizer step: with weights summing to 1 this
        is the weighted average of the nodes' parameters)."""
        offset = 0
        for index in indices:
            global_param = self.global_params[index]
            count = global_param.numel()
            global_param.sub_(summed[offset:offset + count].view_as(global_param).to(global_param.device))
            offset += count

    @torch.no_grad()
    def load_into(self, model: nn.Module | Sequence[torch.Tensor]) -> None:
        """Copy the global parameters into the local model or parameter list (start of a round)."""
        params = model.parameters() if isinstance(model, nn.Module) else model
        for global_param, local in zip(self.global_params, params):
            local.copy_(global_param.to(local.device, local.dtype))

    def state_dict(self, copy: bool = True) -> dict:
        """The global parameters (copies, unless ``copy`` is False: for a caller that snapshots them itself)
        and the outer optimizer's state."""
        params = [param.clone() for param in self.global_params] if copy else list(self.global_params)
        return {"global_params": params, "optimizer": self.optimizer.state_dict()}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        for param, saved in zip(self.global_params, state["global_params"]):
            param.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # a state saved without the fused kernel keeps its momentum
            group["fused"] = self.fused
            if self.fused:
                group["foreach"] = False


class DelayedNesterov:
    """The outer optimizer of asynchronous DiLoCo: delayed Nesterov momentum (Liu et al. 2024).

    Every received pseudo-gradient ``g`` (already weighted: one node's share of an outer average)
    moves the global copy by a plain step ``-lr * g`` and is added to a buffer. Every ``period``-th
    one, the momentum takes the buffer (the sum of the last ``period`` pseudo-gradients, about one
    average over the nodes): ``m = momentum * m + buffer``, and the global copy takes the momentum
    part of the step, ``-lr * momentum * m`` (Nesterov; heavy ball: the momentum before the update).
    Over ``period`` updates that were not stale this is exactly synchronous DiLoCo's Nesterov step
    on their sum, which ``tests/test_runtime_async.py`` checks against ``torch.optim.SGD``; stale
    ones move the model at once without being amplified by the momentum.

    The momentum buffers live in ``outer.optimizer``'s state (so ``OuterState.state_dict`` holds
    them); the pending buffer and the count are in ``state_dict``."""

    def __init__(self, outer: OuterState, lr: float, momentum: float, nesterov: bool, period: int) -> None:
        if period < 1:
            raise ValueError(f"delayed Nesterov period must be >= 1, got {period}")
        self.outer = outer
        self.lr, self.momentum, self.nesterov, self.period = lr, momentum, nesterov, period
        self.pending = [torch.zeros_like(param) for param in outer.global_params]
        self.received = 0
        self.numel = outer.numel

    @torch.no_grad()
    def apply(self, pseudo_gradient: torch.Tensor) -> None:
        """Take one node's weighted flat pseudo-gradient (fp32, global parameter order)."""
        offset = 0
        for param, pending in zip(self.outer.global_params, self.pending):
            count = param.numel()
            piece = pseudo_gradient[offset:offset + count].view_as(param).to(param.device, torch.float32)
            param.sub_(piece, alpha=self.lr)
            pending.add_(piece)
            offset += count
        self.received += 1
        if self.received % self.period == 0:
            self._momentum_step()

    def _momentum_step(self) -> None:
        for param, pending in zip(self.outer.global_params, self.pending):
            if self.momentum > 0:
                state = self.outer.optimizer.state[param]
                buffer = state.get("momentum_buffer")
                if buffer is None:
                    buffer = state["momentum_buffer"] = torch.zeros_like(param)
                before = None if self.nesterov else buffer.clone()
                buffer.mul_(self.momentum).add_(pending)
                param.sub_(buffer if self.nesterov else before, alpha=self.lr * self.momentum)
            pending.zero_()

    def state_dict(self) -> dict:
        return {"received": self.received, "pending": [tensor.clone() for tensor in self.pending]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        self.received = int(state.get("received", 0))
        for pending, saved in zip(self.pending, state.get("pending", [])):
            pending.copy_(saved)


def inner_lr(base_lr: float, progress_steps: float, total_steps: float, warmup_steps: int,
             min_lr_ratio: float) -> float:
    """Linear warmup then cosine decay, on a progress axis shared by all nodes.

    ``progress_steps`` counts baseline-H steps: a node running H_i steps per round
    advances H_base / H_i per step, so every node sits at the same point of the
    schedule at the same point of the round whatever its own step count.
    """
    if warmup_steps > 0 and progress_steps < warmup_steps:
        return base_lr * min(1.0, (progress_steps + 1) / warmup_steps)  # a fractional progress may pass the end
    decay_span = max(1.0, total_steps - warmup_steps)
    fraction = min(1.0, max(0.0, (progress_steps - warmup_steps) / decay_span))
    cosine = 0.5 * (1.0 + math.cos(math.pi * fraction))
    return base_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)


def build_inner_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float,
                          betas: tuple[float, float]) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, weight_decay=weight_decay)
    decay = [param for param in model.parameters() if param.dim() >= 2]
    no_decay = [param for param in model.parameters() if param.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)
