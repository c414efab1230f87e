"""GpuSampler: NVML mocked at the pynvml boundary; numbers computed by hand."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pynvml
import pytest

from geodiloco.runtime.gpu_sampler import GpuSampler


class FakeNvml:
    """Two GPUs whose readings follow scripted lists, one entry per sample."""

    def __init__(self, power_mw: list[tuple[int, int]], util: tuple[int, int] = (40, 60),
                 energy_mj: list[tuple[int, int]] | None = None, gpu_count: int = 2) -> None:
        self.power_mw, self.util, self.energy_mj, self.gpu_count = power_mw, util, energy_mj, gpu_count
        self.reads = {0: 0, 1: 0}
        self.init_calls = self.shutdown_calls = 0

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(pynvml, "nvmlInit", self.init)
        monkeypatch.setattr(pynvml, "nvmlShutdown", self.shutdown)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: self.gpu_count)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: index)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates",
                            lambda handle: SimpleNamespace(gpu=self.util[handle], memory=0))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", self.power)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", self.energy)

    def init(self) -> None:
        self.init_calls += 1

    def shutdown(self) -> None:
        self.shutdown_calls += 1

    def power(self, handle: int) -> int:
        index = min(self.reads[handle], len(self.power_mw) - 1)
        self.reads[handle] += 1
        return self.power_mw[index][handle]

    def energy(self, handle: int) -> int:
        if self.energy_mj is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.energy_mj[min(self.reads[handle] - 1, len(self.energy_mj) - 1)][handle]


class StepClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _sample_at(sampler: GpuSampler, clock: StepClock, times_s: list[float]) -> None:
    for time_s in times_s:
        clock.now_s = time_s
        sampler.sample_now()


POWER_MW = [(60_000, 40_000), (120_000, 80_000), (120_000, 80_000)]  # 100 W, 200 W, 200 W in total


def _fake_started_sampler(monkeypatch, energy_mj=None) -> tuple[GpuSampler, StepClock, FakeNvml]:
    fake = FakeNvml(POWER_MW, energy_mj=energy_mj)
    fake.install(monkeypatch)
    clock = StepClock()
    sampler = GpuSampler(interval_s=1.0, clock=clock)
    sampler._handles = sampler._open_handles()
    return sampler, clock, fake


def test_without_nvml_it_reports_not_available_and_never_raises(monkeypatch):
    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    sampler = GpuSampler()
    assert sampler.start() is False
    assert sampler.available is False
    assert sampler.reason.startswith("not available") and "Library Not Found" in sampler.reason
    assert sampler.summary(0.0, 10.0) == {"gpu_util": None, "power_w": None, "energy_j": None}
    sampler.stop()


def test_summary_integrates_power_between_samples(monkeypatch):
    sampler, clock, _ = _fake_started_sampler(monkeypatch)
    _sample_at(sampler, clock, [0.0, 1.0, 2.0])
    summary = sampler.summary(0.5, 1.5)
    # power 150 W at 0.5 s, 200 W at 1 s and 1.5 s: 0.5*(150+200)/2 + 0.5*200 = 187.5 J over 1 s
    assert summary["energy_j"] == pytest.approx(187.5)
    assert summary["power_w"] == pytest.approx(187.5)
    assert summary["gpu_util"] == pytest.approx(50.0)


def test_summary_prefers_the_energy_counter(monkeypatch):
    counters_mj = [(0, 0), (90_000, 60_000), (210_000, 140_000)]  # 0 J, 150 J, 350 J in total
    sampler, clock, _ = _fake_started_sampler(monkeypatch, energy_mj=counters_mj)
    _sample_at(sampler, clock, [0.0, 1.0, 2.0])
    summary = sampler.summary(0.5, 1.5)
    assert summary["energy_j"] == pytest.approx(250.0 - 75.0)
    assert summary["power_w"] == pytest.approx(175.0)


def test_idle_energy_is_the_idle_windows_plus_stalls_at_the_compute_power(monkeypatch):
    sampler, clock, _ = _fake_started_sampler(monkeypatch)
    _sample_at(sampler, clock, [0.0, 1.0, 2.0])
    # compute (0, 1): 100 -> 200 W, mean 150 W; idle (1, 2): 200 W for 1 s = 200 J; a 0.2 s stall at 150 W = 30 J
    assert sampler.idle_energy_j([(1.0, 2.0)], (0.0, 1.0), 0.2) == pytest.approx(230.0)
    assert sampler.idle_energy_j([(1.0, 2.0)], (0.0, 1.0), 0.0) == pytest.approx(200.0)
    assert sampler.idle_energy_j([(1.0, 2.0), (50.0, 60.0)], (0.0, 1.0), 0.0) is None  # a window never sampled


def test_window_far_from_every_sample_has_no_values(monkeypatch):
    sampler, clock, _ = _fake_started_sampler(monkeypatch)
    _sample_at(sampler, clock, [100.0, 101.0])
    assert sampler.summary(10.0, 20.0) == {"gpu_util": None, "power_w": None, "energy_j": None}
    with pytest.raises(ValueError, match="before it starts"):
        sampler.summary(5.0, 4.0)


def test_thread_samples_in_background_and_stops(monkeypatch):
    fake = FakeNvml(POWER_MW)
    fake.install(monkeypatch)
    sampler = GpuSampler(interval_s=0.01)
    assert sampler.start() is True, sampler.reason
    thread = sampler._thread
    assert thread.daemon and thread is not threading.current_thread()
    deadline = time.monotonic() + 10.0
    while len(sampler.samples()) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert len(sampler.samples()) >= 4
    assert not thread.is_alive()
    assert (fake.init_calls, fake.shutdown_calls) == (1, 1)
    assert sampler.samples()[-1].power_w == pytest.approx(200.0)


def test_failing_reads_end_sampling_not_the_program(monkeypatch):
    fake = FakeNvml(POWER_MW)
    fake.install(monkeypatch)
    sampler = GpuSampler(interval_s=0.01)
    assert sampler.start()

    def lost_gpu(handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lost_gpu)
    sampler._thread.join(timeout=10.0)
    assert "stopped after 3 failed NVML reads" in sampler.reason
    assert len(sampler.samples()) >= 1
    sampler.stop()


def test_unknown_device_index_is_not_available(monkeypatch):
    FakeNvml(POWER_MW).install(monkeypatch)
    sampler = GpuSampler(device_indices=[5])
    assert sampler.start() is False
    assert "GPU index [5]" in sampler.reason


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        GpuSampler(interval_s=0)


def test_a_record_closed_at_the_run_end_gets_the_energy_of_its_added_stretch(monkeypatch):
    from geodiloco.runtime.train import extend_gpu_values
    sampler, clock, _ = _fake_started_sampler(monkeypatch)
    _sample_at(sampler, clock, [0.0, 1.0, 2.0])  # 100 W, then 200 W, then 200 W
    # measured up to 1 s (150 J, 50 J of it idle), then closed at 2 s: the added second draws 200 J, all idle
    record = {"round_start": 0.0, "round_end": 2.0, "gpu_util": 50.0, "power_w": 150.0, "energy_j": 150.0,
              "idle_energy_j": 50.0}
    extend_gpu_values(record, sampler, measured_until=1.0)
    assert record["energy_j"] == pytest.approx(350.0)
    assert record["idle_energy_j"] == pytest.approx(250.0)
    assert record["power_w"] == pytest.approx(175.0)
    untouched = {"round_start": 0.0, "round_end": 2.0, "energy_j": None, "idle_energy_j": None}
    extend_gpu_values(untouched, sampler, measured_until=1.0)  # no NVML figures in the record: nothing to extend
    assert untouched["energy_j"] is None
