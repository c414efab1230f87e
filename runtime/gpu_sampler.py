"""Background NVML sampler: GPU utilization and power of this node's GPUs, for idle energy.

A daemon thread reads NVML every ``interval_s`` seconds (default 1 s) and keeps
timestamped samples; ``summary(start, end)`` turns the samples of a time window
(a round, or its idle part) into mean utilization (percent), mean power (watts,
all watched GPUs together) and energy (joules). The thread only calls NVML
(a C call that releases the GIL) and appends to a list, so it does not slow the
training thread. Without a GPU or NVML, ``start()`` returns False, ``available``
is False, ``reason`` says why, and ``summary`` returns None values: it never raises.
"""
from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

try:
    import pynvml
except ImportError:  # nvidia-ml-py is a dependency; a broken install still must not crash training
    pynvml = None

MILLI = 1e-3
MAX_CONSECUTIVE_READ_ERRORS = 3
NO_VALUES = {"gpu_util": None, "power_w": None, "energy_j": None}


@dataclass(frozen=True)
class GpuSample:
    """One reading of all watched GPUs: unix seconds, mean util %, total watts, total energy counter (J)."""

    time_s: float
    gpu_util: float
    power_w: float
    energy_counter_j: Optional[float]


def _integral(times_s: np.ndarray, values: np.ndarray, start_s: float, end_s: float) -> float:
    """Integral over [start_s, end_s] of the piecewise-linear curve through the samples, held flat past the ends."""
    inside = times_s[(times_s > start_s) & (times_s < end_s)]
    grid = np.concatenate(([start_s], inside, [end_s]))
    return float(np.trapezoid(np.interp(grid, times_s, values), grid))


class GpuSampler:
    """NVML sampler for a set of GPUs (default: every GPU NVML sees).

    Use ``start()`` / ``stop()`` (or ``with GpuSampler() as sampler:``); ``clock``
    is the time source, ``time.time`` so windows use the idle log's unix seconds.
    """

    def __init__(self, interval_s: float = 1.0, device_indices: Optional[Sequence[int]] = None,
                 max_samples: int = 200_000, clock: Callable[[], float] = time.time) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s}")
        self.interval_s = float(interval_s)
        self.device_indices = None if device_indices is None else list(device_indices)
        self.max_samples = max_samples
        self.clock = clock
        self.available = False
        self.reason = "not started"
        self._handles: list = []
        self._energy_counter_ok = True
        self._read_errors = 0
        self._times_s: list[float] = []
        self._samples: list[GpuSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> bool:
        """Open NVML, take a first sample and start the thread; False (with ``reason``) when NVML is not usable."""
        if self._thread is not None:
            return self.available
        if pynvml is None:
            self.reason = "not available: nvidia-ml-py (module pynvml) is not installed"
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            self.reason = f"not available: NVML could not start ({err}); no NVIDIA GPU or driver here"
            return False
        try:
            self._handles = self._open_handles()
            self.sample_now()
        except (pynvml.NVMLError, LookupError) as err:
            self._shutdown_nvml()
            self.reason = f"not available: NVML could not read the GPUs ({err})"
            return False
        if not self._handles:
            self._shutdown_nvml()
            self.reason = "not available: NVML sees no GPU"
            return False
        self.available = True
        self.reason = f"sampling {len(self._handles)} GPU(s) every {self.interval_s:g} s"
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop the thread and close NVML; samples stay readable by ``summary``."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=self.interval_s + 5.0)
        self._shutdown_nvml()

    def __enter__(self) -> "GpuSampler":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _open_handles(self) -> list:
        count = pynvml.nvmlDeviceGetCount()
        indices = range(count) if self.device_indices is None else self.device_indices
        missing = [index for index in indices if not 0 <= index < count]
        if missing:
            raise LookupError(f"GPU index {missing} not among the {count} GPU(s) NVML sees")
        return [pynvml.nvmlDeviceGetHandleByIndex(index) for index in indices]

    def _shutdown_nvml(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass

    def _energy_counter_j(self, handle) -> Optional[float]:
        if not self._energy_counter_ok:
            return None
        try:
            return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) * MILLI
        except pynvml.NVMLError:
            self._energy_counter_ok = False
            return None

    def sample_now(self) -> GpuSample:
        """Read every watched GPU once and store the sample (the thread calls this each interval)."""
        utils, powers, counters = [], [], []
        for handle in self._handles:
            utils.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            powers.append(pynvml.nvmlDeviceGetPowerUsage(handle) * MILLI)
            counters.append(self._energy_counter_j(handle))
        counter_j = sum(counters) if counters and None not in counters and self._energy_counter_ok else None
        sample = GpuSample(self.clock(), float(np.mean(utils)) if utils else 0.0, float(sum(powers)), counter_j)
        with self._lock:
            self._times_s.append(sample.time_s)
            self._samples.append(sample)
            if len(self._samples) > self.max_samples:
                del self._times_s[: len(self._times_s) // 2]
                del self._samples[: len(self._samples) // 2]
        return sample

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample_now()
                self._read_errors = 0
            except Exception as err:  # noqa: BLE001 - a failed read must never end training; it ends sampling
                self._read_errors += 1
                if self._read_errors >= MAX_CONSECUTIVE_READ_ERRORS:
                    self.reason = f"stopped after {self._read_errors} failed NVML reads ({err})"
                    return

    def samples(self) -> list[GpuSample]:
        with self._lock:
            return list(self._samples)

    def _window_samples(self, start_s: float, end_s: float) -> list[GpuSample]:
        """The samples inside the window plus one on each side, so its edges can be interpolated."""
        with self._lock:
            first = max(0, bisect.bisect_left(self._times_s, start_s) - 1)
            last = bisect.bisect_right(self._times_s, end_s) + 1
            return self._samples[first:last]

    def idle_energy_j(self, idle_windows: list[tuple[float, float]], compute_window: tuple[float, float],
                      stalled_in_compute_s: float) -> Optional[float]:
        """Joules the watched GPUs drew while idle: the energy over each idle window, plus the stalls
        inside the compute window at that window's mean power. None when any part was not sampled."""
        energies = [self.summary(start, end)["energy_j"] for start, end in idle_windows]
        if any(energy is None for energy in energies):
            return None
        if stalled_in_compute_s > 0:
            power_w = self.summary(*compute_window)["power_w"]
            if power_w is None:
                return None
            energies.append(power_w * stalled_in_compute_s)
        return float(sum(energies))

    def summary(self, start_unix_s: float, end_unix_s: float) -> dict:
        """Mean ``gpu_util`` (%), mean ``power_w`` (W) and ``energy_j`` (J) of the watched GPUs over the window.

        All None when NVML was not available or no sample lies within one
        interval of the window. Energy uses NVML's energy counter when the
        window lies between two samples that have it, else the integral of power.
        """
        if end_unix_s < start_unix_s:
            raise ValueError(f"window ends ({end_unix_s}) before it starts ({start_unix_s})")
        window = self._window_samples(start_unix_s, end_unix_s)
        slack_s = self.interval_s
        if not window or window[-1].time_s < start_unix_s - slack_s or window[0].time_s > end_unix_s + slack_s:
            return dict(NO_VALUES)
        times_s = np.array([sample.time_s for sample in window])
        utils = np.array([sample.gpu_util for sample in window])
        powers = np.array([sample.power_w for sample in window])
        duration_s = end_unix_s - start_unix_s
        if duration_s == 0:
            power_w = float(np.interp(start_unix_s, times_s, powers))
            return {"gpu_util": float(np.interp(start_unix_s, times_s, utils)), "power_w": power_w, "energy_j": 0.0}
        energy_j = _integral(times_s, powers, start_unix_s, end_unix_s)
        counters = [sample.energy_counter_j for sample in window]
        if None not in counters and times_s[0] <= start_unix_s and end_unix_s <= times_s[-1]:
            counter_values = np.array(counters, dtype=float)
            energy_j = float(np.interp(end_unix_s, times_s, counter_values) -
                             np.interp(start_unix_s, times_s, counter_values))
        return {"gpu_util": _integral(times_s, utils, start_unix_s, end_unix_s) / duration_s,
                "power_w": energy_j / duration_s, "energy_j": energy_j}
