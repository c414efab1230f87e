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


def reference_nesterov(params: list[torch.Tensor], steps: list[torch.Tensor], lr: float, momentum: float,
                       nesterov: bool = True):
    """SGD with momentum by its formula: m = momentum m + g; p -= lr (g + momentum m) with Nesterov,
    p -= lr m without."""
    params = [param.clone() for param in params]
    buffers = [None] * len(params)
    offset_steps = []
    for flat in steps:
        offset = 0
        for index, param in enumerate(params):
            grad = flat[offset:offset + param.numel()].view_as(param)
            offset += param.numel()
            buffers[index] = grad.clone() if buffers[index] is None else buffers[index] * momentum + grad
            param -= lr * (grad + momentum * buffers[index]) if nesterov else lr * buffers[index]
        offset_steps.append([param.clone() for param in params])
    return offset_steps


def assert_outer_steps_follow_the_formula(outer: OuterState, count: int, seed: int, nesterov: bool = True) -> None:
    """``count`` random outer steps (lr 0.7, momentum 0.9) land where SGD's formula puts them."""
    start = [param.clone() for param in outer.global_params]
    torch.manual_seed(seed)
    steps = [torch.randn(outer.numel) * 0.1 for _ in range(count)]
    expected = reference_nesterov(start, steps, lr=0.7, momentum=0.9, nesterov=nesterov)
    for flat, after in zip(steps, expected):
        outer.apply(flat)
        for got, want in zip(outer.global_params, after):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_the_outer_step_takes_torchs_fused_kernel_here_and_follows_nesterovs_formula():
    outer = OuterState(two_layer_model(), lr=0.7, momentum=0.9, nesterov=True)
    assert outer.fused, "torch 2.4+ has a fused SGD kernel on the CPU; the outer step should use it"
    assert_outer_steps_follow_the_formula(outer, count=4, seed=1)


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


def schedule_of(local: nn.Module, outer: OuterState):
    from geodiloco.runtime.sync.overlap import OverlapSchedule
    count = len(list(local.parameters()))
    return OverlapSchedule("none", list(local.parameters()), outer, [list(range(count))],
                           reducer=lambda contribution, feedback: contribution, run_in_background=False)


def test_the_torch_backends_contribution_is_weight_times_anchor_minus_local_and_the_anchor_moves():
    outer = OuterState(two_layer_model(), lr=0.7, momentum=0.9, nesterov=True)
    local = two_layer_model(torch.bfloat16)
    schedule = schedule_of(local, outer)
    anchors_before = [anchor.clone() for anchor in schedule.anchors]
    with torch.no_grad():
        for param in local.parameters():
            param.add_(0.25)
    schedule.launch(0, 0.5)
    sent = schedule.in_flight[0].contribution
    expected = torch.cat([(anchor - param.float()).reshape(-1)
                          for anchor, param in zip(anchors_before, local.parameters())]) * 0.5
    assert torch.equal(sent, expected)
    for anchor, param in zip(schedule.anchors, local.parameters()):
        assert anchor.dtype == torch.float32 and torch.equal(anchor, param.float())


@pytest.mark.parametrize("weight, poison", [(0.5, math.nan), (0.5, math.inf), (0.0, None)])
def test_a_non_finite_model_or_a_zero_weight_sends_zeros(weight, poison):
    outer = OuterState(two_layer_model(), lr=0.7, momentum=0.9, nesterov=True)
    local = two_layer_model()
    if poison is not None:
        with torch.no_grad():
            next(local.parameters())[0, 0] = poison
    schedule = schedule_of(local, outer)
    schedule.launch(0, weight)
    sent = schedule.in_flight[0].contribution
    assert sent.shape == (outer.numel,) and torch.equal(sent, torch.zeros_like(sent))


def test_landing_a_sync_moves_the_local_model_to_global_plus_its_progress_since_the_launch():
    outer = OuterState(two_layer_model(), lr=0.7, momentum=0.0, nesterov=False)
    local = two_layer_model(torch.bfloat16)
    schedule = schedule_of(local, outer)
    with torch.no_grad():
        for param in local.parameters():
            param.add_(0.25)
    schedule.launch(0, 1.0)
    with torch.no_grad():  # progress made while the sync is on the wire (delayed / streaming)
        for param in local.parameters():
            param.add_(0.5)
    anchors = [anchor.clone() for anchor in schedule.anchors]
    locals_before = [param.detach().float().clone() for param in local.parameters()]
    schedule.land(0)
    for param, before, anchor, global_param in zip(local.parameters(), locals_before, anchors, outer.global_params):
        assert torch.equal(param, (global_param + (before - anchor)).to(torch.bfloat16))
    assert all(torch.equal(anchor, global_param) for anchor, global_param in zip(schedule.anchors, outer.global_params))


def test_landing_without_progress_gives_every_node_exactly_the_global_model():
    """Blocking sync: nodes that started from different local models end bitwise equal."""
    landed = []
    for shift in (0.25, -0.375):
        outer = OuterState(two_layer_model(), lr=0.7, momentum=0.9, nesterov=True)
        local = two_layer_model(torch.bfloat16)
        with torch.no_grad():
            for param in local.parameters():
                param.add_(shift)
        schedule = schedule_of(local, outer)
        schedule.launch(0, 1.0)
        schedule.in_flight[0].result = torch.full((outer.numel,), 0.125)  # the same sum on every node
        schedule.land(0)
        assert all(torch.equal(param, global_param.to(torch.bfloat16))
                   for param, global_param in zip(local.parameters(), outer.global_params))
        landed.append([param.clone() for param in local.parameters()])
    assert all(torch.equal(first, second) for first, second in zip(*landed))
