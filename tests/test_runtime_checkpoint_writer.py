"""Checkpoint files written in the background: the caller goes on, waits only where the files must exist,
hears of a failed write, and the snapshot is not changed by the training that goes on meanwhile."""
from __future__ import annotations

import threading

import pytest
import torch

from geodiloco.runtime import checkpoint
from geodiloco.runtime.checkpoint_writer import CheckpointWriter, CheckpointWriteError
from geodiloco.runtime.config import RunConfig
from geodiloco.runtime.idle import RoundClock
from geodiloco.runtime.state_file import encode_state, load_state


def test_a_background_write_runs_while_the_caller_goes_on_and_wait_returns_once_it_is_on_disk(tmp_path):
    release = threading.Event()
    snapshot = encode_state({"round": 3, "weights": torch.arange(4.0)})

    def write() -> None:
        release.wait(timeout=30)
        checkpoint.save_node(tmp_path, 3, "a", snapshot)

    writer = CheckpointWriter(background=True)
    writer.submit(write, "round 4 of node a")
    path = checkpoint.round_dir(tmp_path, 3) / checkpoint.node_file_name("a")
    assert writer.writing and not path.exists()
    release.set()
    writer.wait()
    assert not writer.writing
    assert torch.equal(load_state(path)["weights"], torch.arange(4.0))


def test_a_failed_write_is_raised_at_the_next_wait_once_naming_the_round():
    def write() -> None:
        raise OSError(28, "No space left on device")

    writer = CheckpointWriter(background=True)
    writer.submit(write, "round 4 of node a")
    with pytest.raises(CheckpointWriteError) as err:
        writer.wait()
    assert "round 4 of node a" in str(err.value) and "No space left on device" in str(err.value)
    assert writer.wait() == 0.0  # reported once; nothing else is under way


def test_close_returns_the_error_instead_of_raising():
    writer = CheckpointWriter(background=True)
    writer.submit(lambda: (_ for _ in ()).throw(PermissionError("read-only file system")), "round 1 of node b")
    error = writer.close()
    assert isinstance(error, CheckpointWriteError) and "read-only file system" in str(error)
    assert writer.close() is None


def test_a_second_write_starts_only_after_the_first_has_ended():
    order: list[str] = []
    first_may_end = threading.Event()

    def first() -> None:
        first_may_end.wait(timeout=30)
        order.append("first")

    writer = CheckpointWriter(background=True)
    writer.submit(first, "round 1")
    threading.Timer(0.2, first_may_end.set).start()
    writer.submit(lambda: order.append("second"), "round 2")
    writer.wait()
    assert order == ["first", "second"]


def test_without_background_the_write_is_done_and_its_error_raised_in_the_caller(tmp_path):
    writer = CheckpointWriter(background=False)
    writer.submit(lambda: checkpoint.save_global(tmp_path, 0, {"round": 0}), "round 1")
    assert not writer.writing and checkpoint.has_global(tmp_path, 0)
    with pytest.raises(CheckpointWriteError, match="round 2"):
        writer.submit(lambda: (_ for _ in ()).throw(OSError("disk gone")), "round 2")


def test_the_snapshot_keeps_the_values_of_the_moment_it_was_taken(tmp_path):
    """The next local phase updates parameters and optimizer moments in place while the file is written."""
    weights = torch.ones(3)
    moments = {"state": {0: {"exp_avg": torch.full((3,), 0.5)}}}
    snapshot = encode_state({"weights": weights, "optimizer": moments})
    weights.add_(10.0)
    moments["state"][0]["exp_avg"].mul_(0.0)
    checkpoint.save_node(tmp_path, 0, "a", snapshot)
    saved = checkpoint.load_node(tmp_path, 0, "a")
    assert saved["weights"].tolist() == [1.0, 1.0, 1.0]
    assert saved["optimizer"]["state"][0]["exp_avg"].tolist() == [0.5, 0.5, 0.5]


def test_a_wait_for_the_write_before_the_exchange_is_overhead_not_waiting_for_peers():
    clock = RoundClock(marks={"start": 100.0, "local_done": 110.0, "ready": 112.0, "synced": 113.0, "end": 114.0})
    clock.checkpoint_wait_s = 0.5
    assert clock.compute_s == 10.0
    assert clock.wait_s == pytest.approx(1.5)
    assert clock.comm_s == pytest.approx(1.0)
    assert clock.overhead_s == pytest.approx(1.0 + 0.5)
    assert clock.compute_s + clock.wait_s + clock.comm_s + clock.overhead_s == pytest.approx(14.0)


def test_background_writes_are_the_default_and_can_be_switched_off():
    nodes = [{"name": "a", "gpus": []}]
    assert RunConfig.model_validate({"nodes": nodes}).checkpoint.background is True
    assert RunConfig.model_validate({"nodes": nodes, "checkpoint": {"background": False}}).checkpoint.background is False


def test_a_snapshot_reuses_the_host_buffers_of_the_last_one_and_holds_the_new_values(tmp_path):
    first = encode_state({"weights": torch.zeros(4), "moments": [torch.zeros(2, 2)]})
    buffers = [first.tensors[key].data_ptr() for key in sorted(first.tensors)]
    second = encode_state({"weights": torch.arange(4.0), "moments": [torch.full((2, 2), 7.0)]}, reuse=first)
    assert [second.tensors[key].data_ptr() for key in sorted(second.tensors)] == buffers
    checkpoint.save_node(tmp_path, 1, "a", second)
    saved = checkpoint.load_node(tmp_path, 1, "a")
    assert saved["weights"].tolist() == [0.0, 1.0, 2.0, 3.0] and saved["moments"][0].tolist() == [[7.0, 7.0]] * 2


def test_a_tensor_whose_shape_or_dtype_changed_gets_a_new_buffer():
    first = encode_state({"weights": torch.zeros(4), "step": torch.tensor(1.0)})
    second = encode_state({"weights": torch.zeros(5), "step": torch.tensor(2, dtype=torch.int64)}, reuse=first)
    assert second.tensors["t0"].shape == (5,) and second.tensors["t1"].dtype == torch.int64
    assert second.tensors["t0"].data_ptr() != first.tensors["t0"].data_ptr()
    assert first.tensors["t0"].tolist() == [0.0] * 4  # the old snapshot was not written into
