"""Live calibration: refine a node's step-time prior from its measured steps.

The prior splits its estimate into a part that does not grow with the batch
(optimizer, host overhead, exposed all-reduce) and a part that does
(forward/backward kernels). The measured time is modelled as

    t(B) = w_fixed * fixed_s(B) + w_scaling * scaling_s(B)

and the two weights are fitted by ridge regression towards (1, 1) on relative
errors, with recent steps weighing more (half-life in steps), the first
``warmup_steps`` updates ignored and outliers down-weighted (Huber weights on
the robust residual scale). The weights are corrections of the prior, so they
carry over to another sequence length or batch through ``with_prior``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from geodiloco.predictor.base import StepTimeModel

PRIOR_SIGMA = 0.5          # prior std of each weight (the cold model is ~30 % off)
DEFAULT_NOISE = 0.05       # relative step-time noise assumed before there are residuals
MIN_NOISE = 0.01
HUBER_K = 2.0
MIN_WEIGHT = 0.05


@dataclass(frozen=True)
class Measurement:
    """One measured step: batch, seconds, and the prior's (fixed, scaling) split when measured."""

    batch_size: int
    step_time_s: float
    fixed_s: float
    scaling_s: float
    index: int


def prior_features(prior: StepTimeModel, batch_size: int) -> tuple[float, float]:
    """(fixed_s, scaling_s) of the prior at ``batch_size``; a prior without the split is all scaling."""
    split = getattr(prior, "fixed_and_scaling_s", None)
    if split is not None:
        return split(batch_size)
    return 0.0, prior.predict(batch_size)


class OnlineStepTimeModel:
    """A StepTimeModel that starts at its prior and converges to measured step times.

    ``uncertainty(B)`` is relative: one standard deviation of the predicted
    time as a fraction of it (0.1 = +-10 %).
    """

    def __init__(self, prior: StepTimeModel, warmup_steps: int = 1, half_life_steps: float = 200.0,
                 max_history: int = 1000) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.prior = prior
        self.warmup_steps = warmup_steps
        self.half_life_steps = half_life_steps
        self.max_history = max_history
        self.measurements: list[Measurement] = []
        self.updates_seen = 0
        self._fit: Optional[tuple[np.ndarray, np.ndarray, float]] = None

    # ------------------------------------------------------------ protocol

    def update(self, batch_size: int, step_time_s: float) -> None:
        """Feed one measured step (seconds); warm-up steps and non-finite times are ignored."""
        self.updates_seen += 1
        if self.updates_seen <= self.warmup_steps or not math.isfinite(step_time_s) or step_time_s <= 0:
            return
        fixed_s, scaling_s = prior_features(self.prior, batch_size)
        self.measurements.append(Measurement(batch_size, step_time_s, fixed_s, scaling_s, self.updates_seen))
        del self.measurements[:-self.max_history]
        self._fit = None

    def predict(self, batch_size: int) -> float:
        """Seconds per step at ``batch_size``: the prior corrected by the fitted weights."""
        weights, _, _ = self.fit()
        return float(np.dot(weights, prior_features(self.prior, batch_size)))

    def max_batch_size(self) -> int:
        return self.prior.max_batch_size()

    # ------------------------------------------------------------ extras

    @property
    def num_measurements(self) -> int:
        """Measured steps in use (warm-up steps excluded)."""
        return len(self.measurements)

    def uncertainty(self, batch_size: int) -> float:
        """Relative one-sigma uncertainty of ``predict(batch_size)`` (noise + weight uncertainty)."""
        weights, covariance, noise = self.fit()
        features = np.asarray(prior_features(self.prior, batch_size))
        predicted = float(np.dot(weights, features))
        if predicted <= 0:
            return 1.0
        weight_var = float(features @ covariance @ features) / predicted**2
        observed_noise = noise**2 if self.measurements else 0.0
        return math.sqrt(weight_var + observed_noise)

    @property
    def weights(self) -> tuple[float, float]:
        """(w_fixed, w_scaling): the fitted corrections of the prior's two parts."""
        fitted, _, _ = self.fit()
        return float(fitted[0]), float(fitted[1])

    def with_prior(self, prior: StepTimeModel) -> "OnlineStepTimeModel":
        """Same measurements and corrections applied to another prior (e.g. another seq_len)."""
        twin = OnlineStepTimeModel(prior, self.warmup_steps, self.half_life_steps, self.max_history)
        twin.measurements = list(self.measurements)
        twin.updates_seen = self.updates_seen
        return twin

    def explain(self, batch_size: int) -> dict:
        """The prior's explanation with the calibrated time and the calibration state."""
        base = getattr(self.prior, "explain", None)
        info = dict(base(batch_size)) if base is not None else {}
        step_time_s = self.predict(batch_size)
        info["prior_step_time_s"] = info.get("step_time_s", self.prior.predict(batch_size))
        info["step_time_s"] = step_time_s
        if "seq_len" in info:
            info["tokens_per_s"] = batch_size * info["seq_len"] / step_time_s
        w_fixed, w_scaling = self.weights
        info["calibration"] = {"num_measurements": self.num_measurements, "w_fixed": w_fixed,
                               "w_scaling": w_scaling, "uncertainty": self.uncertainty(batch_size)}
        return info

    # ------------------------------------------------------------ fitting

    def fit(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(weights, weight covariance, relative noise) from the current measurements."""
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[np.ndarray, np.ndarray, float]:
        prior_weights = np.ones(2)
        if not self.measurements:
            return prior_weights, np.eye(2) * PRIOR_SIGMA**2, DEFAULT_NOISE
        times = np.array([m.step_time_s for m in self.measurements])
        design = np.array([[m.fixed_s, m.scaling_s] for m in self.measurements]) / times[:, None]
        target = np.ones(len(times))
        newest = self.measurements[-1].index
        recency = 0.5 ** (np.array([newest - m.index for m in self.measurements]) / self.half_life_steps)
        robust = np.ones(len(times))
        noise = DEFAULT_NOISE
        for _ in range(4):
            weights, covariance = self._ridge(design, target, recency * robust, noise)
            residuals = target - design @ weights
            noise = self._noise(residuals)
            robust = np.minimum(1.0, HUBER_K * noise / np.maximum(np.abs(residuals), 1e-12))
        return np.maximum(weights, MIN_WEIGHT), covariance, noise

    @staticmethod
    def _ridge(design: np.ndarray, target: np.ndarray, sample_weights: np.ndarray,
               noise: float) -> tuple[np.ndarray, np.ndarray]:
        precision_prior = np.eye(2) / PRIOR_SIGMA**2
        weighted = design * (sample_weights / noise**2)[:, None]
        precision = design.T @ weighted + precision_prior
        rhs = weighted.T @ target + precision_prior @ np.ones(2)
        covariance = np.linalg.inv(precision)
        return covariance @ rhs, covariance

    def _noise(self, residuals: np.ndarray) -> float:
        if len(residuals) < 3:
            return DEFAULT_NOISE
        mad = float(np.median(np.abs(residuals - np.median(residuals)))) * 1.4826
        return max(MIN_NOISE, mad)
