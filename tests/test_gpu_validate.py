"""The GPU check kit (experiments/gpu): its CPU-only behaviour, its pure helpers, and its
hardware-side code on the CPU, with out-of-memory faked at the step (the hardware boundary)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "experiments" / "gpu"
sys.path.insert(0, str(KIT))

import gpu_diloco  # noqa: E402
import gpu_sweep  # noqa: E402
from geodiloco.predictor.workload import resolve_dims  # noqa: E402
from geodiloco.runtime.config import parse_config  # noqa: E402


def load_validate():
    spec = importlib.util.spec_from_file_location("gpu_validate", KIT / "validate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": "", **(env_extra or {})}
    return subprocess.run([sys.executable, str(KIT / "validate.py"), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)


def oom() -> torch.cuda.OutOfMemoryError:
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


# ----------------------------------------------------------------------------- the script without CUDA


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would really run")
def test_without_cuda_the_script_prints_one_line_writes_nothing_and_exits_0(tmp_path):
    out = tmp_path / "out"
    result = run_script("--out", str(out))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("no CUDA device")
    assert "tiny@256, small@512, llama-150m@1024" in lines[0]
    assert result.stderr == ""
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would really run")
def test_without_cuda_the_line_follows_the_options():
    result = run_script("--presets", "small", "--seq-len", "128", "--batch-sizes", "8,2", "--skip-run")
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("no CUDA device")
    assert "small@128" in line and "batch 2,8" in line
    assert "DiLoCo" not in line


def test_bad_options_exit_2_before_anything_runs():
    too_long = run_script("--presets", "tiny", "--seq-len", "600")
    assert too_long.returncode == 2
    assert "exceeds tiny's max_seq_len 256" in too_long.stderr
    zero_batch = run_script("--batch-sizes", "0,4")
    assert zero_batch.returncode == 2
    assert "error: argument --batch-sizes: expected integers >= 1, got '0,4'" in zero_batch.stderr
    one_round = run_script("--run-rounds", "1")
    assert one_round.returncode == 2
    assert "error: --run-rounds must be >= 2 (the check compares the first and last round's loss)" in one_round.stderr
    for refused in (too_long, zero_batch, one_round):  # refused before any sweep or run started
        assert refused.stdout == ""


def test_help_explains_every_option():
    result = run_script("--help")
    assert result.returncode == 0
    for option in ("--presets", "--batch-sizes", "--seq-len", "--precision", "--warmup-steps", "--steps",
                   "--no-max-batch-search", "--gpu", "--skip-sweep", "--skip-run", "--run-preset", "--run-seq-len",
                   "--run-batch-size", "--run-rounds", "--run-local-steps", "--run-timeout-s", "--out"):
        assert option in result.stdout
    assert "no CUDA device" in result.stdout


def test_parse_args_resolves_each_presets_default_sequence_length():
    validate = load_validate()
    args, presets, run_seq_len = validate.parse_args([])
    assert {name: seq for name, (_, seq) in presets.items()} == {"tiny": 256, "small": 512, "llama-150m": 1024}
    assert run_seq_len == 1024 and args.batch_sizes == [1, 2, 4, 8, 16, 32] and args.max_batch_search
    _, presets, _ = validate.parse_args(["--presets", "small,tiny", "--seq-len", "64"])
    assert {name: seq for name, (_, seq) in presets.items()} == {"small": 64, "tiny": 64}


def test_outputs_are_named_by_the_gpu_slug(tmp_path):
    validate = load_validate()
    text_path, json_path = validate.output_paths(tmp_path, "NVIDIA H100 80GB HBM3")
    validate.write_outputs(text_path, json_path, "printed\n", {"points": [1]})
    assert text_path == tmp_path / "nvidia-h100-80gb-hbm3.txt"
    assert text_path.read_text() == "printed\n"
    assert json.loads(json_path.read_text()) == {"points": [1]}


# ----------------------------------------------------------------------------- pure sweep helpers


def test_relative_error_is_signed_and_relative_to_the_measurement():
    assert gpu_sweep.relative_error(0.11, 0.10) == pytest.approx(0.10)
    assert gpu_sweep.relative_error(0.05, 0.10) == pytest.approx(-0.50)
    with pytest.raises(ValueError):
        gpu_sweep.relative_error(0.1, 0.0)


def test_median_ignores_one_slow_step():
    assert gpu_sweep.median_s([0.10, 0.11, 0.90]) == pytest.approx(0.11)
    with pytest.raises(ValueError):
        gpu_sweep.median_s([])


def test_sweep_stops_at_the_first_oom_and_releases_memory_once():
    attempted, released = [], []

    def time_batch(batch):
        attempted.append(batch)
        if batch > 8:
            raise oom()
        return [0.01 * batch] * 3, 0.5 * batch

    points = gpu_sweep.sweep_batches([1, 2, 4, 8, 16, 32], time_batch, lambda: released.append(True))
    assert attempted == [1, 2, 4, 8, 16]
    assert [(p.batch_size, p.ran, p.oom) for p in points] == [
        (1, True, False), (2, True, False), (4, True, False), (8, True, False), (16, False, True)]
    assert points[3].peak_memory_gib == 4.0
    assert released == [True]
    assert gpu_sweep.sweep_bracket(points) == (8, 16)


def test_sweep_without_oom_runs_every_batch_and_releases_nothing():
    released = []
    points = gpu_sweep.sweep_batches([1, 2], lambda batch: ([0.1], None), lambda: released.append(True))
    assert [p.ran for p in points] == [True, True]
    assert released == []
    assert gpu_sweep.sweep_bracket(points) == (2, None)


def test_a_library_allocation_failure_counts_as_oom_and_other_errors_do_not():
    def cublas_alloc_failed(batch):
        if batch >= 4:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        return [0.1], None

    points = gpu_sweep.sweep_batches([2, 4, 8], cublas_alloc_failed, lambda: None)
    assert [(p.batch_size, p.oom, p.error) for p in points] == [(2, False, ""), (4, True, "")]

    def broken_kernel(batch):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    points = gpu_sweep.sweep_batches([1, 2], broken_kernel, lambda: None)
    assert len(points) == 1 and not points[0].oom and "illegal memory access" in points[0].error
    assert gpu_sweep.sweep_bracket(points) == (0, None)


def test_search_bisects_between_the_sweeps_bracket():
    probed = []

    def fits(batch):
        probed.append(batch)
        return batch <= 37

    result = gpu_sweep.search_largest_fit(32, 64, fits)
    assert (result.largest_fit, result.first_oom, result.stopped_by) == (37, 38, "")
    assert probed == [48, 40, 36, 38, 37]
    assert result.probes == len(probed)


def test_search_doubles_past_a_sweep_without_oom_then_bisects():
    result = gpu_sweep.search_largest_fit(32, None, lambda batch: batch <= 100, limit=1000)
    assert (result.largest_fit, result.first_oom) == (100, 101)


def test_search_stops_at_the_limit_when_everything_fits():
    result = gpu_sweep.search_largest_fit(32, None, lambda batch: True, limit=100)
    assert (result.largest_fit, result.first_oom, result.probes) == (128, None, 2)


def test_search_keeps_its_progress_when_a_probe_fails_otherwise():
    def fits(batch):
        if batch >= 50:
            raise RuntimeError("numel needs to be smaller than int32_t max")
        return True

    result = gpu_sweep.search_largest_fit(8, None, fits, limit=1000)
    assert (result.largest_fit, result.first_oom) == (32, None)
    assert "int32_t" in result.stopped_by


@pytest.mark.parametrize("predicted, fit, first_oom, verdict", [
    (37, 37, 38, "agrees"),
    (40, 32, 64, "agrees"),
    (64, 32, 64, "predictor too optimistic: 64 ran out of memory, it allows 64"),
    (20, 37, 38, "predictor too cautious: 37 fit, it allows 20"),
    (60, 32, None, "consistent so far (no OOM up to 32)"),
    (None, 32, 64, "no prediction"),
])
def test_max_batch_verdict(predicted, fit, first_oom, verdict):
    assert gpu_sweep.max_batch_verdict(predicted, fit, first_oom) == verdict


def test_bf16_falls_back_to_fp16_only_without_bf16_hardware():
    assert gpu_sweep.effective_precision("bf16", True) == ("bf16", "")
    precision, note = gpu_sweep.effective_precision("bf16", False)
    assert precision == "fp16" and "no bf16" in note
    assert gpu_sweep.effective_precision("fp32", False) == ("fp32", "")


def test_slug():
    assert gpu_sweep.slug("NVIDIA GeForce RTX 3090") == "nvidia-geforce-rtx-3090"
    assert gpu_sweep.slug("  ") == "gpu"


def test_prediction_for_an_unknown_gpu_is_none_with_a_note():
    prediction = gpu_sweep.predict_for(None, resolve_dims("tiny"), 64, "bf16")
    assert prediction.step_s(4) is None and prediction.max_batch_size() is None
    assert "--gpu" in prediction.note
    known = gpu_sweep.predict_for("H100-SXM", resolve_dims("llama-150m"), 1024, "bf16")
    assert known.step_s(4) > 0 and known.max_batch_size() > 4 and known.memory_gib(4) > known.memory_gib(1)


# ----------------------------------------------------------------------------- hardware side on the CPU


def test_step_runner_times_real_training_steps_on_the_cpu():
    runner = gpu_sweep.StepRunner(resolve_dims("tiny"), 16, "fp32", torch.device("cpu"))
    before = [param.detach().clone() for param in runner.model.parameters()]
    times_s, peak_gib = runner.timed_steps_s(2, warmup_steps=1, timed_steps=3)
    assert len(times_s) == 3 and all(t > 0 for t in times_s)
    assert peak_gib is None
    assert any(not torch.equal(old, new) for old, new in zip(before, runner.model.parameters()))
    assert all(param.grad is None for param in runner.model.parameters())
    assert runner.fits(3)


def test_preset_sweep_with_oom_faked_at_the_step(monkeypatch):
    real_step = gpu_sweep.StepRunner.step

    def step_that_runs_out_of_memory_above_2(self, batch_size):
        if batch_size > 2:
            raise oom()
        real_step(self, batch_size)

    monkeypatch.setattr(gpu_sweep.StepRunner, "step", step_that_runs_out_of_memory_above_2)
    dims = resolve_dims("tiny")
    prediction = gpu_sweep.predict_for("T4", dims, 16, "fp32")
    sweep = gpu_sweep.run_preset_sweep("tiny", dims, 16, "fp32", [1, 2, 4, 8], prediction, torch.device("cpu"),
                                       warmup_steps=0, timed_steps=2, search_max_batch=True)
    assert [(p.batch_size, p.ran, p.oom) for p in sweep.points] == [(1, True, False), (2, True, False),
                                                                     (4, False, True)]
    assert (sweep.largest_fit, sweep.first_oom, sweep.search_probes) == (2, 3, 1)
    assert sweep.verdict.startswith("predictor too optimistic: 3 ran out of memory")
    data = json.loads(json.dumps(sweep.to_dict()))
    first = data["points"][0]
    assert first["median_step_s"] > 0 and first["predicted_step_s"] == pytest.approx(prediction.step_s(1))
    assert len(first["step_times_s"]) == 2 and first["median_step_s"] == pytest.approx(sum(first["step_times_s"]) / 2)
    assert first["relative_error"] == pytest.approx(
        (first["predicted_step_s"] - first["median_step_s"]) / first["median_step_s"])
    assert data["points"][2]["relative_error"] is None


# ----------------------------------------------------------------------------- DiLoCo run layout


def test_one_gpu_puts_both_nodes_on_it_with_gloo_for_the_outer_sync():
    layouts = gpu_diloco.node_layouts(1)
    assert [(layout.name, layout.gpu_indices, layout.ranks) for layout in layouts] == [
        ("node-a", (0,), 1), ("node-b", (0,), 1)]
    assert gpu_diloco.outer_device(1) == "cpu"
    text = gpu_diloco.describe_layout(layouts, "cuda", "cpu")
    assert "gloo" in text and "NCCL refuses two ranks on one GPU" in text and "2x" in text


def test_several_gpus_are_split_between_the_nodes_with_nccl():
    layouts = gpu_diloco.node_layouts(3)
    assert [(layout.gpu_indices, layout.ranks) for layout in layouts] == [((0, 1), 2), ((2,), 1)]
    assert gpu_diloco.outer_device(3) == "cuda"
    text = gpu_diloco.describe_layout(layouts, "cuda", "cuda")
    assert "over nccl between the node leaders" in text and "in-node DDP over nccl on node-a" in text
    assert [layout.gpu_indices for layout in gpu_diloco.node_layouts(2)] == [(0,), (1,)]


def test_node_env_gives_each_agent_its_own_gpus_only_when_split():
    layout = gpu_diloco.NodeLayout("node-b", (2, 3))
    split = gpu_diloco.node_env(layout, "cuda", {"PATH": "/bin"}, split_gpus=True)
    assert split["CUDA_VISIBLE_DEVICES"] == "2,3" and split["GEODILOCO_DEVICE"] == "cuda"
    assert str(ROOT) in split["PYTHONPATH"].split(":")
    shared = gpu_diloco.node_env(gpu_diloco.NodeLayout("node-a", (0,)), "cuda", {"PATH": "/bin"}, split_gpus=False)
    assert "CUDA_VISIBLE_DEVICES" not in shared


@pytest.mark.parametrize("gpu_count", [1, 3])
def test_the_run_config_is_one_the_runtime_accepts(gpu_count):
    settings = gpu_diloco.RunSettings("llama-150m", 1024, 4, 3, 20, 180.0)
    layouts = gpu_diloco.node_layouts(gpu_count)
    config = parse_config(gpu_diloco.run_config(settings, layouts, "H100-SXM", gpu_diloco.outer_device(gpu_count)),
                          "validate run")
    assert config.comm.outer_device == ("cuda" if gpu_count > 1 else "cpu")
    assert [len(node.gpus) for node in config.nodes] == [layout.ranks for layout in layouts]
    assert config.model.precision == "bf16" and config.checkpoint.every_rounds == 3
    cold = gpu_diloco.cold_step_predictions(gpu_diloco.run_config(settings, layouts, "H100-SXM", "cpu"))
    assert all(value > 0 for value in cold.values())
    fp32 = gpu_diloco.RunSettings("llama-150m", 1024, 4, 3, 20, 180.0, "fp32")
    cold_fp32 = gpu_diloco.cold_step_predictions(gpu_diloco.run_config(fp32, layouts, "H100-SXM", "cpu"))
    assert all(cold_fp32[name] > cold[name] for name in cold)  # fp32 without tensor cores is slower


def write_run_logs(run_dir: Path, checksums: dict[tuple[int, str], float], losses: dict[int, float]) -> None:
    run_dir.mkdir()
    metrics = [{"round": r, "node": n, "loss": losses[r], "compute_s": 0.5, "local_steps": 5, "batch_size": 4,
                "start_checksum": value} for (r, n), value in checksums.items()]
    metrics += [{"round": r, "node": "global", "eval_loss": losses[r] - 0.1} for r in losses]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in metrics))
    plans = [{"round": r, "nodes": [{"name": n, "predicted_step_s": 0.08} for n in ("node-a", "node-b")]}
             for r in losses]
    (run_dir / "plan.jsonl").write_text("".join(json.dumps(plan) + "\n" for plan in plans))


def outcome_for(run_dir: Path, exit_codes=(0, 0)) -> gpu_diloco.RunOutcome:
    agents = [gpu_diloco.AgentResult(name, code) for name, code in zip(gpu_diloco.NODE_NAMES, exit_codes)]
    outcome = gpu_diloco.RunOutcome("", {}, agents, 1.0, False, 1.0, 9.0)
    outcome.summary = gpu_diloco.summarize_run(run_dir)
    return outcome


def test_run_checks_pass_a_healthy_run_and_catch_diverged_nodes(tmp_path):
    settings = gpu_diloco.RunSettings("tiny", 32, 4, 2, 5, 60.0)
    names = list(gpu_diloco.NODE_NAMES)
    agreed = {(r, n): 100.0 + r for r in range(2) for n in names}
    write_run_logs(tmp_path / "good", agreed, {0: 5.0, 1: 4.0})
    good = outcome_for(tmp_path / "good")
    good.checks = gpu_diloco.run_checks(good, settings, names, expect_gpu=True)
    assert good.passed, good.checks
    assert good.summary["rows"][0]["mean_step_s"] == pytest.approx(0.1)
    assert good.summary["rows"][0]["predicted_step_s"] == pytest.approx(0.08)

    diverged = dict(agreed)
    diverged[(1, "node-b")] = 100.5
    write_run_logs(tmp_path / "bad", diverged, {0: 5.0, 1: 5.2})
    bad = outcome_for(tmp_path / "bad", exit_codes=(0, 1))
    bad.checks = gpu_diloco.run_checks(bad, settings, names, expect_gpu=False)
    failed = {item["check"] for item in bad.checks if not item["passed"]}
    assert failed == {"agents exited 0", "nodes start every round from the same parameters", "training loss fell"}
    assert not bad.passed


@pytest.mark.slow
def test_the_diloco_run_end_to_end_on_the_cpu(tmp_path):
    """The same launcher, torchrun agents and checks as on a GPU, with GEODILOCO_DEVICE=cpu."""
    settings = gpu_diloco.RunSettings("tiny", 32, 4, 2, 3, 150.0)
    outcome = gpu_diloco.launch(settings, tmp_path / "run", gpu_count=0, gpu_name="A30", device="cpu")
    assert outcome.passed, (outcome.checks, [agent.log_tail for agent in outcome.agents])
    assert [check["check"] for check in outcome.checks][-1] == "global eval loss finite"
    assert len(outcome.summary["rows"]) == 4
    assert all(row["cold_step_s"] > 0 for row in outcome.summary["rows"])
