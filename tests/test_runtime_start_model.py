"""One initial model and one rounding of the outer step on every node (runtime/sync/start_model.py).

A site whose CPU lacks the vectorized kernels is emulated with ``ATEN_CPU_CAPABILITY=default``: torch then
draws normal samples and takes the fused outer step with its scalar kernels, as on a CPU without AVX2."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from geodiloco.runtime.diloco import OuterState, portable_sgd_step
from geodiloco.runtime.launch import free_port
from geodiloco.runtime.sync.start_model import StartReport, agree, tensors_digest
from tests.runtime_helpers import REPO_ROOT, read_jsonl, small_config, write_config
from tests.test_runtime_outer_step import assert_outer_steps_follow_the_formula, two_layer_model
from tests.test_runtime_torchrun import torchrun_site

SIMD = torch.backends.cpu.get_cpu_capability() != "DEFAULT"


def report(node: str, params: str = "p", rounding: str = "r", where: str = "x86_64 with AVX2 CPU kernels") -> StartReport:
    return StartReport(node, params, rounding, where)


def test_nodes_that_agree_start_as_they_are_with_torchs_own_step():
    agreement = agree([report("a"), report("b"), report("c")], fresh=True)
    assert (agreement.source, agreement.receivers, agreement.portable, agreement.notices) == ("a", (), False, ())


def test_nodes_whose_initial_parameters_differ_take_the_first_nodes_and_the_notice_names_the_platforms():
    agreement = agree([report("a"), report("b", params="q", where="aarch64 with SVE256 CPU kernels"),
                       report("c")], fresh=True)
    assert agreement.receivers == ("b",) and not agreement.portable
    assert agreement.notices == (
        "node(s) b start from other initial parameters than node a (a: x86_64 with AVX2 CPU kernels; b: aarch64 "
        "with SVE256 CPU kernels; one seed draws other weights on other CPU kernels or torch releases): every node "
        "starts from node a's, sent once over the leaders' group",)


def test_a_resumed_run_sends_no_initial_model_but_still_agrees_on_the_rounding():
    agreement = agree([report("a", params="p"), report("b", params="", rounding="s", where="NVIDIA A30, torch 2.5")],
                      fresh=False)
    assert agreement.receivers == () and agreement.portable
    assert agreement.notices == (
        "the nodes' outer steps round differently (a: x86_64 with AVX2 CPU kernels; b: NVIDIA A30, torch 2.5): "
        "every node takes the portable outer step (separate multiplies and adds) so that all keep bitwise the "
        "same global model (docs/runtime.md)",)


def test_no_report_is_an_error():
    with pytest.raises(ValueError, match="no node leader reported"):
        agree([], fresh=True)


@pytest.mark.parametrize("nesterov", [True, False])
def test_the_portable_step_follows_sgds_formula(nesterov):
    outer = OuterState(two_layer_model(), lr=0.7, momentum=0.9, nesterov=nesterov)
    outer.portable = True
    assert_outer_steps_follow_the_formula(outer, count=3, seed=3, nesterov=nesterov)


def test_the_portable_steps_momentum_resumes_on_torchs_fused_step():
    torch.manual_seed(4)
    steps = [torch.randn(sum(p.numel() for p in two_layer_model().parameters())) * 0.1 for _ in range(3)]
    portable = OuterState(two_layer_model(), lr=0.7, momentum=0.9, nesterov=True)
    portable.portable = True
    for flat in steps[:2]:
        portable.apply(flat)
    fused = OuterState(two_layer_model(), lr=0.7, momentum=0.9, nesterov=True)
    fused.load_state_dict(copy.deepcopy(portable.state_dict()))
    portable.apply(steps[2])
    fused.apply(steps[2])
    for got, want in zip(fused.global_params, portable.global_params):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_dampening_is_refused_by_the_portable_step():
    param = torch.zeros(3)
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9, dampening=0.5)
    param.grad = torch.ones(3)
    with pytest.raises(ValueError, match="no dampening or weight decay"):
        portable_sgd_step(optimizer)


PROBE = """
import json, torch
from geodiloco.runtime.config import ModelSection
from geodiloco.runtime.diloco import outer_sgd, portable_sgd_step
from geodiloco.runtime.models import build_model
from geodiloco.runtime.sync.start_model import probe_values, rounding_digest, tensors_digest
model = build_model(ModelSection(preset="tiny", seq_len=32).dims(), seed=0)
param = probe_values(4)
optimizer = outer_sgd([param], 0.7, 0.9, True)
for salt in (1, 2, 3):
    param.grad = probe_values(salt) * 0.01
    portable_sgd_step(optimizer)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                  "init": tensors_digest(list(model.parameters())),
                  "rounding": rounding_digest(torch.device("cpu"), 0.7, 0.9, True),
                  "portable": tensors_digest([param, optimizer.state[param]["momentum_buffer"]])}))
"""


def probe_under(capability: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO_ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not SIMD, reason="this CPU has no vectorized kernels to compare with the scalar ones")
def test_scalar_and_vectorized_kernels_differ_in_init_and_fused_step_but_not_in_the_portable_step():
    vectorized, scalar = probe_under(None), probe_under("default")
    assert scalar["capability"] == "DEFAULT" and vectorized["capability"] != "DEFAULT"
    # what the start agreement is there for: the same seed, other weights; the fused step, other bits
    assert scalar["init"] != vectorized["init"]
    assert scalar["rounding"] != vectorized["rounding"]
    assert scalar["portable"] == vectorized["portable"]


@pytest.mark.slow
@pytest.mark.skipif(not SIMD, reason="this CPU has no vectorized kernels to compare with the scalar ones")
@pytest.mark.parametrize("overlap,compression", [("none", "none"), ("streaming", "int8")])
def test_a_site_with_scalar_kernels_trains_on_bitwise_the_same_global_model(tmp_path, overlap, compression):
    nodes = [{"name": "a", "gpus": ["A30"], "local_steps": 3, "batch_size": 4, "emulate": {"step_time_s": 0.05}},
             {"name": "b", "gpus": ["RTX 3090"], "local_steps": 3, "batch_size": 4, "emulate": {"step_time_s": 0.05}}]
    config = small_config(nodes)
    config["diloco"].update(rounds=3, overlap=overlap, compression=compression)
    config_path, run_dir, port = write_config(tmp_path, config), tmp_path / "run", free_port()
    sites = [torchrun_site(config_path, run_dir, "a", 1, port, True),
             torchrun_site(config_path, run_dir, "b", 1, port, False, env_extra={"ATEN_CPU_CAPABILITY": "default"})]
    outputs = ["".join(site.communicate(timeout=150)) for site in sites]
    assert [site.returncode for site in sites] == [0, 0], "\n".join(output[-2000:] for output in outputs)

    for output in outputs:
        assert "node(s) b start from other initial parameters than node a" in output
        assert "with DEFAULT CPU kernels" in output
        assert "every node takes the portable outer step" in output
    assert "final parameter checksum" in outputs[0] and "on every rank: a, b" in outputs[0]
    assert "ended on different parameters" not in outputs[0]
    if overlap == "none":  # blocking: every round starts on the global model, the same on both nodes
        metrics = [row for row in read_jsonl(run_dir / "metrics.jsonl") if row["node"] != "global"]
        for round_idx in range(3):
            checksums = {row["node"]: row["start_checksum"] for row in metrics if row["round"] == round_idx}
            assert len(checksums) == 2 and len(set(checksums.values())) == 1, checksums


def test_the_digest_sees_one_bit_and_the_shape():
    values = torch.tensor([1.0, 2.0, 3.0])
    flipped = values.clone()
    flipped.view(torch.int32)[1] ^= 1
    assert tensors_digest([values]) != tensors_digest([flipped])
    assert tensors_digest([values]) != tensors_digest([values.view(3, 1)])
    assert tensors_digest([values]) == tensors_digest([values.clone()])


def test_with_one_global_copy_the_rounding_is_not_agreed_on_but_the_initial_model_is():
    agreement = agree([report("a"), report("b", params="q", rounding="s")], fresh=True, rounding_matters=False)
    assert agreement.receivers == ("b",) and not agreement.portable and len(agreement.notices) == 1
