"""model.precision -> autocast and loss scaling of the inner steps (runtime/precision.py).

CUDA's own kernels are checked by experiments/gpu/validate.py on a GPU; here the choice of
what runs, and the loss-scale arithmetic, on CPU tensors (GradScaler works on the CPU too).
"""
from __future__ import annotations

import warnings

import pytest
import torch

from geodiloco.runtime.batching import accumulate_gradients
from geodiloco.runtime import precision
from geodiloco.runtime.precision import TrainingPrecision, node_all, node_has_bf16, training_precision

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)


def cuda_choice(requested: str, bf16_supported: bool) -> TrainingPrecision:
    with warnings.catch_warnings():  # GradScaler('cuda') warns on a machine without CUDA
        warnings.simplefilter("ignore")
        return training_precision(requested, CUDA, bf16_supported=bf16_supported)


@pytest.mark.parametrize("requested", ["fp32", "bf16", "fp16"])
def test_the_cpu_trains_fp32_whatever_is_asked(requested):
    chosen = training_precision(requested, CPU)
    assert (chosen.name, chosen.autocast_dtype, chosen.scaler) == ("fp32", None, None)
    assert bool(chosen.note) == (requested != "fp32")
    if chosen.note:
        assert f"model.precision {requested}" in chosen.note and "CPU trains fp32" in chosen.note


def test_a_gpu_with_bf16_autocasts_bf16_without_loss_scale():
    chosen = cuda_choice("bf16", bf16_supported=True)
    assert (chosen.name, chosen.autocast_dtype, chosen.scaler, chosen.note) == ("bf16", torch.bfloat16, None, "")


def test_a_gpu_without_bf16_trains_fp16_with_a_loss_scale_and_says_so():
    chosen = cuda_choice("bf16", bf16_supported=False)
    assert chosen.name == "fp16" and chosen.autocast_dtype == torch.float16
    assert isinstance(chosen.scaler, torch.amp.GradScaler)
    assert "no bf16" in chosen.note and "fp16" in chosen.note


@pytest.mark.parametrize("capability, hip, has_bf16", [
    ((6, 1), None, False),   # GTX 1080 Ti, P40: bf16 only emulated
    ((7, 0), None, False),   # V100
    ((7, 5), None, False),   # T4, RTX 2080 Ti
    ((8, 0), None, True),    # A100
    ((8, 6), None, True),    # RTX 3090, A40
    ((9, 0), None, True),    # H100
    ((9, 4), "6.2", True),   # any ROCm GPU (MI250X's gfx90a reports 9.x)
])
def test_bf16_counts_only_where_the_gpu_computes_it_not_where_torch_emulates_it(monkeypatch, capability, hip,
                                                                                has_bf16):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # emulation works
    monkeypatch.setattr(torch.version, "hip", hip)
    assert precision.cuda_has_bf16() is has_bf16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chosen = training_precision("bf16", CUDA)
    assert chosen.name == ("bf16" if has_bf16 else "fp16")


def test_fp16_always_has_a_loss_scale_and_fp32_has_nothing():
    fp16 = cuda_choice("fp16", bf16_supported=True)
    assert fp16.autocast_dtype == torch.float16 and fp16.scaler is not None and fp16.note == ""
    fp32 = cuda_choice("fp32", bf16_supported=True)
    assert (fp32.autocast_dtype, fp32.scaler) == (None, None)


def test_an_unknown_precision_names_the_field():
    with pytest.raises(ValueError, match="model.precision must be fp32, bf16 or fp16, got 'int8'"):
        training_precision("int8", CPU)


def test_the_autocast_context_runs_matmuls_in_the_chosen_dtype():
    left, right = torch.ones(4, 4), torch.ones(4, 4)
    with TrainingPrecision("bf16", "cpu", torch.bfloat16).autocast():
        assert (left @ right).dtype == torch.bfloat16
    with TrainingPrecision("fp32", "cpu").autocast():
        assert (left @ right).dtype == torch.float32


def scaled_sgd(initial_scale: float) -> tuple[torch.nn.Parameter, torch.optim.SGD, TrainingPrecision]:
    weight = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=initial_scale, growth_interval=1000)
    return weight, optimizer, TrainingPrecision("fp16", "cpu", None, scaler)


def test_a_loss_scaled_step_applies_the_unscaled_gradient_clipped():
    weight, optimizer, precision = scaled_sgd(initial_scale=1024.0)
    precision.backward((weight ** 2).sum())  # gradient 2w = [2, -4], norm 4.47 before the scale
    assert weight.grad.tolist() == [2048.0, -4096.0]
    clipped_norms = []
    stepped = precision.step(optimizer, lambda: clipped_norms.append(
        torch.nn.utils.clip_grad_norm_([weight], max_norm=1.0)))
    assert stepped
    assert clipped_norms[0].item() == pytest.approx(20 ** 0.5)  # clipping saw the unscaled gradient
    unit = torch.tensor([2.0, -4.0]) / 20 ** 0.5
    assert weight.detach().tolist() == pytest.approx((torch.tensor([1.0, -2.0]) - 0.1 * unit).tolist())
    assert precision.state_dict()["scale"] == 1024.0


def test_an_overflowing_step_is_skipped_and_the_scale_halved():
    weight, optimizer, precision = scaled_sgd(initial_scale=1024.0)
    precision.backward((weight * float("inf")).sum())
    stepped = precision.step(optimizer, lambda: None)
    assert not stepped
    assert weight.detach().tolist() == [1.0, -2.0]
    assert precision.state_dict()["scale"] == 512.0


def test_the_loss_scale_survives_a_checkpoint_round_trip():
    _, _, saved = scaled_sgd(initial_scale=256.0)
    _, _, restored = scaled_sgd(initial_scale=65536.0)
    restored.load_state_dict(saved.state_dict())
    assert restored.scaler.get_scale() == 256.0
    assert TrainingPrecision("fp32", "cpu").state_dict() == {}
    TrainingPrecision("fp32", "cpu").load_state_dict({"scale": 2.0})  # no scaler: nothing to restore


class LinearLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8, bias=False)
        torch.nn.init.eye_(self.proj.weight)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.seen_dtype = self.proj(inputs.float()).dtype
        return ((self.proj(inputs.float()) - targets.float()) ** 2).mean()


def test_the_inner_step_forward_runs_under_the_nodes_autocast_and_keeps_fp32_gradients():
    model = LinearLoss()
    batch = (torch.ones(4, 8), torch.zeros(4, 8))
    accumulate_gradients(model, lambda samples: batch, 4, 4, 0, 1, CPU,
                         precision=TrainingPrecision("bf16", "cpu", torch.bfloat16))
    assert model.seen_dtype == torch.bfloat16
    assert model.proj.weight.grad.dtype == torch.float32
    # d/dW mean((W x - 0)^2) at W = I, x = 1: 2 x^T x / 8 = 0.25 in every entry (exact in bf16)
    assert torch.allclose(model.proj.weight.grad, torch.full((8, 8), 0.25))


def _agree_rank(rank: int, port: int, flags: list[bool], results) -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(len(flags)))
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    try:
        node = dist.new_group(list(range(len(flags))))
        results[rank] = node_all(flags[rank], node)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("flags, agreed", [([True, False, True], False), ([True, True, True], True)])
def test_the_ranks_of_a_node_agree_on_bf16_so_ddp_never_mixes_scaled_gradients(flags, agreed):
    import torch.multiprocessing as mp

    from geodiloco.runtime.launch import free_port

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_agree_rank, args=(free_port(), flags, results), nprocs=len(flags), join=True)
        assert dict(results) == {rank: agreed for rank in range(len(flags))}


def test_a_node_of_one_rank_decides_alone_and_a_cpu_node_has_no_answer():
    assert node_all(False, None) is False and node_all(True, None) is True
    assert node_has_bf16(CPU, None) is None
