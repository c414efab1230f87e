"""The outer step's host work (runtime/diloco.py, runtime/finite_guard.py): the pseudo-gradient written
in place, torch's fused SGD kernel and the one-read finite check give what the plain formulas give.
Their speed is measured by experiments/bench_outer_step.py, not here."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from geodiloco.runtime.diloco import OuterState
from geodiloco.runtime.finite_guard import all_finite


def two_layer_model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3)).to(dtype)


@pytest.mark.parametrize("tensors, expected", [
    ([torch.ones(4), torch.zeros(2, 3)], True),
    ([torch.ones(4), torch.tensor([1.0, math.nan])], False),
    ([torch.tensor([math.inf, 1.0])], False),
    ([torch.tensor([math.inf, -math.inf])], False),  # the sum is NaN
    ([torch.tensor([3e38, 3e38]), torch.tensor([-3e38])], True),  # finite values whose fp32 sum overflows
    ([torch.tensor([60000.0, 60000.0], dtype=torch.float16)], True),  # past fp16's largest value when summed
    ([torch.tensor([1.0, math.nan], dtype=torch.bfloat16)], False),
    ([torch.tensor([1, 2, 3])], True),  # integers are always finite
    ([torch.empty(0)], True),
    ([], True),
])
def test_the_finite_check_answers_as_the_element_by_element_check(tensors, expected):
    assert all_finite(tensors) is expected
    reference = all(bool(torch.isfinite(tensor).all()) for tensor in tensors)
    assert reference is expected


def test_the_pseudo_gradient_is_global_minus_local_in_fp32_also_from_a_bf16_model():
    model = two_layer_model()
    outer = OuterState(model, lr=0.7, momentum=0.9, nesterov=True)
    local = two_layer_model(torch.bfloat16)
    with torch.no_grad():
        for param in local.parameters():
            param.add_(0.25)
    flat = outer.pseudo_gradient(local, weight=0.5)
    expected = torch.cat([(g - l.float()).reshape(-1) for g, l in zip(outer.global_params, local.parameters())]) * 0.5
    assert flat.dtype == torch.float32 and flat.shape == (outer.numel,)
    assert torch.equal(flat, expected)


def test_a_non_contiguous_local_parameter_is_read_in_its_logical_order():
    outer = OuterState(nn.Linear(4, 3, bias=False), lr=1.0, momentum=0.0, nesterov=False)
    transposed_storage = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    local = transposed_storage.T  # (3, 4), not contiguous
    assert not local.is_contiguous()
    flat = outer.pseudo_gradient([local])
    assert torch.equal(flat, (outer.global_params[0] - local).reshape(-1))


def reference_nesterov(params: list[torch.Tensor], steps: list[torch.Tensor], lr: float, momentum: float):
    """SGD with Nesterov momentum by its formula: m = momentum m + g; p -= lr (g + momentum m)."""
    params = [param.clone() for param in params]
    buffers = [None] * len(params)
    offset_steps = []
    for flat in steps:
        offset = 0
        for index, param in enumerate(params):
            grad = flat[offset:offset + param.numel()].view_as(param)
            offset += param.numel()
            buffers[index] = grad.clone() if buffers[index] is None else buffers[index] * momentum + grad
            param -= lr * (grad + momentum * buffers[index])
        offset_steps.append([param.clone() for param in params])
    return offset_steps


def test_the_outer_step_takes_torchs_fused_kernel_here_and_follows_nesterovs_formula():
    outer = OuterState(two_layer_model(), lr=0.7, momentum=0.9, nesterov=True)
    assert outer.fused, "torch 2.4+ has a fused SGD kernel on the CPU; the outer step should use it"
    start = [param.clone() for param in outer.global_params]
    torch.manual_seed(1)
    steps = [torch.randn(outer.numel) * 0.1 for _ in range(4)]
    expected = reference_nesterov(start, steps, lr=0.7, momentum=0.9)
    for flat, after in zip(steps, expected):
        outer.apply(flat)
        for got, want in zip(outer.global_params, after):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_state_saved_by_the_unfused_optimizer_resumes_with_its_momentum_on_the_fused_one():
    torch.manual_seed(2)
    steps = [torch.randn(sum(p.numel() for p in two_layer_model().parameters())) * 0.1 for _ in range(3)]
    unfused = OuterState(two_layer_model(), lr=0.7, momentum=0.9, nesterov=True)
    unfused.optimizer = torch.optim.SGD(unfused.global_params, lr=0.7, momentum=0.9, nesterov=True)  # as before
    for flat in steps[:2]:
        unfused.apply(flat)
    resumed = OuterState(two_layer_model(), lr=0.7, momentum=0.9, nesterov=True)
    resumed.load_state_dict(copy.deepcopy(unfused.state_dict()))  # as from a checkpoint file, not shared
    assert all(group["fused"] for group in resumed.optimizer.param_groups)
    unfused.apply(steps[2])
    resumed.apply(steps[2])
    for got, want in zip(resumed.global_params, unfused.global_params):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
