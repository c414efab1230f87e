"""Live calibration: refine a node's step-time prior from its measured steps.

The prior splits its estimate into a part that does not grow with the batch
(optimizer, host overhead, exposed all-reduce) and a part that does
(forward/backward kernels). The measured time is modelled as

    t(B) = w_fixed * fixed_s(B) + w_scaling * scaling_s(B)

and the two weights are fitted by ridge regression on relative errors, towards
(r, r) where r is the median measured / prior ratio (a common scale error of
any size costs nothing; the prior also lets both weights move together more
easily than apart), so one batch size rescales t(B) and only steps at several
batch sizes change its shape, with recent steps weighing more (half-life in steps), the first
``warmup_steps`` updates ignored and outliers down-weighted (Huber weights on
the robust residual scale). Steps at two or more batch sizes fix both weights,
i.e. the shape of t(B), not just its scale. The weights are corrections of the
prior, so they carry over to another sequence length or batch through ``with_prior``.

``fit_corrections`` is the fit itself, for many histories at once: the
balancer's planner calibrates every node with it, so the plan and the
published warm-accuracy figure use one model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from geodiloco.predictor.base import StepTimeModel

PRIOR_SCALE_SIGMA = 0.5    # prior std of a common factor on both weights (the cold model is ~30 % off)
PRIOR_SHAPE_SIGMA = 0.5    # prior std of each weight on its own (correlation 0.5: scale errors are the common case)
PRIOR_COVARIANCE = PRIOR_SCALE_SIGMA**2 * np.ones((2, 2)) + PRIOR_SHAPE_SIGMA**2 * np.eye(2)
PRIOR_PRECISION = np.linalg.inv(PRIOR_COVARIANCE)
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
                 max_history: int = 1000, default_noise: float = DEFAULT_NOISE) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.prior = prior
        self.default_noise = default_noise
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
        twin = OnlineStepTimeModel(prior, self.warmup_steps, self.half_life_steps, self.max_history,
                                   self.default_noise)
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
        if not self.measurements:
            return np.ones(2), PRIOR_COVARIANCE.copy(), self.default_noise
        newest = self.measurements[-1].index
        fit = fit_corrections(
            fixed_s=np.array([[m.fixed_s for m in self.measurements]]),
            scaling_s=np.array([[m.scaling_s for m in self.measurements]]),
            step_time_s=np.array([[m.step_time_s for m in self.measurements]]),
            recency=np.array([[0.5 ** ((newest - m.index) / self.half_life_steps) for m in self.measurements]]),
            valid=np.ones((1, len(self.measurements)), dtype=bool), default_noise=self.default_noise)
        return fit.weights[0], fit.covariance[0], float(fit.noise[0])


@dataclass(frozen=True)
class CorrectionFit:
    """Fitted (w_fixed, w_scaling) per row, their covariance and the relative noise of the residuals."""

    weights: np.ndarray
    covariance: np.ndarray
    noise: np.ndarray

    def predict_s(self, fixed_s: np.ndarray, scaling_s: np.ndarray) -> np.ndarray:
        """Calibrated seconds; ``fixed_s``/``scaling_s`` shaped like the rows (or rows x k)."""
        fixed_s, scaling_s = np.asarray(fixed_s, dtype=float), np.asarray(scaling_s, dtype=float)
        extra = (None,) * (fixed_s.ndim - 1)
        return self.weights[(slice(None), 0) + extra] * fixed_s + self.weights[(slice(None), 1) + extra] * scaling_s

    def uncertainty(self, fixed_s: np.ndarray, scaling_s: np.ndarray) -> np.ndarray:
        """Relative one-sigma uncertainty of ``predict_s`` per row (weight uncertainty + noise)."""
        features = np.stack([np.asarray(fixed_s, dtype=float), np.asarray(scaling_s, dtype=float)], axis=-1)
        predicted = np.maximum(np.einsum("ni,ni->n", features, self.weights), 1e-30)
        weight_var = np.einsum("ni,nij,nj->n", features, self.covariance, features) / predicted**2
        return np.sqrt(weight_var + self.noise**2)


def fit_corrections(fixed_s: np.ndarray, scaling_s: np.ndarray, step_time_s: np.ndarray, recency: np.ndarray,
                    valid: np.ndarray, default_noise: float = DEFAULT_NOISE) -> CorrectionFit:
    """Ridge fit of ``t = w_fixed * fixed_s + w_scaling * scaling_s`` towards (1, 1), many rows at once.

    Every argument is shaped (rows, measurements): row r is one node's (or one
    model's) history, ``valid`` marks the filled slots, ``recency`` weighs them
    (1 = newest). Errors are relative; outliers are down-weighted with Huber
    weights on the robust (MAD) residual scale, which needs 3 measurements
    (before that the noise is ``default_noise``). A row with no valid slot
    keeps the prior (1, 1).
    """
    valid = np.asarray(valid, dtype=bool)
    times = np.where(valid, step_time_s, 1.0)
    design = np.stack([np.where(valid, fixed_s, 0.0), np.where(valid, scaling_s, 0.0)], axis=-1) / times[..., None]
    rows = valid.shape[0]
    noise = np.full(rows, float(default_noise))
    robust = np.ones(valid.shape)
    scale = _measured_scale(design, valid)
    for _ in range(4):
        weights, covariance = _ridge(design, np.where(valid, recency, 0.0) * robust, noise, scale)
        residuals = 1.0 - design[..., 0] * weights[:, :1] - design[..., 1] * weights[:, 1:]
        noise = _robust_noise(residuals, valid, default_noise)
        robust = np.minimum(1.0, HUBER_K * noise[:, None] / np.maximum(np.abs(residuals), 1e-12))
    return CorrectionFit(np.maximum(weights, MIN_WEIGHT), covariance, noise)


def _measured_scale(design: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per row, the median of measured / prior time (1 without measurements): the prior's plain scale error."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = 1.0 / row_median(design.sum(axis=-1), valid)
    return np.where(np.isfinite(ratio) & (ratio > 0), ratio, 1.0)


def row_median(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Median of each row's ``valid`` entries (NaN for a row with none): ``np.nanmedian`` of the masked rows,
    without its masked-array path, which made the planner's refit of 10,000 nodes take a third of a second
    per round."""
    counts = valid.sum(axis=1)
    ordered = np.sort(np.where(valid, values, np.inf), axis=1)
    low = np.take_along_axis(ordered, (np.maximum(counts, 1) - 1)[:, None] // 2, axis=1)[:, 0]
    high = np.take_along_axis(ordered, (np.maximum(counts, 1) // 2)[:, None], axis=1)[:, 0]
    return np.where(counts > 0, (low + high) / 2.0, np.nan)


def _ridge(design: np.ndarray, sample_weights: np.ndarray, noise: np.ndarray,
           scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ridge towards ``scale`` x (1, 1) with the prior's spread scaled alike, so a prior that is off
    by any common factor (an emulated or throttled node, a CPU) costs nothing and only shape is shrunk."""
    # Two weights per row: the normal equations are 2 x 2, summed and inverted in closed form (batched
    # matrix products and inverses of 2 x 2 matrices cost far more per row than the arithmetic).
    prior = PRIOR_PRECISION[None] / scale[:, None, None] ** 2
    per_sample = sample_weights / noise[:, None] ** 2
    fixed, scaling = design[..., 0], design[..., 1]
    # the precision matrix [[fixed_fixed, cross], [cross, scaling_scaling]] and the right-hand side
    fixed_fixed = (per_sample * fixed * fixed).sum(axis=1) + prior[:, 0, 0]
    cross = (per_sample * fixed * scaling).sum(axis=1) + prior[:, 0, 1]
    scaling_scaling = (per_sample * scaling * scaling).sum(axis=1) + prior[:, 1, 1]
    rhs_fixed = (per_sample * fixed).sum(axis=1) + prior[:, 0].sum(axis=1) * scale
    rhs_scaling = (per_sample * scaling).sum(axis=1) + prior[:, 1].sum(axis=1) * scale
    determinant = fixed_fixed * scaling_scaling - cross * cross
    covariance = np.stack([np.stack([scaling_scaling, -cross], axis=-1), np.stack([-cross, fixed_fixed], axis=-1)],
                          axis=-2) / determinant[:, None, None]
    weights = np.stack([scaling_scaling * rhs_fixed - cross * rhs_scaling,
                        fixed_fixed * rhs_scaling - cross * rhs_fixed], axis=-1) / determinant[:, None]
    return weights, covariance


def _robust_noise(residuals: np.ndarray, valid: np.ndarray, default_noise: float) -> np.ndarray:
    """Relative noise per row: 1.4826 x MAD of the valid residuals (``default_noise`` under 3 of them)."""
    counts = valid.sum(axis=1)
    centre = row_median(residuals, valid)
    mad = row_median(np.abs(residuals - centre[:, None]), valid) * 1.4826
    return np.where(counts >= 3, np.maximum(MIN_NOISE, np.nan_to_num(mad, nan=default_noise)), default_noise)
