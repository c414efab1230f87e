"""A node of several MIG instances gives each rank its own instance (runtime/mig_devices.py)."""
import pytest

from geodiloco.common.schema import ConfigError
from geodiloco.runtime import train
from geodiloco.runtime.mig_devices import PINNED_ENV, cuda_backend, cuda_device_index, pin_mig_instance

TWO_INSTANCES = "MIG-1b2c3d4e-0000-5555-aaaa-000000000001,MIG-1b2c3d4e-0000-5555-aaaa-000000000002"


def test_each_rank_keeps_the_instance_at_its_local_rank_and_trains_on_cuda_0_over_gloo():
    environ = {"CUDA_VISIBLE_DEVICES": TWO_INSTANCES, "LOCAL_RANK": "1"}
    assert pin_mig_instance(environ) == "MIG-1b2c3d4e-0000-5555-aaaa-000000000002"
    assert environ["CUDA_VISIBLE_DEVICES"] == "MIG-1b2c3d4e-0000-5555-aaaa-000000000002"
    assert (cuda_device_index(environ), cuda_backend(environ)) == (0, "gloo")
    assert pin_mig_instance(environ) == environ[PINNED_ENV]
    assert environ["CUDA_VISIBLE_DEVICES"] == "MIG-1b2c3d4e-0000-5555-aaaa-000000000002"


@pytest.mark.parametrize("visible", ["0,1", "GPU-aaaa,GPU-bbbb", "MIG-1b2c3d4e-0000-5555-aaaa-000000000001", ""])
def test_whole_gpus_or_one_instance_are_left_as_they_are(visible):
    environ = {"CUDA_VISIBLE_DEVICES": visible, "LOCAL_RANK": "1"}
    assert pin_mig_instance(environ) is None
    assert environ == {"CUDA_VISIBLE_DEVICES": visible, "LOCAL_RANK": "1"}
    assert (cuda_device_index(environ), cuda_backend(environ)) == (1, "nccl")


def test_a_rank_without_an_instance_is_told_how_many_ranks_fit():
    with pytest.raises(ConfigError, match=r"local rank 2 has no MIG instance.*lists 2.*--nproc-per-node"):
        pin_mig_instance({"CUDA_VISIBLE_DEVICES": TWO_INSTANCES, "LOCAL_RANK": "2"})


def test_the_worker_pins_before_reading_its_config(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", TWO_INSTANCES)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.delenv(PINNED_ENV, raising=False)
    assert train.main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "local rank 3 has no MIG instance" in capsys.readouterr().err
