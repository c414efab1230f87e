"""Layer micro-benchmarks (one block timed alone, forward + backward) as a truth reported apart.

The rows come from Mu Li's micro_bench.ipynb (experiments/predictor/data/published_layer_steps.yaml): TFLOPS figures
computed with the notebook's own FLOP formula. The expected step times below are worked by hand from that formula
and the printed TFLOPS; the blocks-only cost is checked against counts typed from the block's shape.
"""
import sys
from pathlib import Path

import pytest
import yaml

from geodiloco.predictor.kernels import host_chain_ops, micro_batch_time
from geodiloco.predictor.specs import registry
from geodiloco.predictor.workload import TrainingCode, gpt_elementwise_bytes_per_token

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "predictor"))

import bench_published  # noqa: E402
import fit_efficiency  # noqa: E402

LAYER_DATA = yaml.safe_load(bench_published.LAYER_FILE.read_text(encoding="utf-8"))


def layer_row(workload: str, seq_len: int, batch: int) -> dict:
    return next(row for row in LAYER_DATA["measurements"]
                if (row["workload"], row["seq_len"], row["batch_size"]) == (workload, seq_len, batch))


def test_a_published_tflops_figure_turns_back_into_the_seconds_the_notebook_timed():
    # BERT-large layer, batch 128, seq 128: forward = 24*b*s*h^2 + 4*b*h*s^2 with h = 1024
    # = 24 * 16,384 * 1,048,576 + 4 * 128 * 1,024 * 16,384 = 412,316,860,416 + 8,589,934,592 = 420,906,795,008 FLOPs;
    # the notebook printed 61.768 TFLOPS for 3 x forward, so one call took 3 * 420.9 G / 61.768 T = 20.443 ms.
    row = layer_row("bert-large-layer", 128, 128)
    assert row["value"] == 61.768 and row["unit"] == "layer_tflops_fwd_bwd"
    assert bench_published.measured_step_s(row) == pytest.approx(3 * 420_906_795_008 / 61.768e12, rel=1e-12)
    assert bench_published.measured_step_s(row) == pytest.approx(0.020443, abs=1e-6)
    # GPT-2 medium block, batch 2, seq 1024: 24 * 2,048 * 1,048,576 + 4 * 2 * 1,024 * 1,048,576 = 60,129,542,144
    assert bench_published.measured_step_s(layer_row("gpt2-medium-block", 1024, 2)) == pytest.approx(
        3 * 60_129_542_144 / 29.436e12, rel=1e-12)


def test_the_file_holds_the_notebooks_forward_backward_grid_and_nothing_of_the_fitted_data():
    rows = LAYER_DATA["measurements"]
    grid: dict = {}
    for row in rows:
        grid.setdefault((row["workload"], row["seq_len"]), []).append(row["batch_size"])
    assert grid == {("bert-large-layer", 128): [2, 4, 8, 16, 32, 64, 128],
                    ("bert-large-layer", 512): [2, 4, 8, 16, 32, 64, 128],
                    ("gpt2-medium-block", 512): [2, 4, 8, 16, 32, 64],
                    ("gpt2-medium-block", 1024): [2, 4, 8, 16, 32, 64]}
    assert {row["gpu_canonical"] for row in rows} == {"RTX 3090 Ti"}
    assert all(row["optimizer"] == "none" and "micro_bench.ipynb" in row["source"] for row in rows)
    fitted = yaml.safe_load(bench_published.DATA_FILE.read_text(encoding="utf-8"))
    assert not {row["id"] for row in rows} & {row["id"] for row in fitted["measurements"]}
    assert not any(row["id"].startswith("muli-") for row in fit_efficiency.dev_rows(fitted["measurements"],
                                                                                     fitted["workloads"]))


def test_blocks_timed_alone_skip_the_first_input_gradient_the_final_norm_and_the_head():
    device = registry().by_name["RTX 3090 Ti"]
    dims = bench_published.workload_dims(LAYER_DATA["workloads"]["bert-large-layer"], 128)
    whole = TrainingCode(block="gpt", attention="eager", lm_head_fraction=0.0)
    alone = TrainingCode(block="gpt", attention="eager", lm_head_fraction=0.0, blocks_only=True)
    # the final LayerNorm: read + write, twice, at 2 bytes, forward + 2x backward = 3 * 4 * 2 * 1,024 B per token
    assert (gpt_elementwise_bytes_per_token(dims, "fp16") - gpt_elementwise_bytes_per_token(dims, "fp16",
                                                                                             final_norm=False)
            == 3 * 4 * 2 * 1024)
    head_ops = host_chain_ops(device, dims, "fp16", whole) - host_chain_ops(device, dims, "fp16", alone)
    assert head_ops == whole.host_ops_head == 15.0
    skipped = [micro_batch_time(device, dims, 128, "fp16", 64, code=whole).matmul_compute_s
               - micro_batch_time(device, dims, 128, "fp16", 64, code=alone).matmul_compute_s]
    deeper = dims.__class__(**{**dims.__dict__, "num_layers": 3})
    skipped.append(micro_batch_time(device, deeper, 128, "fp16", 64, code=whole).matmul_compute_s
                   - micro_batch_time(device, deeper, 128, "fp16", 64, code=alone).matmul_compute_s)
    # only the first block's q/k/v input gradient goes: 2 * 8,192 tokens * 3,072 * 1,024 FLOPs whatever the depth,
    # one twelfth of one block's 72 * tokens * h^2 GEMM FLOPs forward + backward
    assert skipped[0] > 0 and skipped[1] == pytest.approx(skipped[0], rel=1e-9)
    one_block_s = micro_batch_time(device, dims, 128, "fp16", 64, code=whole).matmul_compute_s
    assert skipped[0] / one_block_s == pytest.approx((2 * 3 * 1024 * 1024) / (72 * 1024 * 1024), rel=0.05)


def test_the_benchmark_reports_the_layer_rows_apart_from_the_held_out_figure():
    layers = bench_published.layer_results(LAYER_DATA)
    assert len(layers) == 26 and all(result["gpu"] == "RTX 3090 Ti" for result in layers)
    text = bench_published.markdown(layers[:0] + [dict(layers[0], held_out=True)], [], [], 1, (0.1, 0.2), (), layers)
    section = text.split("## Layer micro-benchmarks (one block, forward + backward)", 1)[1]
    assert "26 rows of experiments/predictor/data/published_layer_steps.yaml" in section
    assert "Not part of the held-out figure." in section
    assert section.count("| muli-") == 26
    assert "**Held-out (1 rows" in text


def test_a_grid_maximum_is_the_best_predicted_point_and_its_error_reads_like_a_step_times(monkeypatch):
    times_s = {(128, 2): 1.0e-3, (128, 4): 1.5e-3}
    monkeypatch.setattr(bench_published, "predicted_step_s",
                        lambda row, workloads: times_s[(row["seq_len"], row["batch_size"])])
    row = {"id": "t", "gpu": "RTX 4090", "workload": "bert-large-layer", "precision": "fp16", "value": 13.15,
           "flops_hidden_size": 1024, "grid": {"seq_lens": [128], "batch_sizes": [2, 4]}, "source": "test"}
    result = bench_published.grid_maximum(row, LAYER_DATA["workloads"])
    # batch 4: forward = 24 * 512 * 1,048,576 + 4 * 4 * 1,024 * 16,384 = 13,153,337,344 FLOPs; 3 x that in 1.5 ms
    assert result["predicted_best_at"] == {"seq_len": 128, "batch_size": 4}
    assert result["predicted_tflops"] == pytest.approx(3 * 13_153_337_344 / 1.5e-3 / 1e12, rel=1e-12)
    assert result["error"] == pytest.approx(13.15 / 26.306674688 - 1.0, rel=1e-9)  # half the predicted rate: -50 %


def test_the_summary_maxima_are_the_grids_best_points_and_cover_four_more_gpus():
    rows = LAYER_DATA["measurements"]
    # the README's RTX 3090 Ti column (62 and 39) is the grid's best forward + backward point, rounded
    assert round(max(row["value"] for row in rows if row["workload"] == "bert-large-layer")) == 62
    assert round(max(row["value"] for row in rows if row["workload"] == "gpt2-medium-block")) == 39
    maxima = LAYER_DATA["grid_maxima"]
    assert sorted((row["gpu_canonical"], row["workload"], row["value"]) for row in maxima) == sorted([
        ("A100-SXM4-80GB", "bert-large-layer", 136), ("RTX A6000", "bert-large-layer", 70),
        ("V100 32GB", "bert-large-layer", 64), ("RTX 4090", "bert-large-layer", 109),
        ("A100-SXM4-80GB", "gpt2-medium-block", 53), ("RTX A6000", "gpt2-medium-block", 38),
        ("V100 32GB", "gpt2-medium-block", 36), ("RTX 4090", "gpt2-medium-block", 54)])
    results = bench_published.grid_maxima_results(LAYER_DATA)
    assert len(results) == 8 and all(result["predicted_tflops"] > 0 for result in results)
    text = bench_published.grid_maxima_lines(results)
    assert text[1] == "## Layer micro-benchmarks: the best of the grid on other GPUs" and len(text) == 7 + 8
