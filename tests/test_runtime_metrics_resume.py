"""A resumed run's TensorBoard and W&B logs: rounds trained again replace the points logged before the stop
(TensorBoard purges them), and W&B goes on in the same run, charted by round."""
from __future__ import annotations

import os

from geodiloco.runtime.metrics_sinks import TensorBoardWriter, WandbWriter


def scalar_points(log_dir, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, round(event.value, 6)) for event in events.Scalars(tag)]


def test_a_resumed_tensorboard_log_shows_each_round_once_with_the_values_trained_again(tmp_path):
    first = TensorBoardWriter(tmp_path)
    for round_idx in range(6):  # stopped after round 5; the last checkpoint is round 2's
        first.scalars({"node/a/compute_s": 1.0 + round_idx}, round_idx)
    first.close()
    resumed = TensorBoardWriter(tmp_path, first_round=3)
    for round_idx in range(3, 5):
        resumed.scalars({"node/a/compute_s": 10.0 + round_idx}, round_idx)
    resumed.close()
    assert scalar_points(tmp_path, "node/a/compute_s") == [(0, 1.0), (1, 2.0), (2, 3.0), (3, 13.0), (4, 14.0)]


def test_a_resumed_run_goes_on_in_the_same_wandb_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    id_file = tmp_path / ".wandb_run_id.a"
    first = WandbWriter("geodiloco-test", "run-1", tmp_path, "offline", None, {}, id_file, first_round=0)
    first_id = first.run.id
    first.scalars({"global/eval_loss": 3.0}, 0)
    first.close()
    assert id_file.read_text().strip() == first_id
    resumed = WandbWriter("geodiloco-test", "run-1", tmp_path, "offline", None, {}, id_file, first_round=1)
    assert resumed.run.id == first_id
    resumed.close()
    fresh = WandbWriter("geodiloco-test", "run-1", tmp_path, "offline", None, {}, id_file, first_round=0)
    assert fresh.run.id != first_id  # a new run in the same directory (a first round of 0) starts a W&B run of its own
    fresh.close()
    assert os.listdir(tmp_path / "wandb")


def test_a_stop_that_lands_inside_a_metrics_write_stops_the_run_and_keeps_the_writer():
    """Ctrl-C raises StopRequested wherever the main thread is; inside a TensorBoard write it was taken for the
    writer's failure, which turned TensorBoard off for the rest of the run (its last rounds went missing)."""
    import pytest

    from geodiloco.runtime.metrics_sinks import MetricSinks
    from geodiloco.runtime.train import StopRequested

    class Interrupted:
        def scalars(self, values, step):
            raise StopRequested("SIGTERM")

        def close(self):
            pass

    writer = Interrupted()
    sinks = MetricSinks([writer])
    with pytest.raises(StopRequested):
        sinks.rows("metrics.jsonl", [{"round": 3, "node": "global", "tokens": 10}])
    assert sinks.writers == [writer]
