"""experiments/gpu/loss_rate.py: the loss kernels picked out of a profile, the bytes they must move, the
table recomputed from stored measurements with and without the per-SM bound, and the command line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "experiments" / "gpu"
sys.path.insert(0, str(KIT))

import loss_rate  # noqa: E402
from geodiloco.predictor import kernels  # noqa: E402
from geodiloco.predictor.specs import lookup_gpu  # noqa: E402

FORWARD = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
           "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)")
BACKWARD = ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
            "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, int)")
NLL = ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, "
       "float*, float const*, long const*, float const*, bool, long, long, long, long)")
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >"


def test_the_loss_kernels_are_split_from_the_fills_and_named_largest_first():
    split = loss_rate.split_kernels([(FORWARD, 3000.0), (FILL, 500.0), (BACKWARD, 4000.0), (NLL, 40.0),
                                     (FORWARD, 1000.0)])
    assert split["loss_ms"] == pytest.approx(8.04)
    assert split["other_ms"] == pytest.approx(0.5)
    assert [name for name, _ in split["loss_kernels"]] == [FORWARD, BACKWARD, NLL]
    assert split["loss_kernels"][0][1] == pytest.approx(4.0)
    assert loss_rate.kernel_short_name(FORWARD) == "cunn_SoftMaxForward"


def test_the_kernels_must_move_five_passes_over_the_logits():
    assert loss_rate.kernel_bytes(32000, 1000, "fp32") == 5 * 1000 * 32000 * 4
    assert loss_rate.kernel_bytes(32000, 1000, "bf16") == 5 * 1000 * 32000 * 2


def test_the_table_is_recomputed_with_and_without_the_per_sm_bound(tmp_path):
    """H200 row (132 SMs, 4,800 GB/s): 1,000 rows of 32,000 fp32 logits are 1000 x 3 x 32000 x (4 + 4 + 8) B
    in the predictor's count; with the bound they stream at 132 x the fitted GB/s per SM, without it at the
    loss's share of the bus. 2 ms for 640 MB of kernel traffic is 320 GB/s."""
    stored = {"date": "2026-11-26T11:18:36+0000", "gpu": "NVIDIA H200", "row": "H200 141GB SXM5",
              "torch": "2.11.0+cu130",
              "rows": [{"vocab_size": 32000, "dtype": "fp32", "rows": 1000, "step_ms": 2.5, "loss_ms": 2.0,
                        "other_ms": 0.3, "loss_kernels": [[BACKWARD, 1.1], [FORWARD, 0.9]]}]}
    path = tmp_path / "loss_rate.json"
    path.write_text(json.dumps(stored))
    done = subprocess.run([sys.executable, str(KIT / "loss_rate.py"), "--render", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    table_row = next(line for line in (tmp_path / "loss_rate.md").read_text().splitlines() if line.startswith("| 32,000"))
    cells = [cell.strip() for cell in table_row.strip("|").split("|")]
    spec, eff = lookup_gpu("H200 141GB SXM5"), kernels.GPU_EFFICIENCY
    assert (spec.sm_count, spec.memory_bandwidth_gbps) == (132, 4800)
    loss_bytes = 1000 * 3 * 32000 * (4 + 4 + 8)
    assert float(cells[5]) == pytest.approx(loss_bytes / (132 * eff.vocab_softmax_gbps_per_sm * 1e9) * 1e3, abs=0.006)
    assert float(cells[6]) == pytest.approx(loss_bytes / (4800e9 * eff.vocab_softmax_bandwidth) * 1e3, abs=0.006)
    assert cells[7] == "320" and cells[8] == "0.07"
    assert cells[10] == "cunn_SoftMaxBackward, cunn_SoftMaxForward"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would really run")
def test_without_cuda_it_says_what_it_would_do_and_exits_0():
    done = subprocess.run([sys.executable, str(KIT / "loss_rate.py")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0
    assert done.stdout.startswith("no CUDA device") and "267735" in done.stdout


@pytest.mark.parametrize("argv,message", [
    (["--dtypes", "fp16"], "--dtypes: unknown dtype 'fp16'; choose from fp32, bf16"),
    (["--logit-gib", "0"], "--logit-gib must be > 0, got 0.0"),
    (["--render", "no-such.json"], "--render: no such file no-such.json"),
])
def test_bad_options_exit_2_and_name_the_option(argv, message):
    done = subprocess.run([sys.executable, str(KIT / "loss_rate.py"), *argv], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert message in done.stderr
