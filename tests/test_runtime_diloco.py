"""DiLoCo math in one process: weights, the outer Nesterov step, the inner schedule."""
import math

import pytest
import torch
from torch import nn

from geodiloco.runtime.diloco import OuterState, group_average_scale, group_average_terms, inner_lr, outer_weights


def test_uniform_weights_ignore_work():
    assert outer_weights("uniform", [10, 30], [1, 3], [4, 4]) == [0.5, 0.5]


def test_token_weights_are_token_shares():
    weights = outer_weights("tokens", [1000, 3000], [10, 30], [4, 4])
    assert weights == pytest.approx([0.25, 0.75])


def test_normalized_weights_fednova():
    # p = B_i / sum(B) = [0.25, 0.75]; tau_eff = 0.25*10 + 0.75*30 = 25; w_i = p_i * tau_eff / H_i
    weights = outer_weights("normalized", [0, 0], [10, 30], [2, 6])
    assert weights == pytest.approx([0.25 * 25 / 10, 0.75 * 25 / 30])


def test_normalized_weights_equal_work_reduce_to_uniform():
    assert outer_weights("normalized", [5, 5], [7, 7], [4, 4]) == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize("mode", ["uniform", "tokens", "normalized"])
def test_group_average_form_gives_the_outer_weights_of_any_group(mode):
    # what a group-forming backend computes: mean of scale_i * x_i weighted by weight_i, times the group factor
    tokens, steps, batches = [1200, 0, 640, 96], [10, 0, 4, 3], [4, 6, 5, 1]
    deltas = [2.0, -1.0, 0.5, 7.0]
    for group in ([0, 1, 2, 3], [0, 2], [3], [1, 3], [1]):
        terms = [group_average_terms(mode, tokens[i], steps[i], batches[i]) for i in group]
        mean = sum(weight * scale * deltas[i] for (scale, weight), i in zip(terms, group)) / sum(
            weight for _, weight in terms)
        summed = mean * group_average_scale(mode, [steps[i] for i in group], [batches[i] for i in group])
        weights = outer_weights(mode, [tokens[i] for i in group], [steps[i] for i in group],
                                [batches[i] for i in group])
        assert summed == pytest.approx(sum(w * deltas[i] for w, i in zip(weights, group)), rel=1e-9), group


def test_unknown_weighting_is_an_error():
    with pytest.raises(ValueError, match="unknown weighting"):
        outer_weights("median", [1], [1], [1])


def _linear(weights):
    layer = nn.Linear(len(weights), 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([weights]))
    return layer


def test_pseudo_gradient_is_global_minus_local():
    model = _linear([1.0, 2.0])
    outer = OuterState(model, lr=0.7, momentum=0.9, nesterov=True)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, 2.5]]))
    assert outer.pseudo_gradient(model).tolist() == pytest.approx([0.5, -0.5])
    assert outer.pseudo_gradient(model, weight=0.5).tolist() == pytest.approx([0.25, -0.25])


def test_outer_nesterov_step_matches_formula():
    lr, momentum = 0.7, 0.9
    model = _linear([1.0, -1.0])
    outer = OuterState(model, lr=lr, momentum=momentum, nesterov=True)
    theta = torch.tensor([1.0, -1.0])
    velocity = torch.zeros(2)
    for delta in ([0.2, -0.1], [0.05, 0.3], [-0.1, 0.1]):
        grad = torch.tensor(delta)
        outer.apply(grad.clone())
        # SGD with Nesterov: v = m v + g; theta -= lr (g + m v)
        velocity = momentum * velocity + grad
        theta = theta - lr * (grad + momentum * velocity)
        assert outer.global_params[0].view(-1).tolist() == pytest.approx(theta.tolist(), rel=1e-6)


def test_outer_lr_one_without_momentum_lands_on_the_average():
    model = _linear([1.0, 1.0])
    outer = OuterState(model, lr=1.0, momentum=0.0, nesterov=False)
    locals_ = [torch.tensor([0.0, 2.0]), torch.tensor([4.0, 0.0])]
    average_delta = sum(0.5 * (torch.ones(2) - local) for local in locals_)
    outer.apply(average_delta)
    assert outer.global_params[0].view(-1).tolist() == pytest.approx([2.0, 1.0])
    outer.load_into(model)
    assert model.weight.view(-1).tolist() == pytest.approx([2.0, 1.0])


def test_inner_lr_warmup_then_cosine_to_floor():
    assert inner_lr(1.0, 0, 100, 10, 0.1) == pytest.approx(0.1)
    assert inner_lr(1.0, 9, 100, 10, 0.1) == pytest.approx(1.0)
    assert inner_lr(1.0, 10, 100, 10, 0.1) == pytest.approx(1.0)
    # a node with more steps than the baseline advances by fractions: never above the configured lr
    assert inner_lr(1.0, 9.5, 100, 10, 0.1) == pytest.approx(1.0)
    assert max(inner_lr(1e-3, step * 10 / 19, 60, 1, 0.1) for step in range(40)) == pytest.approx(1e-3)
    middle = 10 + 45
    assert inner_lr(1.0, middle, 100, 10, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert inner_lr(1.0, 100, 100, 10, 0.1) == pytest.approx(0.1)
    assert inner_lr(1.0, 500, 100, 10, 0.1) == pytest.approx(0.1)
