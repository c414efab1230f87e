"""GPU efficiency constants: the shipped file loads, bad files are refused by field, the fit sees
only the dev third, and each fitted class moves only its own kernels."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import yaml

from geodiloco.predictor import kernels
from geodiloco.predictor.kernels import FITTED_FIELDS, gpu_efficiency, load_gpu_efficiency, micro_batch_time
from geodiloco.predictor.specs import lookup_gpu
from geodiloco.predictor.workload import RUNTIME_CODE, ModelDims, TrainingCode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "predictor"))

import bench_published  # noqa: E402
import fit_efficiency  # noqa: E402

BERT_LIKE = ModelDims(hidden_size=1024, intermediate_size=2731, num_layers=24, num_heads=16, vocab_size=30522,
                      max_seq_len=384, tie_embeddings=True)
EAGER_GPT = TrainingCode(block="gpt", attention="eager", lm_head_fraction=0.0)


def test_shipped_constants_are_fractions_and_say_how_they_were_fitted():
    document = yaml.safe_load(kernels.EFFICIENCY_FILE.read_text())
    eff = load_gpu_efficiency()
    for name in FITTED_FIELDS:
        if name not in kernels.NOT_FRACTIONS:
            assert 0.05 <= getattr(eff, name) <= 1.0
    # a per-SM softmax rate that is a bound somewhere: below an A100's bus share, above a trickle
    a100 = lookup_gpu("A100-SXM4-80GB")
    assert 1.0 < eff.vocab_softmax_gbps_per_sm < a100.memory_bandwidth_gbps / a100.sm_count
    assert document["fit"]["fields"] == list(FITTED_FIELDS)
    assert "dev third" in document["fit"]["on"]
    assert document["fit"]["rows"] > 50


@pytest.mark.parametrize("field, value, message", [
    ("matmul", 1.4, "efficiency.matmul must be in (0, 1], got 1.4"),
    ("elementwise", 0.0, "efficiency.elementwise must be in (0, 1], got 0.0"),
    ("optimizer", None, "efficiency lacks optimizer"),
    ("vocab_softmax_gbps_per_sm", -2.0, "efficiency.vocab_softmax_gbps_per_sm must be > 0 GB/s or null, got -2.0"),
    ("vocab_softmax_bandwidth", 1.3, "efficiency.vocab_softmax_bandwidth must be in (0, 1] or null, got 1.3"),
])
def test_a_bad_constants_file_names_the_field(tmp_path, field, value, message):
    document = yaml.safe_load(kernels.EFFICIENCY_FILE.read_text())
    if value is None:
        del document["efficiency"][field]
    else:
        document["efficiency"][field] = value
    path = tmp_path / "eff.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_gpu_efficiency(path)


def test_the_fit_sees_no_held_out_row():
    data = yaml.safe_load(bench_published.DATA_FILE.read_text())
    rows = fit_efficiency.dev_rows(data["measurements"], data["workloads"])
    assert rows and not any(bench_published.held_out(row["id"]) for row in rows)
    # about a third of the placeable rows: the split is by a hash of the id, not by hand
    assert 0.25 < len(rows) / len(data["measurements"]) < 0.42
    # the shipped share applies to the architectures the dev rows have half-rate mixed precision on, no others
    assert fit_efficiency.half_rate_architectures(rows) == kernels.GPU_EFFICIENCY.half_rate_fp16_architectures
    assert "blackwell" not in kernels.GPU_EFFICIENCY.half_rate_fp16_architectures


@pytest.mark.parametrize("field, moved", [
    ("elementwise", "elementwise_s"),
    ("score_matmul", "attention_s"),
])
def test_each_fitted_class_scales_only_its_kernels(field, moved):
    """Halving one efficiency doubles that kernel class's time (it is bandwidth- or rate-bound
    throughout) and leaves the GEMMs alone."""
    a100 = lookup_gpu("A100-SXM4-80GB")
    base = kernels.GPU_EFFICIENCY
    before = micro_batch_time(a100, BERT_LIKE, 384, "fp16", 8, code=EAGER_GPT)
    with gpu_efficiency(dataclasses.replace(base, **{field: getattr(base, field) / 2})):
        after = micro_batch_time(a100, BERT_LIKE, 384, "fp16", 8, code=EAGER_GPT)
    assert after.matmul_compute_s == before.matmul_compute_s
    if field == "elementwise":
        assert after.elementwise_s == pytest.approx(2 * before.elementwise_s)
    else:
        assert before.attention_s < after.attention_s < 2 * before.attention_s  # score traffic is elementwise
    assert kernels.efficiency_for(a100) is base  # the trial constants are gone after the block


LM_CODE = TrainingCode(block="gpt", attention="eager", lm_head_fraction=1.0)


def _loss_split(device, per_sm_gbps, code, bus_share=None):
    """elementwise_s with the per-SM softmax bound at ``per_sm_gbps`` (None: no bound) and the loss's own
    share of the bus at ``bus_share`` (None: the elementwise share)."""
    eff = dataclasses.replace(kernels.GPU_EFFICIENCY, vocab_softmax_gbps_per_sm=per_sm_gbps,
                              vocab_softmax_bandwidth=bus_share)
    with gpu_efficiency(eff):
        return micro_batch_time(device, BERT_LIKE, 384, "fp16", 4, code=code).elementwise_s


def test_the_vocabulary_softmax_runs_at_the_per_sm_bound_where_it_is_below_the_bus():
    """A100 (108 SMs): at 2 GB/s per SM the loss streams at 216 GB/s, far under the bus share, so its
    bytes (tokens x 3 passes x vocab x (2 + 4 + 8) B in fp16) take that much longer; without an LM head
    (SQuAD) nothing changes."""
    a100 = lookup_gpu("A100-SXM4-80GB")
    unbound = _loss_split(a100, None, LM_CODE)
    bound = _loss_split(a100, 2.0, LM_CODE)
    loss_bytes = 4 * 384 * 3 * 30522 * (2 + 4 + 8)
    bus_bytes_per_s = a100.memory_bandwidth_gbps * 1e9 * kernels.GPU_EFFICIENCY.elementwise
    expected_extra_s = loss_bytes / (108 * 2.0e9) - loss_bytes / bus_bytes_per_s
    assert bound - unbound == pytest.approx(expected_extra_s, rel=1e-9)
    assert _loss_split(a100, 2.0, EAGER_GPT) == _loss_split(a100, None, EAGER_GPT)


def test_the_per_sm_bound_leaves_a_gpu_alone_whose_bus_is_slower():
    """RTX A4000: 48 SMs x 20 GB/s = 960 GB/s, above its 448 GB/s bus, so the bus still sets the rate."""
    a4000 = lookup_gpu("RTX A4000")
    assert a4000.sm_count * 20.0 > a4000.memory_bandwidth_gbps
    assert _loss_split(a4000, 20.0, LM_CODE) == _loss_split(a4000, None, LM_CODE)


def test_the_vocabulary_softmax_streams_at_its_own_share_of_the_bus():
    """RTX A4000 (448 GB/s), no per-SM bound: at a 0.9 share the loss's bytes take loss / (448e9 x 0.9)
    instead of loss / (448e9 x the elementwise share); the other elementwise kernels keep their time."""
    a4000 = lookup_gpu("RTX A4000")
    elementwise_share = kernels.GPU_EFFICIENCY.elementwise
    loss_bytes = 4 * 384 * 3 * 30522 * (2 + 4 + 8)
    expected_change_s = loss_bytes / (448e9 * 0.9) - loss_bytes / (448e9 * elementwise_share)
    own_share = _loss_split(a4000, None, LM_CODE, bus_share=0.9)
    assert own_share - _loss_split(a4000, None, LM_CODE) == pytest.approx(expected_change_s, rel=1e-9)
    # the per-SM bound still caps it where it is lower: 48 SMs x 2 GB/s = 96 GB/s
    assert _loss_split(a4000, 2.0, LM_CODE, bus_share=0.9) == pytest.approx(
        own_share - loss_bytes / (448e9 * 0.9) + loss_bytes / 96e9, rel=1e-9)
    # no LM head (SQuAD), no loss traffic: the share changes nothing
    assert _loss_split(a4000, None, EAGER_GPT, bus_share=0.9) == _loss_split(a4000, None, EAGER_GPT)


def test_the_runtimes_code_streams_the_loss_at_its_bus_share_without_the_per_sm_bound():
    """A100, 2 GB/s per SM (216 GB/s, under the bus share): the published steps' code (the default
    TrainingCode) is held to it, the same model with ``vocab_softmax_per_sm_bound=False`` (as
    RUNTIME_CODE runs it) streams the loss at its 0.8 share of the 2,039 GB/s bus."""
    a100 = lookup_gpu("A100-SXM4-80GB")
    unbound_code = dataclasses.replace(LM_CODE, vocab_softmax_per_sm_bound=False)
    loss_bytes = 4 * 384 * 3 * 30522 * (2 + 4 + 8)
    bound = _loss_split(a100, 2.0, LM_CODE, bus_share=0.8)
    runtime_like = _loss_split(a100, 2.0, unbound_code, bus_share=0.8)
    assert bound - runtime_like == pytest.approx(loss_bytes / (108 * 2.0e9) - loss_bytes / (2039e9 * 0.8), rel=1e-9)
    assert runtime_like == _loss_split(a100, None, LM_CODE, bus_share=0.8)
    assert RUNTIME_CODE.vocab_softmax_per_sm_bound is False and TrainingCode().vocab_softmax_per_sm_bound is True


def test_model_selection_folds_split_the_dev_third_apart_from_the_held_out_split():
    import select_model

    data = yaml.safe_load(bench_published.DATA_FILE.read_text())
    rows = fit_efficiency.dev_rows(data["measurements"], data["workloads"])
    sizes = [sum(1 for row in rows if select_model.fold_of(row["id"]) == fold) for fold in range(select_model.FOLDS)]
    assert sum(sizes) == len(rows) and min(sizes) >= len(rows) // select_model.FOLDS // 2
    # the folds are not the dev / held-out hash again (every dev row has sha256(id) % 3 == 0)
    assert len({select_model.fold_of(row["id"]) for row in rows}) == select_model.FOLDS


@pytest.mark.parametrize("term", ["vocab_softmax_gbps_per_sm", "vocab_softmax_bandwidth"])
def test_a_candidate_without_an_optional_term_neither_fits_nor_applies_it(term):
    import select_model

    by_name = {candidate.name: candidate for candidate in select_model.candidates()}
    shipped, without = by_name["shipped"], by_name[f"without {term}"]
    assert term in shipped.fields and term not in without.fields
    start = select_model.start_for(without, [])
    assert getattr(start, term) is None
    assert start.matmul == fit_efficiency.HAND_SET["matmul"]


def test_the_candidate_without_lambdas_run_warm_up_predicts_the_steady_step_and_restores_it():
    import select_model

    data = yaml.safe_load(bench_published.DATA_FILE.read_text(encoding="utf-8"))
    row = next(row for row in data["measurements"] if row["id"].startswith("lambda-") and "squad" in row["workload"])
    without = {candidate.name: candidate for candidate in select_model.candidates()}["without Lambda's run warm-up"]
    steady_s = bench_published.row_model(row, data["workloads"]).predict(row["batch_size"])
    with select_model.run_warmup(without.warmup_per_run_s):
        assert bench_published.predicted_step_s(row, data["workloads"]) == pytest.approx(steady_s)
    assert bench_published.predicted_step_s(row, data["workloads"]) == pytest.approx(steady_s + 0.010)


def test_transformer_xl_base_and_opt_run_no_attention_dropout_and_the_candidate_puts_it_back():
    """Lambda's and DLE's Transformer-XL base set dropatt 0.0 and NeuSight's OPT attention_dropout 0.0; the large
    Transformer-XL keeps its 0.2 dropout; the candidate that ignores the field predicts every row with one."""
    import select_model

    data = yaml.safe_load(bench_published.DATA_FILE.read_text(encoding="utf-8"))
    workloads = data["workloads"]

    def first(workload: str) -> dict:
        return next(row for row in data["measurements"] if row["workload"] == workload)

    without_dropout = ("transformer-xl-base-lambda", "transformer-xl-base-dle", "opt-1.3b")
    assert [bench_published.row_code(first(name), workloads).attention_dropout for name in without_dropout] == [
        False, False, False]
    assert bench_published.row_code(first("transformer-xl-large-lambda"), workloads).attention_dropout is True
    row = first("transformer-xl-base-lambda")
    shipped_s = bench_published.predicted_step_s(row, workloads)
    candidate = {candidate.name: candidate for candidate in select_model.candidates()}[
        "with an attention dropout where the source's is 0"]
    with select_model.zero_attention_dropout(candidate.zero_attention_dropout_counted):
        assert bench_published.row_code(row, workloads).attention_dropout is True
        assert bench_published.predicted_step_s(row, workloads) > shipped_s
    assert bench_published.predicted_step_s(row, workloads) == pytest.approx(shipped_s)


def test_each_split_deals_the_dev_third_into_other_folds():
    import select_model

    ids = [f"row-{index}" for index in range(200)]
    first, second = ([select_model.fold_of(row_id, split) for row_id in ids] for split in ("", "1"))
    assert first == [select_model.fold_of(row_id) for row_id in ids]
    assert sum(a == b for a, b in zip(first, second)) < len(ids) / 2  # about a fifth agree by chance


def measured(row_id: str, gpu: str, batch_size: int, measured_s: float, precision: str = "fp16") -> dict:
    return {"id": row_id, "gpu": gpu, "workload": "bert-large-squad", "precision": precision, "seq_len": 384,
            "batch_size": batch_size, "measured_s": measured_s}


def test_repeat_disagreement_pairs_one_measurement_across_sources_only():
    rows = [measured("lambda-v0-a", "A100-SXM4-80GB", 32, 0.50),
            measured("lambda-v1-a", "A100-SXM4-80GB", 32, 0.60),      # the same run re-published: 20 % apart
            measured("lambda-v1-b", "A100-SXM4-80GB", 32, 0.40),      # same generation as the row above: not a pair
            measured("dle-pt-a", "A100-SXM4-80GB", 64, 1.00),          # another batch size: not a pair
            measured("lambda-v0-c", "RTX 3090", 8, 0.30),
            measured("lambda-v1-c", "RTX 3090", 8, 0.20),              # faster in the newer one: 50 % apart
            measured("lambda-v1-d", "RTX 3090", 8, 0.30, "tf32")]      # another precision: not a pair
    pairs, median, worst = bench_published.repeat_disagreement(rows)
    # pairs: v0-a/v1-a (0.60/0.50), v0-a/v1-b (0.50/0.40), v0-c/v1-c (0.30/0.20)
    assert pairs == 3
    assert median == pytest.approx(0.25)
    assert worst == pytest.approx(0.5)
    assert bench_published.repeat_disagreement(rows[:1])[0] == 0


def with_errors(gpu: str, errors: list[float]) -> list[dict]:
    return [{"gpu": gpu, "error": error} for error in errors]


def test_the_median_interval_resamples_whole_gpus():
    steady = with_errors("A10", [0.10, -0.10, 0.10]) + with_errors("L4", [-0.10, 0.10])
    assert bench_published.median_interval(steady, draws=200) == pytest.approx((0.10, 0.10))
    # two GPUs: a draw of two GPUs holds A twice (median 0.02) a quarter of the time, else B's nine
    # rows decide (0.30). Resampling the ten rows one by one instead would almost never draw A's one
    # row six times, and both ends would be 0.30.
    lopsided = with_errors("A", [0.02]) + with_errors("B", [0.30, -0.30] * 4 + [0.30])
    low, high = bench_published.median_interval(lopsided, draws=2000)
    assert low == pytest.approx(0.02) and high == pytest.approx(0.30)


def test_a_figure_timed_over_a_whole_run_carries_the_runs_warm_up_spread_over_its_steps():
    """Lambda's SQuAD figures are rates over all 100 steps of a run, its first iterations included: each published
    step carries 1.0 s / 100 of one-time costs. Figures that exclude warm-up, or that do not say over how many
    steps they were timed, carry none."""
    data = yaml.safe_load(bench_published.DATA_FILE.read_text(encoding="utf-8"))
    rows, workloads = data["measurements"], data["workloads"]
    lambda_squad = [row for row in rows if row["id"].startswith("lambda-") and "squad" in row["workload"]]
    assert lambda_squad and all(bench_published.warmup_share_s(row) == pytest.approx(0.010) for row in lambda_squad)
    others = [row for row in rows if row not in lambda_squad]
    assert any("no warm-up exclusion" in row["measures"] for row in others)  # DLE's SQuAD: no step count given
    assert {bench_published.warmup_share_s(row) for row in others} == {0.0}
    row = lambda_squad[0]
    steady_s = bench_published.row_model(row, workloads).predict(row["batch_size"])
    assert bench_published.predicted_step_s(row, workloads) == pytest.approx(steady_s + 0.010)


def test_cuda_core_sgemms_quantize_in_128_by_64_tiles_and_tensor_core_gemms_in_square_ones():
    """On a V100 (80 SMs) a 1,024 x 4,096 FP32 output runs 512 tiles of 128 x 64 in 7 waves (512 / 560 = 0.914) where
    128-wide square tiles run 256 in 4 (0.8); TF32 on an A100 keeps the square tile."""
    from geodiloco.predictor.kernels import GPU_EFFICIENCY, gemm_wave_efficiency
    from geodiloco.predictor.specs import resolve_gpu
    v100, _ = resolve_gpu("V100-SXM2-32GB")
    a100, _ = resolve_gpu("A100-SXM4-80GB")
    assert gemm_wave_efficiency(1024, 4096, v100, v100.fp32_tflops, GPU_EFFICIENCY) == pytest.approx(512 / 560)
    assert gemm_wave_efficiency(4096, 1024, v100, v100.fp32_tflops, GPU_EFFICIENCY) == pytest.approx(512 / 560)
    assert gemm_wave_efficiency(1024, 3072, v100, v100.fp32_tflops, GPU_EFFICIENCY) == pytest.approx(384 / 400)
    assert gemm_wave_efficiency(1024, 4096, v100, v100.fp16_fp32acc_tflops, GPU_EFFICIENCY) == pytest.approx(0.8)
    assert gemm_wave_efficiency(1024, 4096, a100, a100.tf32_tflops, GPU_EFFICIENCY) == pytest.approx(256 / 324)


def test_under_cuda_10_an_fp16_gemm_off_the_multiple_of_8_runs_on_the_cuda_cores():
    """cuBLAS before 11.0 runs an FP16 GEMM on tensor cores only when every dimension is a multiple of 8 (NVIDIA's
    Matrix Multiplication Background guide): a projection onto 267,735 words falls to a V100's 15.7 FP32 TFLOPS
    instead of its 125 tensor TFLOPS; 267,736 words, BF16, an AMD part or current CUDA (alignment 1) keep the rate."""
    from geodiloco.common.schema import ConfigError
    from geodiloco.predictor.kernels import GPU_EFFICIENCY, shape_rate_tflops
    from geodiloco.predictor.specs import resolve_gpu
    v100, _ = resolve_gpu("V100-SXM2-32GB")
    a100, _ = resolve_gpu("A100-SXM4-80GB")
    mi250, _ = resolve_gpu("MI250 GCD")
    cuda_10 = TrainingCode(block="gpt", attention="eager", tensor_core_alignment=8)
    assert shape_rate_tflops(v100, "fp16", 125.0, cuda_10, 13824, 267735, 512) == 15.7
    assert shape_rate_tflops(v100, "fp16", 125.0, cuda_10, 13824, 267736, 512) == 125.0
    assert shape_rate_tflops(v100, "fp16", 125.0, TrainingCode(), 13824, 267735, 512) == 125.0
    assert shape_rate_tflops(a100, "bf16", 312.0, cuda_10, 13824, 267735, 512) == 312.0
    assert shape_rate_tflops(mi250, "fp16", 181.0, cuda_10, 13824, 267735, 512) == 181.0
    with pytest.raises(ConfigError, match="tensor_core_alignment must be >= 1"):
        TrainingCode(tensor_core_alignment=0)

    def head_dims(vocab_size: int) -> ModelDims:
        return ModelDims(hidden_size=512, intermediate_size=1365, num_layers=16, num_heads=8, vocab_size=vocab_size,
                         max_seq_len=192, tie_embeddings=True)

    def matmul_s(vocab_size: int, code: TrainingCode) -> float:
        return micro_batch_time(v100, head_dims(vocab_size), 192, "fp16", 72, code=code).matmul_compute_s

    current = TrainingCode(block="gpt", attention="eager")
    assert matmul_s(267736, cuda_10) == pytest.approx(matmul_s(267736, current))
    head_flops = 3 * 2.0 * 72 * 192 * 512 * 267735  # forward, input- and weight-gradient GEMMs
    slower_s = head_flops / GPU_EFFICIENCY.matmul * (1 / 15.7e12 - 1 / 125e12)
    assert matmul_s(267735, cuda_10) - matmul_s(267735, current) == pytest.approx(slower_s, rel=0.03)


def test_lambdas_cuda_10_rows_carry_their_cuda_release_and_it_explains_their_transformer_xl_fp16_steps():
    """Lambda's 'version 0' rows ran NGC pytorch:20.01-py3 (CUDA 10.2); no other row predates CUDA 11. Its Quadro RTX
    8000 Transformer-XL base FP16 step (1,488 ms, full softmax over 267,735 words) is predicted at about half that
    time without the alignment rule, and within 15 % of it with the rule."""
    import select_model

    data = yaml.safe_load(bench_published.DATA_FILE.read_text(encoding="utf-8"))
    rows = data["measurements"]
    on_cuda_10 = [row for row in rows if row.get("cuda")]
    assert {row["cuda"] for row in on_cuda_10} == {"10.2"}
    assert on_cuda_10 == [row for row in rows if row["software"].startswith("NGC pytorch:20.01-py3")]
    assert [bench_published.row_tensor_core_alignment(row) for row in ({"cuda": "10.2"}, {"cuda": "11.0"}, {})] == [
        8, 1, 1]
    row = next(row for row in rows if row["id"] == "lambda-v0-transformerxlbase-quadro-rtx-8000-fp16-s192-b72")
    measured_s = bench_published.measured_step_s(row)
    assert measured_s == pytest.approx(72 * 192 / 9290.0, rel=0.01)  # Lambda's 9,290 tok/s at batch 72
    assert bench_published.predicted_step_s(row, data["workloads"]) == pytest.approx(measured_s, rel=0.15)
    without = {candidate.name: candidate for candidate in select_model.candidates()}[
        "without CUDA 10's tensor-core alignment"]
    with select_model.cuda_10_alignment(without.cuda_10_alignment_counted):
        assert bench_published.predicted_step_s(row, data["workloads"]) < 0.6 * measured_s
    assert bench_published.row_code(row, data["workloads"]).tensor_core_alignment == 8


def test_an_adaptive_input_embedding_counts_its_own_parameters_in_the_optimizer():
    """DLE's Transformer-XL large (div_val 4) embeds its four word clusters (19997, 20000, 160000, 67738 words) in
    1024, 256, 64 and 16 columns with a projection each up to 1024: 38,313,376 parameters, not 267,735 x 1024. The
    optimizer's cost follows the parameter count; the LM head keeps the full vocabulary."""
    from geodiloco.common.schema import ConfigError
    from geodiloco.predictor.workload import dims_from_mapping, parameter_count
    clusters = [(19997, 1024), (20000, 256), (160000, 64), (67738, 16)]
    adaptive = sum(words * width + 1024 * width for words, width in clusters)
    assert adaptive == 38313376
    data = yaml.safe_load(bench_published.DATA_FILE.read_text(encoding="utf-8"))
    large = data["workloads"]["transformer-xl-large-dle"]
    assert large["embedding_parameters"] == adaptive
    dims = bench_published.workload_dims(large, 384)
    full = dataclasses.replace(dims, embedding_parameters=None)
    assert parameter_count(full) - parameter_count(dims) == 267735 * 1024 - adaptive
    a100 = lookup_gpu("A100-SXM4-40GB")
    assert kernels.optimizer_time(a100, dims, "fp16", 1)[0] < 0.6 * kernels.optimizer_time(a100, full, "fp16", 1)[0]
    code = bench_published.row_code({"workload": "transformer-xl-large-dle"}, data["workloads"])
    assert micro_batch_time(a100, dims, 384, "fp16", 8, code=code) == micro_batch_time(a100, full, 384, "fp16", 8,
                                                                                       code=code)
    assert dims_from_mapping({"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4,
                              "vocab_size": 100, "embedding_parameters": 1000}).embedding_parameters == 1000
    with pytest.raises(ConfigError, match="embedding_parameters must be a positive integer"):
        dims_from_mapping({"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4,
                           "vocab_size": 100, "embedding_parameters": -5})


def test_a_software_factor_learned_on_other_gpus_scales_a_row_and_the_sentence_says_whether_it_carries():
    """Dev rows of one workload and source generation, both measured 20 % slower than predicted on other GPUs:
    their factor 1.2 fixes a held-out row that is off the same way; a row on one of those GPUs takes the other GPU's
    factor only, and a row of another source generation is left unscaled."""
    def result(row_id: str, gpu: str, measured_s: float, predicted_s: float) -> dict:
        return {"id": row_id, "gpu": gpu, "workload": "bert-large-squad", "measured_s": measured_s,
                "predicted_s": predicted_s}
    dev = [result("lambda-v0-a", "A10", 1.2, 1.0), result("lambda-v0-b", "A40", 2.4, 2.0)]
    carried = [result("lambda-v0-c", "L4", 3.6, 3.0)]
    assert bench_published.cross_gpu_factor_median(carried, dev) == pytest.approx(0.0)
    own_gpu = [result("lambda-v0-d", "A10", 3.6, 3.0)]
    assert bench_published.cross_gpu_factor_median(own_gpu, dev) == pytest.approx(0.0)  # the A40's factor only
    other_source = [result("dle-pt-e", "L4", 3.6, 3.0)]
    assert bench_published.cross_gpu_factor_median(other_source, dev) == pytest.approx(1 / 6)  # unscaled: 3.0/3.6
    assert bench_published.software_factor_line(carried, dev, 1 / 6).startswith(
        "A shared software factor carries across GPUs: ")
    assert bench_published.software_factor_line(other_source, dev, 0.17).startswith(
        "A shared software factor carries little across GPUs: ")
    assert "of 16.7% (the model alone: 17.0%)" in bench_published.software_factor_line(other_source, dev, 0.17)


def test_lambdas_truncated_figures_are_read_as_the_mean_of_their_run_logs():
    """Lambda's compile scripts write each cell as int(round(mean, 2)): its A40 BERT-base SQuAD fp32 run logs
    62.71258 sequences/s and the CSV says 62. Every Lambda row, and no other, is marked truncated to whole units and
    carries the mean of its logs, which truncates to its figure; the benchmark reads that mean, a truncated row
    without logs the middle of its unit, and the candidate without the correction the figure as published."""
    import select_model

    rows = [row for path in (bench_published.DATA_FILE, bench_published.OUTSIDE_SCOPE_FILE)
            for row in yaml.safe_load(path.read_text(encoding="utf-8"))["measurements"]]
    assert {row["id"].split("-")[0]: row.get("value_truncated_to") for row in rows} == {
        "lambda": 1, "dle": None, "neusight": None}
    lambda_rows = [row for row in rows if row["id"].startswith("lambda")]
    assert len(lambda_rows) == 288 and all(row.get("value_truncated_to") == 1 for row in lambda_rows)
    assert all(row["log_files"] >= 1 and int(round(row["value_from_logs"], 2)) == row["value"] for row in lambda_rows)
    assert not any("value_from_logs" in row for row in rows if not row["id"].startswith("lambda"))
    row = next(row for row in rows if row["id"] == "lambda-v0-bertbasesquad-rtx-a40-fp32-s384-b56")
    assert row["value"] == 62.0 and row["log_files"] == 1
    assert bench_published.measured_step_s(row) == pytest.approx(56 / 62.71258, rel=1e-5)
    assert "PyTorch 1.9.0a0" in row["software"]
    without = {candidate.name: candidate for candidate in select_model.candidates()}[
        "with Lambda's truncated figures read as published"]
    with select_model.truncated_values(without.truncated_values_counted):
        assert bench_published.measured_step_s(row) == pytest.approx(56 / 62.0)
    tokens_row = {"value": 9290.0, "value_truncated_to": 1, "unit": "tokens_per_s", "batch_size": 72, "seq_len": 192}
    assert bench_published.measured_step_s(tokens_row) == pytest.approx(72 * 192 / 9290.5)
