"""One inner step's batch split across micro-batches and the node's ranks (GPUs, DDP).

DDP averages gradients over the node's R ranks, so for the step's gradient to be
the gradient of the mean loss over all B samples of the node's batch, each rank's
loss must be (R / B) x the sum of its own samples' losses, whatever the size of its
share. And every rank must run the same number of forward/backward passes, each
with at least one sample: a rank that skips a backward leaves its peers waiting in
DDP's all-reduce until the collective timeout.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from geodiloco.runtime.precision import TrainingPrecision

OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
Result = TypeVar("Result")

BatchSource = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
"""Samples -> the node's next (inputs, targets), each (samples, seq_len); the same on every rank."""


@dataclass
class StepSamples:
    """What one inner step trained on the whole node: ``mean_loss`` over its samples
    (nats per token) and ``samples`` (the effective batch, at least the planned one)."""

    mean_loss: float
    samples: int


def micro_batch_sizes(batch_size: int, micro_batch_size: int, ranks: int) -> list[int]:
    """Node samples of each micro-batch of one inner step.

    ``micro_batch_size`` is the node's planned micro-batch, i.e. at most
    ceil(micro_batch_size / ranks) samples per rank at once (the memory bound kept
    here). The batch is split into the fewest micro-batches that respect that bound,
    of near-equal sizes (differing by at most one sample). A micro-batch smaller than
    ``ranks`` is raised to ``ranks`` so every rank does a backward on at least one
    sample each micro-step; the sum of the sizes is then larger than ``batch_size``.
    That happens only when the batch is smaller than the ranks, or when the plan allows
    one sample per rank at once and ``ranks`` does not divide the batch; the growth is
    then below ``ranks`` samples.
    """
    if batch_size < 1 or micro_batch_size < 1 or ranks < 1:
        raise ValueError(f"batch_size ({batch_size}), micro_batch_size ({micro_batch_size}) and ranks ({ranks}) "
                         "must all be at least 1")
    per_rank_cap = -(-micro_batch_size // ranks)
    count = -(-batch_size // (ranks * per_rank_cap))
    base, extra = divmod(batch_size, count)
    return [max(base + (index < extra), ranks) for index in range(count)]


def rank_share(inputs: torch.Tensor, targets: torch.Tensor, local_rank: int,
               ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's samples of a node micro-batch: every ``ranks``-th from ``local_rank``."""
    return inputs[local_rank::ranks], targets[local_rank::ranks]


def rank_loss_scale(rank_samples: int, ranks: int, batch_samples: int) -> float:
    """Factor on a rank's mean loss over its ``rank_samples`` samples such that DDP's average
    over ``ranks`` ranks yields the mean over all ``batch_samples`` samples of the step:
    (R / B) x (sum of the rank's sample losses) = (R x n / B) x (its mean)."""
    return ranks * rank_samples / batch_samples


def accumulate_gradients(train_model: torch.nn.Module, next_batch: BatchSource, batch_size: int,
                         micro_batch_size: int, local_rank: int, ranks: int, device: torch.device,
                         node_group: Optional[object] = None,
                         precision: Optional[TrainingPrecision] = None) -> StepSamples:
    """Forward/backward every micro-batch of one inner step; leaves in the parameters'
    ``.grad`` the gradient of the mean loss over the step's samples (DDP syncs it on the last
    micro-batch only). ``train_model(inputs, targets)`` returns the mean loss over its
    samples' tokens (every sample has the same number of tokens). With ``ranks > 1`` the
    returned mean loss is the node's, summed over ``node_group``, the same on every rank.
    ``precision``: autocast and loss scale of the forward/backward (default: fp32).
    """
    precision = precision or TrainingPrecision("fp32", device.type)
    sizes = micro_batch_sizes(batch_size, micro_batch_size, ranks)
    step_samples = sum(sizes)
    is_ddp = isinstance(train_model, DistributedDataParallel)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for index, size in enumerate(sizes):
        inputs, targets = rank_share(*next_batch(size), local_rank, ranks)
        rank_samples = inputs.shape[0]
        syncing = index == len(sizes) - 1 or not is_ddp
        with contextlib.nullcontext() if syncing else train_model.no_sync():
            with precision.autocast():
                rank_mean_loss = train_model(inputs.to(device), targets.to(device))
            precision.backward(rank_mean_loss * rank_loss_scale(rank_samples, ranks, step_samples))
        loss_sum += rank_mean_loss.detach().double() * rank_samples
    if ranks > 1:
        dist.all_reduce(loss_sum, group=node_group)
    return StepSamples(mean_loss=loss_sum.item() / step_samples, samples=step_samples)


def is_out_of_memory(err: BaseException) -> bool:
    """A failed allocation: the CUDA / ROCm caching allocator's, or the CPU allocator's."""
    return isinstance(err, OUT_OF_MEMORY) or (isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


def run_fitting(attempt: Callable[[int], Result], micro_batch_size: int,
                reset: Callable[[], None]) -> tuple[Result, int]:
    """``attempt(micro_batch_size)``, and after an out-of-memory error ``reset()`` and the same at half the
    micro-batch, down to one sample per pass; returns the result and the micro-batch that fit.

    Smaller micro-batches over the same samples give the same gradient (gradient accumulation), so a
    node whose memory was overestimated trains on instead of failing. ``reset`` must undo the failed
    attempt's effects (gradients, data position). The error of a one-sample pass is raised.
    """
    while True:
        try:
            return attempt(micro_batch_size), micro_batch_size
        except Exception as err:  # noqa: BLE001 - only an allocation failure is retried
            if not is_out_of_memory(err) or micro_batch_size <= 1:
                raise
        # outside the except block: the failed attempt's frames and tensors are released first
        reset()
        micro_batch_size = max(1, micro_batch_size // 2)
