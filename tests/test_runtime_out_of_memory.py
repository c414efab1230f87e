"""A node whose GPU memory runs out trains on in smaller passes over the same samples, or stops with what
to change. The allocations that fail here are real: more bytes than any machine holds, asked of torch's
allocator, which refuses them (the CPU allocator's "can't allocate memory"; CUDA's OutOfMemoryError is
the same path on a GPU)."""
import contextlib
import io
import time

import pytest
import torch
import torch.distributed as dist

from geodiloco.balancer.plan import NodePlan
from geodiloco.common.schema import ConfigError
from geodiloco.runtime.batching import is_out_of_memory, run_fitting
from geodiloco.runtime.comm import build_topology
from geodiloco.runtime.config import parse_config
from geodiloco.runtime.launch import free_port
from geodiloco.runtime.trainer import NodeTrainer

SEQ_LEN = 16
UNAVAILABLE_BYTES_PER_SAMPLE = 1 << 43  # 8 TiB a sample: every allocator refuses it


def allocate_beyond_memory(samples: int) -> None:
    torch.empty(samples * UNAVAILABLE_BYTES_PER_SAMPLE, dtype=torch.uint8)


def test_an_allocation_beyond_memory_is_out_of_memory_and_other_errors_are_not():
    with pytest.raises(RuntimeError) as refused:
        allocate_beyond_memory(1)
    assert is_out_of_memory(refused.value)
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))


def test_passes_are_halved_until_they_fit_and_each_failed_attempt_is_undone():
    attempts, resets = [], []

    def attempt(micro):
        attempts.append(micro)
        if micro > 3:
            allocate_beyond_memory(micro)
        return f"trained in passes of {micro}"

    result, fitted = run_fitting(attempt, 16, lambda: resets.append(attempts[-1]))
    assert (result, fitted) == ("trained in passes of 2", 2)
    assert attempts == [16, 8, 4, 2] and resets == [16, 8, 4]


def test_one_sample_that_does_not_fit_and_any_other_error_are_raised_as_they_are():
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        run_fitting(allocate_beyond_memory, 4, lambda: None)
    calls = []

    def broken(micro):
        calls.append(micro)
        raise ValueError("not a memory problem")

    with pytest.raises(ValueError):
        run_fitting(broken, 8, lambda: None)
    assert calls == [8]


@pytest.fixture(scope="module", autouse=True)
def one_node_world():
    """A world of one gloo rank in this process, which a node's trainer runs in."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def node_trainer(run_dir, fits_samples=None) -> NodeTrainer:
    """A one-GPU node of a tiny model; with ``fits_samples``, a pass of more samples asks for more memory
    than there is."""
    config = parse_config({"model": {"seq_len": SEQ_LEN}, "data": {"max_bytes": 20_000, "eval_batches": 0},
                           "nodes": [{"name": "solo"}]}, "<test>")
    trainer = NodeTrainer(config, build_topology("solo", ["solo"]), run_dir, torch.device("cpu"))
    if fits_samples is not None:
        forward = trainer.model.forward

        def forward_that_allocates(inputs, targets):
            if inputs.shape[0] > fits_samples:
                allocate_beyond_memory(inputs.shape[0])
            return forward(inputs, targets)

        trainer.model.forward = forward_that_allocates
    return trainer


def train_two_steps(trainer: NodeTrainer, micro_batch_size: int) -> str:
    notices = io.StringIO()
    with contextlib.redirect_stderr(notices):
        trainer.local_phase(0, NodePlan(name="solo", local_steps=2, batch_size=8, micro_batch_size=micro_batch_size),
                            time.perf_counter())
    return notices.getvalue()


def test_a_step_that_runs_out_of_memory_trains_the_same_samples_in_smaller_passes(tmp_path):
    short_of_memory = node_trainer(tmp_path / "short", fits_samples=2)
    notices = train_two_steps(short_of_memory, micro_batch_size=8)
    planned_small = node_trainer(tmp_path / "small")
    train_two_steps(planned_small, micro_batch_size=2)

    # 8 -> 4 -> 2 samples per pass; the failed passes left no gradient and took no samples
    for short, small in zip(short_of_memory.model.parameters(), planned_small.model.parameters()):
        torch.testing.assert_close(short, small, rtol=1e-5, atol=1e-6)
    assert short_of_memory.shard.position_state() == planned_small.shard.position_state()
    assert short_of_memory.micro_batch_cap == 2
    assert notices.count("out of GPU memory at 8 samples per pass (batch 8); training in passes of 2") == 1
    assert "balancing.memory_headroom" in notices


def test_memory_that_runs_out_after_a_pass_leaves_no_gradient_of_the_failed_attempt(tmp_path):
    """The first pass of 4 samples fits, the second does not (memory taken meanwhile): the step is
    redone in passes of 2 from its first sample, with the first pass's gradient dropped."""
    trainer = node_trainer(tmp_path / "fragmented")
    forward, large_passes = trainer.model.forward, []

    def forward_short_after_one_large_pass(inputs, targets):
        if inputs.shape[0] > 2:
            if large_passes:
                allocate_beyond_memory(inputs.shape[0])
            large_passes.append(inputs.shape[0])
        return forward(inputs, targets)

    trainer.model.forward = forward_short_after_one_large_pass
    train_two_steps(trainer, micro_batch_size=4)
    planned_small = node_trainer(tmp_path / "small")
    train_two_steps(planned_small, micro_batch_size=2)
    assert large_passes == [4] and trainer.micro_batch_cap == 2
    for fragmented, small in zip(trainer.model.parameters(), planned_small.model.parameters()):
        torch.testing.assert_close(fragmented, small, rtol=1e-5, atol=1e-6)


def test_the_warm_up_pass_finds_what_fits_and_leaves_the_data_where_it_was(tmp_path):
    trainer = node_trainer(tmp_path, fits_samples=3)
    before = trainer.shard.position_state()
    with contextlib.redirect_stderr(io.StringIO()) as notices:
        trainer.warm_up(8)
    assert trainer.micro_batch_cap == 2  # 8 and 4 did not fit, 2 did
    assert trainer.shard.position_state() == before
    assert all(param.grad is None for param in trainer.model.parameters())
    assert "warm-up pass of batch 8" in notices.getvalue()


def test_a_node_whose_model_does_not_fit_one_sample_stops_with_what_to_change(tmp_path):
    trainer = node_trainer(tmp_path, fits_samples=0)
    with pytest.raises(ConfigError) as stopped:
        train_two_steps(trainer, micro_batch_size=4)
    message = str(stopped.value)
    assert message.startswith("node solo ran out of GPU memory with one sample per pass (batch 8, seq_len 16")
    assert "the model does not fit this GPU" in message and "model.seq_len" in message
