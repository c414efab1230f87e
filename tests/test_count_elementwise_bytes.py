"""The byte counter behind experiments/predictor/count_elementwise_bytes.py: bytes of hand-sized ops,
views free, the embedding's bytes per token by hand, and fake tensors counting what real ones do."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "predictor"))

import count_elementwise_bytes as counting  # noqa: E402

from geodiloco.predictor.workload import ModelDims  # noqa: E402

DIMS = ModelDims(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4, vocab_size=50, max_seq_len=16)


def test_an_op_is_charged_every_tensor_it_reads_and_writes_and_a_view_nothing():
    first, second = torch.ones(1000), torch.ones(1000)
    counter = counting.ByteCounter()
    with counter:
        _ = first + second                       # reads 2 x 4000 B, writes 4000 B
        first.add_(second)                       # in place: the same 3 tensors
        _ = first.view(10, 100).t()              # views: nothing moves
        _ = torch.ones(10, 20) @ torch.ones(20, 30)
    assert counter.bytes_by_class["elementwise"] == 2 * 3 * 4000
    # the matmul: two inputs and the product; torch.ones itself makes a tensor out of nothing
    assert counter.bytes_by_class["matmul"] == 4 * (10 * 20 + 20 * 30 + 10 * 30)


def test_the_embedding_moves_its_rows_and_indices_per_token():
    small, large = counting.counted_steps(DIMS, (1, 3), 8, "fp32")
    tokens = 2 * 8
    per_token = (large.bytes_by_class["embedding"] - small.bytes_by_class["embedding"]) / tokens
    # forward: an int64 index in, a row of 32 fp32 out; backward: that row's gradient and the index in
    # (the table-sized weight and its gradient are per step, so they cancel between the two batches)
    assert per_token == 2 * (8 + 4 * DIMS.hidden_size)


def test_the_head_marks_the_loss_from_its_forward_to_its_backward():
    small, large = counting.counted_steps(DIMS, (1, 2), 8, "fp32")
    assert large.bytes_by_class["vocab_loss"] > small.bytes_by_class["vocab_loss"] > 0
    assert not any(op.startswith("vocab_loss:embedding") or op.startswith("vocab_loss:_scaled_dot")
                   for op in large.bytes_by_op)
    assert counting.op_class("mm", in_loss=True) == "matmul"  # the head's own GEMMs stay GEMMs


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fake_tensors_count_the_bytes_real_steps_move(precision):
    fake = counting.counted_steps(DIMS, (1, 2), 8, precision, fake=True)
    real = counting.counted_steps(DIMS, (1, 2), 8, precision, fake=False)
    for fake_step, real_step in zip(fake, real):
        assert dict(fake_step.bytes_by_class) == dict(real_step.bytes_by_class)


def test_the_script_refuses_bad_options_naming_them(capsys):
    with pytest.raises(SystemExit) as exited:
        counting.main(["--batch-sizes", "4,2", "--no-write"])
    assert exited.value.code == 2
    assert "--batch-sizes" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        counting.main(["--presets", "llama-7b", "--no-write"])
    assert exited.value.code == 2
    assert "unknown model preset 'llama-7b'" in capsys.readouterr().err


def test_gelu_new_moves_the_passes_the_predictor_gives_it():
    """HuggingFace GPT-2's gelu_new, written as eager ops: the bytes its dispatched ops move per MLP element,
    forward + backward, are the passes predictor.workload charges for it (fp32: 4 B per pass)."""
    from transformers.activations import NewGELUActivation

    from geodiloco.predictor.workload import GELU_NEW_PASSES

    inputs = torch.randn(100, 64, requires_grad=True)
    counter = counting.ByteCounter()
    with counter:
        outputs = NewGELUActivation()(inputs)
        outputs.backward(torch.ones_like(outputs))
    assert counter.bytes_by_class["elementwise"] == GELU_NEW_PASSES * 4 * inputs.numel()
    inputs.grad = None  # a second backward would add into it: an extra pass not part of the activation
    fused = counting.ByteCounter()
    with fused:
        outputs = torch.nn.functional.gelu(inputs)
        outputs.backward(torch.ones_like(outputs))
    # one kernel each way: read + write forward, read 2 + write backward (the hand count rounds it to 6 passes)
    assert fused.bytes_by_class["elementwise"] == 5 * 4 * inputs.numel()
