"""Online calibration: converges to measured times, ignores warm-up and outliers, transfers."""
import warnings

import numpy as np
import pytest

from geodiloco.predictor.base import StepTimeModel
from geodiloco.predictor.online import OnlineStepTimeModel, fit_corrections, row_median


class LinearPrior:
    """A prior that says t(B) = fixed + per_sample * B, split into its two parts."""

    def __init__(self, fixed_s: float, per_sample_s: float) -> None:
        self.fixed_s, self.per_sample_s = fixed_s, per_sample_s

    def fixed_and_scaling_s(self, batch_size):
        return self.fixed_s, self.per_sample_s * batch_size

    def predict(self, batch_size):
        return self.fixed_s + self.per_sample_s * batch_size

    def update(self, batch_size, step_time_s):
        pass

    def max_batch_size(self):
        return 64


def truth(batch_size):
    """The real node: twice the prior's fixed cost, half its per-sample cost."""
    return 2 * 0.010 + 0.5 * 0.004 * batch_size


def test_without_measurements_it_is_the_prior():
    online = OnlineStepTimeModel(LinearPrior(0.010, 0.004))
    assert isinstance(online, StepTimeModel)
    assert online.predict(8) == pytest.approx(0.010 + 0.032)
    assert online.num_measurements == 0 and online.max_batch_size() == 64


def test_five_steps_predict_unseen_batches():
    online = OnlineStepTimeModel(LinearPrior(0.010, 0.004), warmup_steps=0)
    for batch in (1, 2, 4, 8, 16):
        online.update(batch, truth(batch))
    for batch in (3, 12, 32):
        assert online.predict(batch) == pytest.approx(truth(batch), rel=0.02)
    w_fixed, w_scaling = online.weights
    assert w_fixed == pytest.approx(2.0, rel=0.05) and w_scaling == pytest.approx(0.5, rel=0.05)


def test_warm_up_steps_are_ignored():
    online = OnlineStepTimeModel(LinearPrior(0.010, 0.004), warmup_steps=2)
    online.update(4, 10.0)
    online.update(4, 5.0)
    for batch in (1, 2, 4, 8, 16):
        online.update(batch, truth(batch))
    assert online.num_measurements == 5
    assert online.predict(6) == pytest.approx(truth(6), rel=0.02)


def test_an_outlier_step_barely_moves_the_estimate():
    online = OnlineStepTimeModel(LinearPrior(0.010, 0.004), warmup_steps=0)
    for repeat in range(4):
        for batch in (2, 4, 8):
            online.update(batch, truth(batch) * (1 + 0.01 * (repeat % 2)))
    online.update(4, 5 * truth(4))
    assert online.predict(4) == pytest.approx(truth(4), rel=0.03)


def test_uncertainty_is_relative_and_shrinks_with_measurements():
    online = OnlineStepTimeModel(LinearPrior(0.010, 0.004), warmup_steps=0)
    cold = online.uncertainty(8)
    assert 0.2 < cold < 1.0
    for batch in (1, 2, 4, 8, 16) * 3:
        online.update(batch, truth(batch))
    assert online.uncertainty(8) < cold / 5


def test_recent_steps_win_after_a_slowdown():
    online = OnlineStepTimeModel(LinearPrior(0.010, 0.004), warmup_steps=0, half_life_steps=10)
    for _ in range(20):
        for batch in (2, 8):
            online.update(batch, truth(batch))
    for _ in range(40):
        for batch in (2, 8):
            online.update(batch, 2 * truth(batch))
    assert online.predict(4) == pytest.approx(2 * truth(4), rel=0.05)


def test_with_prior_carries_the_corrections():
    online = OnlineStepTimeModel(LinearPrior(0.010, 0.004), warmup_steps=0)
    for batch in (1, 2, 4, 8, 16):
        online.update(batch, truth(batch))
    longer = online.with_prior(LinearPrior(0.010, 0.008))  # e.g. twice the sequence length
    assert longer.predict(10) == pytest.approx(2 * 0.010 + 0.5 * 0.008 * 10, rel=0.03)
    assert longer.num_measurements == 5


def test_explain_adds_calibration_to_a_spec_prior():
    from geodiloco.predictor.model import node_step_model
    from geodiloco.predictor.workload import PRESETS

    prior = node_step_model(["A30"], PRESETS["small"], 256, "bf16")
    online = OnlineStepTimeModel(prior, warmup_steps=0)
    for batch in (4, 8, 16):
        online.update(batch, 1.3 * prior.predict(batch))
    info = online.explain(12)
    assert info["step_time_s"] == pytest.approx(1.3 * prior.predict(12), rel=0.03)
    assert info["prior_step_time_s"] == pytest.approx(prior.predict(12))
    assert info["calibration"]["num_measurements"] == 3


def test_row_median_is_numpys_nanmedian_of_the_valid_entries():
    rng = np.random.default_rng(3)
    values = rng.standard_normal((200, 9))
    valid = rng.random((200, 9)) < 0.5
    valid[0], valid[1] = False, True  # a row with nothing measured, a full row
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.nanmedian(np.where(valid, values, np.nan), axis=1)
    np.testing.assert_allclose(row_median(values, valid), expected, equal_nan=True)
    assert row_median(np.array([[5.0, 1.0, 9.0, 2.0]]), np.array([[True, True, False, True]]))[0] == 2.0


def test_many_rows_fitted_at_once_match_each_row_fitted_alone():
    """The planner fits every node in one call; each node's fit is the one it would get alone, where
    its empty slots hold arbitrary numbers."""
    rng = np.random.default_rng(4)
    fixed, scaling = rng.random((6, 8)), 3 * rng.random((6, 8))
    step = (0.7 * fixed + 1.6 * scaling) * (1 + 0.03 * rng.standard_normal((6, 8)))
    valid = np.arange(8)[None, :] < np.array([0, 1, 2, 3, 5, 8])[:, None]
    recency = 0.5 ** (np.arange(8)[::-1] / 3.0)[None].repeat(6, 0)
    together = fit_corrections(fixed, scaling, step, recency, valid)
    for row in range(6):
        count = int(valid[row].sum())
        alone = fit_corrections(fixed[row:row + 1, :max(count, 1)], scaling[row:row + 1, :max(count, 1)],
                                step[row:row + 1, :max(count, 1)], recency[row:row + 1, :max(count, 1)],
                                valid[row:row + 1, :max(count, 1)])
        np.testing.assert_allclose(together.weights[row], alone.weights[0], rtol=1e-12)
        np.testing.assert_allclose(together.noise[row], alone.noise[0], rtol=1e-12)
    np.testing.assert_array_equal(together.weights[0], [1.0, 1.0])  # nothing measured: the prior
    # eight points of t = 0.7 fixed + 1.6 scaling with 3 % noise: the shape is learned, not just a scale
    assert together.weights[5] == pytest.approx([0.7, 1.6], rel=0.25)
