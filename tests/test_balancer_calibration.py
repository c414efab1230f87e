"""The planner's calibration is the predictor's online model: it learns the shape of t(B), not only its scale."""
import numpy as np
import pytest

from geodiloco.balancer.estimates import Calibration
from geodiloco.predictor.online import OnlineStepTimeModel
from test_balancer_helpers import LinearModel, nodes, planner


def true_step_s(batch_size):
    """A node that is cheaper per step but dearer per sample than its prior says (0.2 + 0.025 B)."""
    return 0.05 + 0.05 * batch_size


def calibrated_step_s(balancer, batch_size):
    batch = np.array([batch_size])
    return float(balancer._inputs(calibrated=True).step_s(batch, batch)[0])


def test_two_batch_sizes_teach_the_planner_the_shape_of_t_of_b():
    balancer = planner("adaptive", nodes("overhead"))
    for round_idx, batch_size in enumerate((4, 16)):
        balancer.observe_round(round_idx, np.array([batch_size]), np.array([true_step_s(batch_size)]))
    # batch 8 was never measured; a scale factor fitted at batch 16 would predict 0.567 s (26 % off)
    assert calibrated_step_s(balancer, 8) == pytest.approx(true_step_s(8), rel=0.02)
    assert calibrated_step_s(balancer, 32) == pytest.approx(true_step_s(32), rel=0.02)


def test_one_batch_size_only_rescales():
    balancer = planner("adaptive", nodes("overhead"))
    balancer.observe_round(0, np.array([16]), np.array([true_step_s(16)]))
    assert calibrated_step_s(balancer, 16) == pytest.approx(true_step_s(16), rel=0.005)
    # with one batch size the split between fixed and per-sample time stays the prior's
    assert abs(calibrated_step_s(balancer, 4) / true_step_s(4) - 1) > 0.1


def test_planner_and_predictor_online_model_agree():
    prior = LinearModel(0.2, 0.025, 64)
    online = OnlineStepTimeModel(prior, warmup_steps=0, half_life_steps=1.0, default_noise=0.01)
    balancer = planner("adaptive", nodes("overhead"))
    for round_idx, batch_size in enumerate((4, 16, 8)):
        online.update(batch_size, true_step_s(batch_size))
        balancer.observe_round(round_idx, np.array([batch_size]), np.array([true_step_s(batch_size)]))
    for batch_size in (2, 12, 40):
        assert calibrated_step_s(balancer, batch_size) == pytest.approx(online.predict(batch_size), rel=1e-9)
        assert online.predict(batch_size) == pytest.approx(true_step_s(batch_size), rel=0.02), \
            "and what both say is the true t(B), at batches never measured"


def test_a_node_that_slows_down_at_the_same_batch_drops_its_old_rounds():
    calibration = Calibration(1, alpha=0.5, change_threshold=0.1)
    for _ in range(5):
        calibration.update(np.array([0]), np.array([1.0]), np.array([0.2]), np.array([0.8]))
    calibration.update(np.array([0]), np.array([2.0]), np.array([0.2]), np.array([0.8]))
    assert calibration.valid.sum() == 1
    assert calibration.fitted().predict_s(np.array([0.2]), np.array([0.8]))[0] == pytest.approx(2.0, rel=0.005)


def test_uncertainty_shrinks_with_measurements_and_is_reported():
    calibration = Calibration(2)
    features = (np.array([0.2, 0.2]), np.array([0.8, 0.8]))
    cold = calibration.fitted().uncertainty(*features)
    for batch_scale in (1.0, 2.0, 4.0, 1.0, 2.0):
        calibration.update(np.array([0]), np.array([0.2 + 0.9 * batch_scale]), np.array([0.2]),
                           np.array([0.8 * batch_scale]))
    warm = calibration.fitted().uncertainty(*features)
    assert warm[0] < cold[0] / 5
    assert warm[1] == pytest.approx(cold[1])


def test_a_prior_a_hundred_times_off_is_rescaled_by_one_round():
    """An emulated or throttled node can be far off its prior: the scale is taken as measured, at once."""
    calibration = Calibration(1)
    calibration.update(np.array([0]), np.array([0.25]), np.array([0.002]), np.array([0.0004]))
    assert calibration.fitted().predict_s(np.array([0.002]), np.array([0.0004]))[0] == pytest.approx(0.25, rel=0.005)
